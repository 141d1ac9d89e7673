"""SIGKILL of xover (which no handler can answer) leaves no llama process behind: llama-server and
llama-bench start with PR_SET_PDEATHSIG (xover.llamacpp.process.spawn(die_with_parent=True)), so the
kernel kills them with xover."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from procs import children_named, gone_within

pytestmark = pytest.mark.real


def _measuring(parent: int, tool: str, model: Path) -> list[int]:
    """``parent``'s children called ``tool`` that run ``model``: the measured process, never a probe of the binary
    (xover ttft first runs ``llama-server --help``, a plain child that exits by itself within moments: caught by the
    poll, more likely the slower the machine, it would pass this test whatever PR_SET_PDEATHSIG does)."""
    names = {str(model).encode(), str(model.resolve()).encode()}
    found = []
    for pid in children_named(parent, tool):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if names & set(argv):
            found.append(pid)
    return found


@pytest.mark.parametrize("tool", ["llama-server", "llama-bench"])
def test_sigkill_of_xover_takes_its_llama_process_with_it(
    tool: str, tiny_model: Path, llama_bins, tmp_path: Path
) -> None:
    if tool == "llama-server":
        args = ["ttft", "-m", str(tiny_model), "--lengths", "2k", "-r", "200", "-R", "64"]
    else:
        args = ["bench", "-m", str(tiny_model), "--depth", "0", "-r", "200", "--pp", "2048", "--tg", "0"]
    xover = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "xover",
            *args,
            "-o",
            str(tmp_path / "st"),
            "--llama-bin-dir",
            str(llama_bins.bench.parent),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline, found = time.monotonic() + 60, []
        while time.monotonic() < deadline and not found and xover.poll() is None:
            found = _measuring(xover.pid, tool, tiny_model)
            time.sleep(0.1)
        assert found, f"xover never started {tool}"
        os.kill(xover.pid, signal.SIGKILL)
        xover.wait(timeout=10)
        assert gone_within(found[0]), f"{tool} {found[0]} outlived a SIGKILLed xover"
    finally:
        if xover.poll() is None:
            xover.kill()
        for pid in children_named(1, tool):
            if Path(f"/proc/{pid}/cmdline").read_bytes().find(str(tiny_model).encode()) >= 0:
                os.kill(pid, signal.SIGKILL)
