#!/usr/bin/env python3
"""A long-lived task body that speaks the runner protocol itself (docs/runner-protocol.md).

One process serves every attempt, so whatever it loads once (a model, a connection pool)
stays warm. It replaces perago-runner: run it as the body container's command, or as
`perago-sidecar local --runner long_lived_body.py -- ...` outside Kubernetes.

The task it serves: params {"n": <int>, "crash": <bool>} -> result {"total": n * 2, "pid": <its pid>}.
"crash": true makes the process exit in the middle of the attempt, as a crashing body would.
Standard library only.
"""

import json
import os
import signal
import socket
import sys
import threading
import time

PROTOCOL = 1


def socket_path(argv):
    if "--socket" in argv:
        return argv[argv.index("--socket") + 1]
    if os.environ.get("PERAGO_SOCKET"):
        return os.environ["PERAGO_SOCKET"]
    # The runner's rule: <volume>/bin/<this file> -> <volume>/perago.sock.
    here = os.path.dirname(os.path.abspath(argv[0]))
    return os.path.join(os.path.dirname(here), "perago.sock")


def connect(path):
    """The sidecar may not listen yet: try for a minute."""
    deadline = time.monotonic() + 60
    while True:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(path)
            return conn
        except OSError:
            conn.close()
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


class Connection:
    def __init__(self, conn):
        self.conn = conn
        self.lines = conn.makefile("r", encoding="utf-8")
        self.lock = threading.Lock()

    def send(self, message):
        data = (json.dumps(message, separators=(",", ":")) + "\n").encode()
        with self.lock:
            self.conn.sendall(data)

    def receive(self):
        line = self.lines.readline()
        return json.loads(line) if line else None


def run(env):
    """One attempt: everything it produces goes through the files named in env."""
    with open(env["PERAGO_PARAMS"], encoding="utf-8") as f:
        params = json.load(f)
    if params.get("crash"):
        os._exit(3)
    result = {"total": params.get("n", 0) * 2, "pid": os.getpid()}
    with open(env["PERAGO_RESULT"], "w", encoding="utf-8") as f:
        json.dump(result, f)


def serve(connection, execution_id, env):
    try:
        run(env)
        exited = {"type": "exited", "executionId": execution_id, "code": 0}
    except Exception as error:  # the attempt fails; the process keeps serving
        with open(env["PERAGO_ERROR"], "w", encoding="utf-8") as f:
            json.dump({"reason": f"{type(error).__name__}: {error}"}, f)
        exited = {"type": "exited", "executionId": execution_id, "code": 1}
    connection.send(exited)


def main():
    connection = Connection(connect(socket_path(sys.argv)))
    # SIGTERM: say so, keep serving what is assigned, exit when the sidecar closes the connection.
    signal.signal(signal.SIGTERM, lambda *_: connection.send({"type": "draining"}))
    connection.send({"type": "hello", "protocol": PROTOCOL, "pid": os.getpid()})
    welcome = connection.receive()
    if not welcome or welcome.get("type") != "welcome":
        sys.exit(f"the sidecar did not welcome this body: {welcome}")
    while True:
        message = connection.receive()
        if message is None:
            return
        if message["type"] == "assign":
            threading.Thread(
                target=serve,
                args=(connection, message["executionId"], message["env"]),
                daemon=True,
            ).start()
        # "cancel": the attempts here are short; each still answers "exited".


if __name__ == "__main__":
    main()
