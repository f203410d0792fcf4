"""The task body: one attempt of an unchanged Python Perago task function.

It follows the runner protocol (docs/runner-protocol.md): params from `$PERAGO_PARAMS`, the
workspace at `$PERAGO_WORKSPACE`, the result to `$PERAGO_RESULT`, a failure to
`$PERAGO_ERROR`, application metrics appended to `$PERAGO_METRICS`. Under a persistent body
(protocol 2) one process serves attempt after attempt: the module is imported once, and each
attempt's variables come over the socket on standard input. The sidecar has already
checked the params against the task's JSON schema and the pre guardrails; what Python Perago
does inside its worker is done here the same way: the params are validated by the task's own
model (extra fields refused for strict tasks, dropped otherwise), and the returned value is
validated by the result model with extra fields refused. `TaskTerminalError` fails the
workflow; every other exception is a retryable failure, reported as Python Perago words it.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import socket
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from perago import MetricRecorder, TaskDefinition, TaskExecutionError, TaskTerminalError


# Set by perago-runner for a persistent body (spec.executor.body.mode: persistent).
PROTOCOL_ENV = "PERAGO_BODY_PROTOCOL"


class BodyError(Exception):
    """The body cannot run the task at all (a wrong target or a missing variable)."""


def load(target: str) -> TaskDefinition:
    """`MODULE:FUNCTION` → the task definition the decorator attached to the function."""
    module_name, _, function_name = target.partition(":")
    if not module_name or not function_name:
        raise BodyError(f"the target must be MODULE:FUNCTION, not {target!r}")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - the module's own import error, named
        raise BodyError(f"importing {module_name} failed: {type(exc).__name__}: {exc}") from exc
    function = getattr(module, function_name, None)
    definition = getattr(function, "__perago_task__", None)
    if not isinstance(definition, TaskDefinition):
        raise BodyError(f"{target} is not a function decorated with perago.task")
    return definition


def invoke(definition: TaskDefinition, params: Any, workspace: Path | None, metrics_path: Path | None) -> dict[str, Any]:
    """Validate the params, call the function, validate what it returned: the result document."""
    extra = "forbid" if definition.strict_params else "ignore"
    model = definition.params_model.model_validate(params, extra=extra)
    args: list[Any] = []
    if definition.has_workspace:
        if workspace is None:
            raise BodyError("PERAGO_WORKSPACE is not set for a workspace task")
        args.append(workspace)
    args.append(model)
    if definition.metrics is not None:
        if metrics_path is None:
            raise BodyError("PERAGO_METRICS is not set for a task that records metrics")
        args.append(MetricsFile(metrics_path))
    returned = definition.fn(*args)
    if isinstance(returned, BaseModel):
        returned = returned.model_dump()
    result = definition.output_model.model_validate(returned, extra="forbid")
    return result.model_dump(mode="json")


def failure(exc: BaseException) -> dict[str, Any]:
    """The error document: Python Perago's classification and reason."""
    if isinstance(exc, TaskExecutionError):
        reason = exc.reason
    else:
        reason = str(exc) or type(exc).__name__
    return {"reason": reason, "terminal": isinstance(exc, TaskTerminalError)}


def run(target: str, env: Mapping[str, str] = os.environ) -> int:
    """One attempt; the exit status (0: result written, 1: error document written)."""
    return attempt(lambda: load(target), env)


def attempt(definition: Callable[[], TaskDefinition], env: Mapping[str, str]) -> int:
    """One attempt of the task `definition()` gives, with the attempt's variables `env`."""
    try:
        result_path = Path(env["PERAGO_RESULT"])
        error_path = Path(env["PERAGO_ERROR"])
        params_path = Path(env["PERAGO_PARAMS"])
    except KeyError as exc:
        print(f"perago_k8s run: {exc.args[0]} is not set: run under perago-runner", file=sys.stderr)
        return 2
    workspace = Path(env["PERAGO_WORKSPACE"]) if env.get("PERAGO_WORKSPACE") else None
    metrics = Path(env["PERAGO_METRICS"]) if env.get("PERAGO_METRICS") else None
    try:
        params = json.loads(params_path.read_text(encoding="utf-8"))
        result = invoke(definition(), params, workspace, metrics)
    except Exception as exc:  # noqa: BLE001 - every failure of the attempt is reported
        traceback.print_exc(file=sys.stderr)
        error_path.write_text(json.dumps(failure(exc), ensure_ascii=False), encoding="utf-8")
        return 1
    result_path.write_text(json.dumps(result, ensure_ascii=False), encoding="utf-8")
    return 0


def serve(target: str, channel: socket.socket) -> int:
    """Protocol 2: attempt after attempt from `channel` until the runner closes it.

    The module is imported once, before the first attempt; an import that fails fails every
    attempt with its reason, as it would one process per attempt. Each attempt's variables
    are also set in `os.environ` for its duration (one attempt at a time per process).
    """
    # Loaded before the first attempt arrives: the runner starts persistent bodies ahead of
    # their attempts, so the import is not paid inside an attempt's deadline.
    try:
        loaded: TaskDefinition | Exception = load(target)
    except Exception as exc:  # noqa: BLE001 - reported by every attempt
        traceback.print_exc(file=sys.stderr)
        loaded = exc

    def definition() -> TaskDefinition:
        if isinstance(loaded, Exception):
            raise loaded
        return loaded

    previous: set[str] = set()
    with channel, channel.makefile("r", encoding="utf-8") as lines:
        for line in lines:
            message = json.loads(line)
            if message.get("type") != "attempt" or not isinstance(message.get("env"), dict):
                print(f"perago_k8s run: not an attempt: {line.strip()[:200]}", file=sys.stderr)
                return 2
            env = message["env"]
            for key in previous - env.keys():
                os.environ.pop(key, None)
            os.environ.update(env)
            previous = set(env)
            attempt(definition, env)
            done = {"type": "done", "executionId": message["executionId"]}
            channel.sendall(json.dumps(done).encode() + b"\n")
    return 0


def main(target: str) -> int:
    """`python -m perago_k8s run`: a persistent body when the runner says so, else one attempt."""
    if os.environ.get(PROTOCOL_ENV) == "2":
        return serve(target, socket.socket(fileno=os.dup(0)))
    return run(target)


class MetricsFile(MetricRecorder):
    """Python Perago's recorder, writing the runner protocol's JSON lines.

    Runtime metrics (attempts, workspace I/O, capacity) are the sidecar's: the `runtime_*`
    calls, which only Python Perago's own runtime makes, record nothing here.
    """

    def __init__(self, path: Path) -> None:
        self._path = path

    def with_context(self, context: Any) -> MetricRecorder:
        return self

    @property
    def context(self) -> Any:
        return None

    def histogram(self, name: str, value: int | float, *, labels: Mapping[str, str] | None = None) -> None:
        self._append("histogram", name, value, labels)

    def gauge(self, name: str, value: int | float, *, labels: Mapping[str, str] | None = None) -> None:
        self._append("gauge", name, value, labels)

    @contextlib.contextmanager
    def timer(self, name: str, *, labels: Mapping[str, str] | None = None) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            self._append("timer", name, time.perf_counter() - started, labels)

    def runtime_histogram(self, name: str, value: int | float, *, context: Any, labels: Mapping[str, str] | None = None) -> None:
        pass

    def runtime_gauge(self, name: str, value: int | float, *, context: Any, labels: Mapping[str, str] | None = None) -> None:
        pass

    @contextlib.contextmanager
    def runtime_timer(self, name: str, *, context: Any, labels: Mapping[str, str] | None = None) -> Iterator[None]:
        yield

    def _append(self, kind: str, name: str, value: int | float, labels: Mapping[str, str] | None) -> None:
        sample: dict[str, Any] = {"kind": kind, "name": name, "value": value}
        if labels:
            sample["labels"] = dict(labels)
        with self._path.open("a", encoding="utf-8") as out:
            out.write(json.dumps(sample) + "\n")
