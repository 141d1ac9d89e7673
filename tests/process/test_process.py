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


def test_stop_kills_what_outlives_a_leader_ended_by_sigterm():
    # ik_llama.cpp on the H200: SIGTERM ended llama-server, but its backtrace's fork ignored it and, holding the
    # server's sockets, kept the request in flight for the rest of the lease. The leader's exit is not the group's.
    import subprocess
    import time

    code = (
        "import os, signal, sys, time\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "    print(os.getpid(), flush=True)\n"
        "    time.sleep(60)\n"
        "    os._exit(0)\n"
        "time.sleep(60)\n"
    )
    p = process.spawn([sys.executable, "-c", code], stdout=subprocess.PIPE)
    child = int(p.stdout.readline())  # once it ignores SIGTERM
    process.stop(p, timeout_s=5.0)
    assert p.returncode == -15  # the leader went at SIGTERM, well within the timeout: no SIGKILL was needed for it
    for _ in range(50):
        if not _alive(child):
            break
        time.sleep(0.05)
    assert not _alive(child)


def test_stop_all_reaps_everything():
    ps = [process.spawn([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(2)]
    process.stop_all()
    assert all(not _alive(p.pid) for p in ps)
    assert process.live_pids() == []


# ---- ggml's abort message (known answers from real logs) ---------------------------------------------

# ik_llama.cpp's llama-server at a CUDA out of memory on the H200 machine (2026-12-03), the lines before its hang
IK_OOM = [
    'INFO [    batch_pending_prompt] kv cache rm [p0, end) | tid="139992913399808" id_slot=0 id_task=3 p0=0',
    "CUDA error: out of memory",
    "  current device: 0, in function alloc at /tmp/ik/ik_llama.cpp-ik0.1.5/ggml/src/ggml-cuda.cu:442",
    "  cuMemCreate(&handle, reserve_size, &prop, 0)",
    "/tmp/ik/ik_llama.cpp-ik0.1.5/ggml/src/ggml-cuda.cu:132: CUDA error",
]


def test_abort_message_from_ik_llama_cpp_out_of_memory() -> None:
    from xover.llamacpp.process import abort_message, fatal_line

    assert [fatal_line(line) for line in IK_OOM] == [False, False, False, False, True]
    assert abort_message(IK_OOM) == (
        "/tmp/ik/ik_llama.cpp-ik0.1.5/ggml/src/ggml-cuda.cu:132: CUDA error (CUDA error: out of memory)"
    )
    assert abort_message(IK_OOM[:-1]) is None  # the error line alone is not an abort: llama.cpp may recover


def test_fatal_line_assert_and_ordinary_lines() -> None:
    from xover.llamacpp.process import abort_message, fatal_line

    assert fatal_line("/src/ggml/src/ggml.c:1726: GGML_ASSERT(view_src == NULL || data_size == 0) failed")
    assert fatal_line("ggml/src/ggml-cpu/ops.cpp:7725: fatal error")
    for ordinary in (
        "0.03.663.556 I slot print_timing: id  0 | task 0 | prompt eval time =     942.95 ms /   512 tokens",
        "llama_model_load: error loading model: tensor 'blk.0.ffn_gate_exps.weight' data is not within bounds",
        "main: loading model from /models/qwen3-30b-a3b.gguf:3: x",
        "load_tensors:        CUDA0 model buffer size = 12218.00 MiB",
    ):
        assert not fatal_line(ordinary), ordinary
    assert abort_message(["GGML_ASSERT(x) failed"]) == "GGML_ASSERT(x) failed"
