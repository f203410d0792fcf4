import itertools
import sys
import textwrap

import pytest

_counter = itertools.count()


@pytest.fixture
def module(tmp_path, monkeypatch):
    """Write a module of Python source under a fresh name and return that name."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(source: str) -> str:
        name = f"taskmod_{next(_counter)}_{id(tmp_path)}"
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source), encoding="utf-8")
        return name

    yield write
    for name in [m for m in sys.modules if m.startswith("taskmod_")]:
        del sys.modules[name]
