"""The unit tier starts no process: every test here is pure logic, in-process I/O (files, SQLite, an in-process HTTP
transport) or a check of the sources. A test that needs a process (a real llama.cpp binary, a fake server, a
compiler, a subprocess of xover) belongs to tests/process or tests/real. The guard below fails such a test at the
moment it starts one, naming what it started, so a new one cannot slip into the fast tier unnoticed."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from typing import Any

import matplotlib
import pytest

# matplotlib builds its font cache on first import by running fc-list, a process: in a venv that has never plotted,
# the first unit test that renders a plot would trip the guard. Build it here, before any test runs.
matplotlib.use("Agg")
import matplotlib.font_manager  # noqa: E402, F401


class StartedAProcess(AssertionError):
    pass


def _refuse(what: str) -> Any:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        shown = next((a for a in args if isinstance(a, (list, tuple, str, bytes))), kwargs.get("args", ""))
        raise StartedAProcess(f"tests/unit starts no process ({what}: {shown!r}): move the test to tests/process")

    return refuse


@pytest.fixture(autouse=True)
def _no_processes(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(subprocess.Popen, "_execute_child", _refuse("subprocess"))
    for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system", "execv", "execve", "execvp"):
        if hasattr(os, name):
            monkeypatch.setattr(os, name, _refuse(f"os.{name}"))
    yield
