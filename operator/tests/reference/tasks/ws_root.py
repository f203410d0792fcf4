"""Writable workspace task at the repository root, lenient params, non-ASCII description."""
from pathlib import Path

from pydantic import BaseModel, Field

from perago import TaskControls, TimeoutPolicy, WorkspaceSpec, task


class Params(BaseModel):
    label: str = Field(default="é", description="naïve label ✓")


class Result(BaseModel):
    written: int


@task(
    name="files.write",
    owner_email="files@example.com",
    description="Écrit des fichiers — 写文件",
    workspace=WorkspaceSpec(),
    controls=TaskControls(timeout=TimeoutPolicy(policy="ALERT_ONLY", response_seconds=30)),
)
def write(workspace: Path, params: Params) -> Result:
    return Result(written=0)
