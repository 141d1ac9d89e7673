"""Process checks shared by the tests."""

from __future__ import annotations

import os


def pid_gone(pid: int) -> bool:
    """True once no process has ``pid`` (xover reaps its children, so a stopped one leaves no zombie)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False
