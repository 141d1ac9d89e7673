"""The layers' dependency rule (docs/architecture.md), enforced: import-linter's contracts in pyproject.toml hold,
and they bite (a module that breaks one, or a new package no layer names, fails them); the commands stay thin and
one configuration model stays one."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "xover"
LINTER = Path(sys.executable).with_name("lint-imports")


def _lint(pythonpath: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(pythonpath)} if pythonpath is not None else None
    return subprocess.run([str(LINTER)], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)


def test_import_contracts_hold() -> None:
    r = _lint()
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "0 broken" in r.stdout


@pytest.mark.parametrize(
    ("path", "text", "broken"),
    [
        ("analysis/zz_probe.py", "import subprocess\n", "xover.analysis is not allowed to import subprocess"),
        ("domain/zz_probe.py", "import sqlite3\n", "xover.domain is not allowed to import sqlite3"),
        ("report/zz_probe.py", "from xover.results import store\n", "not allowed to import xover.results.store"),
        ("report/zz_probe.py", "from xover.measure import bench\n", "not allowed to import xover.measure"),
        ("gguf/zz_probe.py", "from xover.results import read_model\n", "xover.gguf.zz_probe -> xover.results"),
        ("zz_probe/__init__.py", "", "- xover.zz_probe"),  # a new package no layer names
        ("paths_probe.py", "", "- xover.paths_probe"),
        ("console.py", "from xover.domain import records\n", "xover.console is not allowed to import"),
    ],
)
def test_the_contracts_catch_what_they_forbid(path: str, text: str, broken: str, tmp_path: Path) -> None:
    copy = tmp_path / "src"
    shutil.copytree(SRC, copy / "xover", ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / "xover" / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(target.read_text() + text if target.exists() else text)
    r = _lint(copy)
    assert r.returncode != 0 and broken in r.stdout, r.stdout[-3000:]


def _functions(path: Path) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text())
    return [
        (node.name, (node.end_lineno or node.lineno) - node.lineno + 1)
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    ]


def test_every_command_parses_calls_the_library_once_and_prints() -> None:
    """No function of the CLI package is over 80 lines (docstring included): the work is the library's."""
    long = [(p.name, n, lines) for p in sorted((SRC / "cli").glob("*.py")) for n, lines in _functions(p) if lines > 80]
    assert long == []


def test_no_function_in_src_is_over_100_lines() -> None:
    """Issue 47: a function a newcomer must read whole stays under 100 lines (docstring included)."""
    long = [(str(p.relative_to(SRC)), n, k) for p in sorted(SRC.rglob("*.py")) for n, k in _functions(p) if k > 100]
    assert long == []


def test_one_configuration_model() -> None:
    """At most 8 classes named *Config or *Spec: one configuration (domain.config.LlamaConfig), the study spec and
    a few request or hardware records; no second form of a llama.cpp configuration."""
    names = sorted(
        m.group(1)
        for p in SRC.rglob("*.py")
        for m in re.finditer(r"^class (\w+(?:Config|Spec))\b", p.read_text(), re.M)
    )
    assert len(names) <= 8, names
    assert "LlamaConfig" in names and not {"BenchConfig", "ServerConfig", "ServerSpec", "SweepSpec"} & set(names)
