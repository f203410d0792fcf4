import yaml

from perago_k8s.cli import main
from perago_k8s.manifest import generate, object_name

HEADER = """
from pathlib import Path
from pydantic import BaseModel
from perago import MetricRecorder, MetricSpec, TaskControls, TimeoutPolicy, WorkspaceSpec, require_file, task

class Params(BaseModel):
    n: int = 1

class Result(BaseModel):
    total: int
"""


def test_a_workspace_task_becomes_a_peragotask_with_every_control_written(module):
    name = module(HEADER + """
@task(name="Files.Write_v2", owner_email="a@example.com", workspace=WorkspaceSpec(prefix="/data", read_only=True, pre=[require_file("in.csv")]),
      controls=TaskControls(timeout=TimeoutPolicy(response_seconds=30)))
def write(workspace: Path, params: Params) -> Result:
    return Result(total=params.n)
""")
    task = generate(name, "registry.example.com/t:1", "jobs").task
    assert task["metadata"] == {"name": "files-write-v2", "namespace": "jobs"}
    spec = task["spec"]
    assert "description" not in spec
    assert spec["workspace"] == {"prefix": "data", "readOnly": True, "pre": [{"kind": "requireFile", "path": "in.csv"}]}
    assert spec["strictParams"] is False
    assert spec["controls"]["timeout"]["responseSeconds"] == 30
    assert spec["controls"]["retry"]["count"] >= 0
    assert "limits" not in spec["controls"] and "publishBudget" not in spec["controls"]
    assert spec["executor"]["body"] == {
        "image": "registry.example.com/t:1",
        "command": ["python", "-m", "perago_k8s", "run", f"{name}:write"],
    }


def test_a_task_recording_metrics_keeps_its_switches_and_is_warned_about_application_metrics(module):
    name = module(HEADER + """
@task(name="m", owner_email="a@example.com", metrics=MetricSpec(workspace_io=False))
def count(params: Params, metrics: MetricRecorder) -> Result:
    return Result(total=1)
""")
    generated = generate(name, "i", None)
    assert generated.task["spec"]["metrics"] == {"attempts": True, "workspaceIo": False, "workerCapacity": True}
    assert "spec.metrics.application" in generated.warnings[0]
    assert "task 'm'" in generated.warnings[0]


def test_object_names_are_dns_labels():
    assert object_name("features.build", "w") == "features-build"
    assert object_name("__A__b__", "w") == "a-b"
    assert len(object_name("x" * 80, "w")) == 52
    try:
        object_name("...", "t")
    except Exception as exc:  # noqa: BLE001
        assert "t: the task name gives no Kubernetes object name" in str(exc)
    else:
        raise AssertionError("no error")


def test_modules_that_cannot_convert_are_named_and_nothing_is_written(module, tmp_path, capsys):
    good = module(HEADER + """
@task(name="good", owner_email="a@example.com")
def ok(params: Params) -> Result:
    return Result(total=1)
""")
    no_task = module("X = 1\n")
    bad_signature = module(HEADER + """
@task(name="bad", owner_email="a@example.com")
def bad(params: Params, other: int) -> Result:
    return Result(total=1)
""")
    nested = module(HEADER + """
def make():
    @task(name="inner", owner_email="a@example.com")
    def inner(params: Params) -> Result:
        return Result(total=1)
    return inner
make()
""")
    out = tmp_path / "out" / "tasks.yaml"
    for broken, words in [
        (no_task, "does not declare a Perago task"),
        (bad_signature, "parameters must be named workspace and params"),
        (nested, "is not the module-level name"),
        ("no_such_module_here", "cannot import it"),
    ]:
        assert main(["manifest", good, broken, "--image", "i", "-o", str(out)]) == 1
        err = capsys.readouterr().err
        assert broken in err and words in err, err
        assert not out.exists()
    assert main(["manifest", good, "--image", "i", "-o", str(out)]) == 0
    documents = list(yaml.safe_load_all(out.read_text()))
    assert [d["spec"]["taskName"] for d in documents] == ["good"]


def test_name_is_for_one_module_only(module, capsys):
    a = module(HEADER + """
@task(name="a", owner_email="a@example.com")
def f(params: Params) -> Result:
    return Result(total=1)
""")
    assert main(["manifest", a, a, "--image", "i", "--name", "x"]) == 2
    assert main(["manifest", a, "--image", "i", "--name", "custom"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["metadata"]["name"] == "custom"
