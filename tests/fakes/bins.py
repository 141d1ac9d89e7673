"""Binary folders for fault injection around the *real* llama.cpp binaries.

:func:`shim_bin_dir` writes a folder that ``--llama-bin-dir`` (or ``$XOVER_LLAMA_BIN_DIR``) accepts:

* ``llama-server`` and ``llama-bench`` are tiny shell shims that append their pid to a pid file and
  ``exec`` the real binary (same pid), so a test knows every llama process a run started, exactly;
* ``llama-server`` hands over to the fake server (:mod:`tests.fakes.llama_server`) only when its
  arguments carry a ``--fake-*`` option (a study configuration's ``server-args``), to inject a
  fault a real server cannot produce on demand (``--fake-fault never-healthy``);
* with ``bench_crash_marker``, ``llama-bench`` runs the real binary under :data:`CRASHING_BENCH`:
  while the marker file exists, the real llama-bench is killed with SIGSEGV right after its first
  JSONL record (a crash mid-sweep) and the marker is removed, so the next run is a normal one;
* with ``bench_abort_marker`` likewise, but the first run prints ggml's abort message after its first record and
  hangs (:data:`ABORTING_BENCH`).
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

FAKE_SERVER = Path(__file__).resolve().with_name("llama_server.py")

# the real llama-bench, exec'd unless the marker exists; else, once (the marker removed), run until its first JSONL
# record and stopped there: the fault follows
_FAULT_AFTER_FIRST_RECORD = """\
import os, resource, signal, subprocess, sys, time
REAL, MARKER, PIDS = {real!r}, {marker!r}, {pids!r}
if not os.path.exists(MARKER):
    os.execv(REAL, [REAL, *sys.argv[1:]])
os.remove(MARKER)
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crash, without a core file
child = subprocess.Popen([REAL, *sys.argv[1:]], stdout=subprocess.PIPE)  # stderr: xover's pipe
with open(PIDS, "a") as f:
    f.write(f"{{child.pid}}\\n")
for line in child.stdout:
    sys.stdout.buffer.write(line)
    sys.stdout.buffer.flush()
    if line.startswith(b"{{"):
        break
"""

# with ``bench_crash_marker``: the real llama-bench and then the wrapper itself killed by SIGSEGV
CRASHING_BENCH = (
    _FAULT_AFTER_FIRST_RECORD
    + """\
os.kill(child.pid, signal.SIGSEGV)
child.wait()
os.kill(os.getpid(), signal.SIGSEGV)
"""
)

# with ``bench_abort_marker``: after the first record, ggml's abort message (as ik_llama.cpp printed it at a CUDA
# out of memory on the H200) and a hang, a forked child holding the pipes as ik's backtrace child did
ABORTING_BENCH = (
    _FAULT_AFTER_FIRST_RECORD
    + """\
child.kill()
child.wait()
hung = os.fork()
if hung == 0:
    time.sleep(3600)
    os._exit(0)
with open(PIDS, "a") as f:
    f.write(f"{{hung}}\\n")
# a new line first: the llama-bench killed above may have left its last line open
sys.stderr.write("\\nCUDA error: out of memory\\n  current device: 0, in function alloc at ggml-cuda.cu:442\\n"
                 "/src/ggml/src/ggml-cuda.cu:132: CUDA error\\n")
sys.stderr.flush()
time.sleep(3600)
"""
)


def _sh(path: Path, body: str) -> None:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


def shim_bin_dir(
    folder: Path,
    real_bin_dir: Path,
    pid_file: Path,
    *,
    bench_crash_marker: Path | None = None,
    bench_abort_marker: Path | None = None,
    server_start_delay_s: float = 0.0,
) -> Path:
    """A folder of pid-recording shims around the real binaries in ``real_bin_dir`` (see the module doc).

    ``server_start_delay_s`` delays every real llama-server start (not ``--help``) as a slow
    initialisation would (GPU backends take a while before they bind their port).
    """
    folder.mkdir(parents=True, exist_ok=True)
    q = shlex.quote
    record = f"echo $$ >> {q(str(pid_file))}\n"
    delay = f'case " $* " in *" --port "*) sleep {server_start_delay_s:g};; esac\n' if server_start_delay_s else ""
    _sh(
        folder / "llama-server",
        record
        + 'for a in "$@"; do case "$a" in --fake-*) '
        + f'exec {q(sys.executable)} {q(str(FAKE_SERVER))} "$@";; esac; done\n'
        + delay
        + f'exec {q(str(real_bin_dir / "llama-server"))} "$@"\n',
    )
    marker = bench_crash_marker or bench_abort_marker
    if marker is None:
        _sh(folder / "llama-bench", record + f'exec {q(str(real_bin_dir / "llama-bench"))} "$@"\n')
    else:
        wrapper = folder / "faulty_bench.py"
        template = CRASHING_BENCH if bench_crash_marker is not None else ABORTING_BENCH
        wrapper.write_text(
            template.format(real=str(real_bin_dir / "llama-bench"), marker=str(marker), pids=str(pid_file))
        )
        _sh(folder / "llama-bench", record + f'exec {q(sys.executable)} {q(str(wrapper))} "$@"\n')
    return folder


def recorded_pids(pid_file: Path) -> set[int]:
    """Every pid a shim wrote."""
    if not pid_file.exists():
        return set()
    return {int(x) for x in pid_file.read_text().split()}


def running(pid: int) -> bool:
    """True while ``pid`` is a live process (a zombie awaiting its reaper counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")
