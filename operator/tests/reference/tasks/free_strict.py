"""Workspace-free task, strict params, defaults everywhere."""
from pydantic import BaseModel

from perago import task


class Params(BaseModel):
    message: str
    repeat: int = 1


class Result(BaseModel):
    echoed: str


@task(name="util.echo", owner_email="ops@example.com", strict_params=True)
def echo(params: Params) -> Result:
    return Result(echoed=params.message)
