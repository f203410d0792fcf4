import json

import pytest

from perago_k8s.body import run

MODULE = """
from pathlib import Path
from pydantic import BaseModel
from perago import MetricRecorder, MetricSpec, TaskFailed, TaskTerminalError, WorkspaceSpec, task

class Params(BaseModel):
    mode: str = "ok"
    n: int = 1

class Result(BaseModel):
    files: int
    mode: str

@task(name="w", owner_email="a@example.com", workspace=WorkspaceSpec())
def write(workspace: Path, params: Params) -> Result:
    if params.mode == "terminal":
        raise TaskTerminalError("the input cannot be used")
    if params.mode == "retry":
        raise TaskFailed("upstream busy")
    if params.mode == "crash":
        raise ZeroDivisionError("division by zero")
    if params.mode == "extra":
        return {"files": 1, "mode": "x", "surprise": True}
    if params.mode == "dict":
        return {"files": 2, "mode": "dict"}
    (workspace / "out.txt").write_text("x" * params.n)
    return Result(files=len(list(workspace.iterdir())), mode=params.mode)
"""

STRICT = """
from pydantic import BaseModel
from perago import MetricRecorder, MetricSpec, task

class Params(BaseModel):
    n: int

class Result(BaseModel):
    n: int

@task(name="s", owner_email="a@example.com", strict_params=True, metrics=MetricSpec())
def count(params: Params, metrics: MetricRecorder) -> Result:
    metrics.histogram("rows", params.n, labels={"table": "t"})
    metrics.gauge("backlog", 3)
    with metrics.timer("compute_seconds"):
        pass
    return Result(n=params.n)
"""


@pytest.fixture
def attempt(tmp_path):
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    env = {
        "PERAGO_PARAMS": str(tmp_path / "params.json"),
        "PERAGO_RESULT": str(tmp_path / "result.json"),
        "PERAGO_ERROR": str(tmp_path / "error.json"),
        "PERAGO_METRICS": str(tmp_path / "metrics.jsonl"),
        "PERAGO_WORKSPACE": str(workspace),
    }

    def go(target, params):
        (tmp_path / "params.json").write_text(json.dumps(params))
        for name in ("result.json", "error.json"):
            (tmp_path / name).unlink(missing_ok=True)
        status = run(target, env)
        read = lambda name: json.loads((tmp_path / name).read_text()) if (tmp_path / name).exists() else None  # noqa: E731
        return status, read("result.json"), read("error.json")

    go.workspace = workspace
    go.metrics = tmp_path / "metrics.jsonl"
    return go


def test_a_workspace_task_writes_its_files_and_its_result(module, attempt):
    name = module(MODULE)
    assert attempt(f"{name}:write", {"n": 3, "unknown": 1}) == (0, {"files": 1, "mode": "ok"}, None)
    assert (attempt.workspace / "out.txt").read_text() == "xxx"
    assert attempt(f"{name}:write", {"mode": "dict"}) == (0, {"files": 2, "mode": "dict"}, None)


@pytest.mark.parametrize(
    "mode, error",
    [
        ("terminal", {"reason": "the input cannot be used", "terminal": True}),
        ("retry", {"reason": "upstream busy", "terminal": False}),
        ("crash", {"reason": "division by zero", "terminal": False}),
    ],
)
def test_failures_keep_python_peragos_classification(module, attempt, mode, error):
    name = module(MODULE)
    assert attempt(f"{name}:write", {"mode": mode}) == (1, None, error)


def test_a_result_with_an_undeclared_field_is_refused(module, attempt):
    status, result, error = attempt(f"{module(MODULE)}:write", {"mode": "extra"})
    assert (status, result, error["terminal"]) == (1, None, False)
    assert "surprise" in error["reason"] and "Extra inputs are not permitted" in error["reason"]


def test_strict_params_refuse_unknown_fields_and_metrics_become_json_lines(module, attempt):
    name = module(STRICT)
    status, _, error = attempt(f"{name}:count", {"n": 1, "unknown": 2})
    assert status == 1 and "unknown" in error["reason"]
    assert attempt(f"{name}:count", {"n": 5}) == (0, {"n": 5}, None)
    samples = [json.loads(line) for line in attempt.metrics.read_text().splitlines()]
    assert samples[:2] == [
        {"kind": "histogram", "name": "rows", "value": 5, "labels": {"table": "t"}},
        {"kind": "gauge", "name": "backlog", "value": 3},
    ]
    assert samples[2]["kind"] == "timer" and samples[2]["value"] >= 0


@pytest.mark.parametrize(
    "target, words",
    [
        ("no_colon", "the target must be MODULE:FUNCTION"),
        ("no_such_module_xyz:f", "importing no_such_module_xyz failed"),
        ("json:loads", "json:loads is not a function decorated with perago.task"),
    ],
)
def test_a_wrong_target_fails_the_attempt_saying_why(attempt, target, words):
    status, result, error = attempt(target, {})
    assert (status, result) == (1, None)
    assert words in error["reason"] and error["terminal"] is False


def test_outside_the_runner_it_says_what_is_missing(capsys):
    assert run("m:f", {}) == 2
    assert "PERAGO_RESULT is not set" in capsys.readouterr().err


def test_a_persistent_body_serves_attempts_until_the_runner_closes_its_socket(module, tmp_path):
    import socket
    import threading

    from perago_k8s.body import serve

    name = module("""
import os
from pydantic import BaseModel
from perago import task

IMPORTS = [os.getpid()]

class Params(BaseModel):
    n: int

class Result(BaseModel):
    n: int
    imports: int
    task_id: str

@task(name="p", owner_email="a@example.com")
def double(params: Params) -> Result:
    if params.n < 0:
        raise ValueError("negative")
    return Result(n=params.n * 2, imports=len(IMPORTS), task_id=os.environ["PERAGO_TASK_ID"])
""")
    runner_end, body_end = socket.socketpair()
    served = []
    thread = threading.Thread(target=lambda: served.append(serve(f"{name}:double", body_end)))
    thread.start()
    answers = runner_end.makefile("r")
    outcomes = []
    for i, n in enumerate([1, 2, -1]):
        env = {key: str(tmp_path / f"{i}-{key}") for key in ("PERAGO_PARAMS", "PERAGO_RESULT", "PERAGO_ERROR")}
        env["PERAGO_TASK_ID"] = f"t{i}"
        (tmp_path / f"{i}-PERAGO_PARAMS").write_text(json.dumps({"n": n}))
        runner_end.sendall(json.dumps({"type": "attempt", "executionId": f"e{i}", "env": env}).encode() + b"\n")
        assert json.loads(answers.readline()) == {"type": "done", "executionId": f"e{i}"}
        result, error = tmp_path / f"{i}-PERAGO_RESULT", tmp_path / f"{i}-PERAGO_ERROR"
        outcomes.append(json.loads(result.read_text()) if result.exists() else json.loads(error.read_text()))
    runner_end.shutdown(socket.SHUT_WR)
    thread.join(10)
    assert served == [0]
    assert outcomes == [
        {"n": 2, "imports": 1, "task_id": "t0"},
        {"n": 4, "imports": 1, "task_id": "t1"},
        {"reason": "negative", "terminal": False},
    ]
