"""Writable workspace task with guardrails, every control set, strict params."""
from enum import Enum
from pathlib import Path
from typing import Optional

from pydantic import BaseModel, Field

from perago import (ExecutionLimits, PublishBudget, RetryPolicy, TaskControls, TimeoutPolicy,
                    WorkspaceSpec, forbid_glob, require_dir, require_file, require_glob, task)


class Mode(str, Enum):
    fast = "fast"
    exact = "exact"


class Window(BaseModel):
    """Time window."""
    start: int = Field(ge=0, description="first second")
    end: int = Field(gt=0)


class Params(BaseModel):
    """Build parameters."""
    name: str = Field(min_length=1, max_length=64, pattern="^[a-z]+$", title="Feature name")
    window: Window = Field(description="window to build")
    mode: Mode = Mode.fast
    limit: Optional[int] = Field(default=None, le=100)
    tags: dict[str, str] = {}
    extra: dict = {}
    windows: list[Window] = []
    title: str = "untitled"
    ratio: float = Field(default=0.5, examples=[0.1, 0.9])


class Result(BaseModel):
    rows: int = Field(ge=0)
    window: Optional[Window] = None
    status: str = "OK"


@task(
    name="features.build",
    owner_email="data@example.com",
    description="Build features",
    strict_params=True,
    workspace=WorkspaceSpec(
        prefix="/audio/render",
        pre=[require_file("raw/manifest.json"), require_dir("raw"),
             require_glob("raw/**/*.parquet", min_count=1, max_count=100)],
        post=[require_glob("features/*.parquet", min_count=0, max_count=10), forbid_glob("**/*.tmp")],
    ),
    controls=TaskControls(
        retry=RetryPolicy(count=5, logic="EXPONENTIAL_BACKOFF", delay_seconds=10, max_delay_seconds=300, jitter_ms=250),
        timeout=TimeoutPolicy(policy="RETRY", seconds=3600, response_seconds=120, poll_seconds=30, total_seconds=7200),
        limits=ExecutionLimits(concurrent_exec_limit=4, rate_limit_frequency_in_seconds=60, rate_limit_per_frequency=10),
        publish_budget=PublishBudget(observed_merge_p99_seconds=20, safety_margin_seconds=10,
                                     lakefs_merge_timeout_seconds=45, conductor_completion_timeout_seconds=15,
                                     worker_shutdown_grace_seconds=30, heartbeat_interval_seconds=10),
    ),
)
def build(workspace: Path, params: Params) -> Result:
    return Result(rows=0)
