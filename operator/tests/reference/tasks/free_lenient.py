"""Workspace-free task, lenient params, nested models in lists, maps and optionals."""
from typing import Literal, Optional

from pydantic import BaseModel, Field

from perago import task


class Inner(BaseModel):
    a: int
    b: Optional[str] = None


class Empty(BaseModel):
    pass


class Params(BaseModel):
    inner: Inner
    inners: dict[str, Inner] = {}
    items: list[Inner] = []
    empty: Empty = Empty()
    maybe: Optional[Empty] = None
    kind: Literal["x", "y"] = "x"
    score: float = Field(default=1.0, multiple_of=0.5)


class Result(BaseModel):
    total: int
    inner: Inner
    by_key: dict[str, Inner] = {}


@task(name="math.sum", owner_email="math@example.com", description="")
def total(params: Params) -> Result:
    return Result(total=0, inner=Inner(a=1))
