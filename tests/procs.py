"""Process checks shared by the tests."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path


def pid_gone(pid: int) -> bool:
    """True once no process has ``pid`` (xover reaps its children, so a stopped one leaves no zombie)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def running(pid: int) -> bool:
    """Running: a zombie (exited, not yet reaped by whoever adopted it) or a pid that no longer exists is gone."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def gone_within(pid: int, seconds: float = 10.0) -> bool:
    """True once ``pid`` stops running, waiting at most ``seconds``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not running(pid):
            return True
        time.sleep(0.05)
    return not running(pid)


def children_named(parent: int, name: str) -> list[int]:
    """Pids of the processes whose parent is ``parent`` and whose command is ``name`` (the kernel keeps 15 characters)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            comm = stat[stat.index("(") + 1 : stat.rindex(")")]
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == parent and comm == name[:15]:
            out.append(int(d.name))
    return out


def run_xover(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m xover ARGS`` as a user would run it, output captured. The timeout guards against a hang only: a
    2-core machine with a core busy elsewhere runs llama.cpp and xover many times slower (issue 64)."""
    return subprocess.run([sys.executable, "-m", "xover", *args], capture_output=True, text=True, timeout=600, cwd=cwd)


def one_line_error(r: subprocess.CompletedProcess[str], needle: str) -> str:
    """Assert a failed run printed exactly one line on stderr, containing ``needle``, and no traceback."""
    assert r.returncode != 0
    assert "Traceback" not in r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert needle in lines[0], lines[0]
    return lines[0]
