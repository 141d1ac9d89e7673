"""Children start in their own process group and are always reaped."""

import os
import sys

from xover.llamacpp import process


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie still answers kill(0); look at its state
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_stop_terminates_group_including_grandchildren():
    # the child ignores SIGTERM and starts a grandchild: stop() must still clean up both
    code = (
        "import signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        "print(g.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    import subprocess

    p = process.spawn([sys.executable, "-c", code], stdout=subprocess.PIPE)
    grandchild = int(p.stdout.readline())
    assert p.pid in process.live_pids()
    assert os.getpgid(p.pid) == p.pid  # its own group: a terminal's Ctrl-C doesn't reach it directly
    process.stop(p, timeout_s=0.5)
    assert not _alive(p.pid)
    for _ in range(50):
        if not _alive(grandchild):
            break
        import time

        time.sleep(0.05)
    assert not _alive(grandchild)
    assert p.pid not in process.live_pids()


def test_stop_all_reaps_everything():
    ps = [process.spawn([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(2)]
    process.stop_all()
    assert all(not _alive(p.pid) for p in ps)
    assert process.live_pids() == []
