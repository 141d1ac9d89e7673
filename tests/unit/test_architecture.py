"""The layers' dependency rule (docs/architecture.md), enforced: import-linter's contracts in pyproject.toml."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_import_contracts_hold() -> None:
    linter = Path(sys.executable).with_name("lint-imports")
    r = subprocess.run([str(linter)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "0 broken" in r.stdout
