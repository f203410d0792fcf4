"""Read-only workspace task with a publish budget (ignored, with a warning), lenient params."""
from pathlib import Path

from pydantic import BaseModel

from perago import PublishBudget, TaskControls, WorkspaceSpec, require_glob, task


class Params(BaseModel):
    table: str
    columns: list[str] = []


class Result(BaseModel):
    valid: bool
    problems: list[str] = []


@task(
    name="features.validate",
    owner_email="data@example.com",
    workspace=WorkspaceSpec(prefix="tables", read_only=True, pre=[require_glob("*.parquet")]),
    controls=TaskControls(publish_budget=PublishBudget(
        observed_merge_p99_seconds=0, safety_margin_seconds=0, lakefs_merge_timeout_seconds=1,
        conductor_completion_timeout_seconds=1, worker_shutdown_grace_seconds=1, heartbeat_interval_seconds=1)),
)
def validate(workspace: Path, params: Params) -> Result:
    return Result(valid=True)
