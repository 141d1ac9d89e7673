"""Child processes that never outlive xover.

Each llama process starts in its own session (its own process group), so a terminal's Ctrl-C
reaches xover only and xover decides how to stop the child: SIGTERM to the group, then SIGKILL
after a bound. Every live child is tracked until it has been reaped; :func:`stop_all` runs at
interpreter exit and on SIGTERM, so no llama process is ever left behind, whatever path the
program leaves by.

In the CLI (:func:`install_signal_handlers`), the first SIGINT or SIGTERM unwinds like Ctrl-C;
later ones are ignored, so a second Ctrl-C cannot cut the (bounded) stopping of the children short
or turn the one-line exit into a traceback, and nothing new is started while unwinding.
"""

from __future__ import annotations

import asyncio
import atexit
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

# What runs before each llama process starts (llama-bench, llama-server): the VRAM budget's holder
# (xover.hardware.vram, a layer above this one) sets its settle() here while a hold is active, so that a new process
# finds the previous one's memory back; nothing otherwise.
_before_start: Callable[[], object] | None = None


def before_each_start(hook: Callable[[], object] | None) -> None:
    """Set (or, with None, clear) what :func:`ready_to_start` runs before each llama process starts."""
    global _before_start
    _before_start = hook


def ready_to_start() -> None:
    """Called by the llama-bench and llama-server runners just before they spawn: the hook, if one is set."""
    if _before_start is not None:
        _before_start()


_live: dict[int, subprocess.Popen[Any]] = {}
# argv[1]: the parent's pid (a parent already gone means exit at once); argv[2:]: the command to exec.
_DIE_WITH_PARENT = (
    "import ctypes, os, signal, sys\n"
    "try:\n    ctypes.CDLL(None).prctl(1, int(signal.SIGKILL), 0, 0, 0)\n"
    "except (OSError, AttributeError):\n    pass\n"
    "if os.getppid() != int(sys.argv[1]):\n    sys.exit(137)\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n"
)
_lock = threading.Lock()

# ggml's abort (GGML_ABORT, GGML_ASSERT, CUDA_CHECK): "<source file>:<line>: <message>" on stderr, then a backtrace
# and abort(). ik_llama.cpp's backtrace forks the process to run gdb, and where neither gdb nor lldb exists the
# forked child exits through the atexit handlers of a CUDA process and can hang there: its parent then waits for it
# forever, holding its GPU memory, with a request in flight (seen on the H200 machine at a CUDA out of memory).
# Whoever reads a llama process's output stops it once such a line is not followed by its exit within ABORT_GRACE_S.
_FATAL_LINE = re.compile(r"^\S+\.(?:c|cc|cpp|cu|cuh|h|hpp|m):\d+: \S|GGML_ASSERT\(.*\) failed")
ABORT_GRACE_S = 5.0


def fatal_line(line: str) -> bool:
    """Is ``line`` ggml's abort message (``ggml-cuda.cu:132: CUDA error``, ``GGML_ASSERT(...) failed``)?"""
    return bool(_FATAL_LINE.search(line.strip()))


def abort_message(lines: Sequence[str]) -> str | None:
    """ggml's first abort line in ``lines``, with the error line just before it where there is one
    (``ggml-cuda.cu:132: CUDA error (CUDA error: out of memory)``); None if no line is an abort."""
    for i, line in enumerate(lines):
        if fatal_line(line):
            cause = next((c.strip() for c in reversed(lines[max(0, i - 4) : i]) if "error:" in c.lower()), None)
            return line.strip() + (f" ({cause})" if cause else "")
    return None


def spawn(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    stdout: IO[Any] | int | None = None,
    stderr: IO[Any] | int | None = None,
    cwd: Path | None = None,
    text: bool = True,
    stdin: IO[Any] | int | None = subprocess.DEVNULL,
    die_with_parent: bool = False,
) -> subprocess.Popen[Any]:
    """Start ``argv`` (a list: never a shell string) in a new session and track it.

    ``die_with_parent``: the kernel SIGKILLs the child if xover dies first, even by SIGKILL (which no
    handler of xover's can answer): a Python trampoline sets ``PR_SET_PDEATHSIG`` and then execs ``argv``,
    so the child keeps its pid. Linux only (elsewhere the trampoline just execs)."""
    if _interrupted:
        raise KeyboardInterrupt  # unwinding after SIGINT/SIGTERM: start nothing new
    full_env = dict(os.environ)
    if env:
        full_env.update(env)
    argv = list(argv)
    if die_with_parent:
        if shutil.which(argv[0]) is None:  # as Popen would: the trampoline could only fail after the fork
            raise FileNotFoundError(2, "No such file or directory", argv[0])
        argv = [sys.executable, "-c", _DIE_WITH_PARENT, str(os.getpid()), *argv]
    proc = subprocess.Popen(
        argv,
        env=full_env,
        stdout=stdout,
        stderr=stderr,
        stdin=stdin,
        cwd=cwd,
        start_new_session=True,  # a process group of its own: stop() signals the whole group
        text=text,
        bufsize=1 if text else -1,
    )
    with _lock:
        _live[proc.pid] = proc
    return proc


def run_short(
    argv: Sequence[str], timeout_s: float, env: Mapping[str, str] | None = None
) -> tuple[int | None, str, str]:
    """A short child's exit code (None: it could not start or did not answer within ``timeout_s``), stdout and
    stderr (or why there is no answer); tracked and stopped like every child."""
    try:
        proc = spawn(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except OSError as e:
        return None, "", str(e)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return None, "", f"no answer within {timeout_s:.0f} s"
    finally:
        stop(proc)
    return proc.returncode, out, err


def spawn_logged(argv: Sequence[str], log_path: Path, env: Mapping[str, str] | None = None) -> subprocess.Popen[Any]:
    """A llama.cpp process that dies with xover, its command line first in its log and its output after it."""
    with log_path.open("wb") as log:  # the child keeps its own descriptor
        log.write(("$ " + " ".join(argv) + "\n").encode())
        log.flush()
        return spawn(argv, env=env, stdout=log, stderr=subprocess.STDOUT, text=False, die_with_parent=True)


def stop(proc: subprocess.Popen[Any], timeout_s: float = 5.0) -> int | None:
    """SIGTERM the child's process group, SIGKILL it after ``timeout_s``; reap it; SIGKILL whatever is left in its
    group; return its code.

    The child stays tracked until it has been reaped, so a stop cut short (an exception while
    waiting) is finished by :func:`stop_all`.
    """
    if proc.poll() is None:
        _signal_group(proc, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _signal_group(proc, signal.SIGKILL)
            proc.wait(timeout=timeout_s)
    # The leader has exited, by the signal or before it: nothing it started may linger in its group. ik_llama.cpp's
    # abort forks for a backtrace, and the fork, which keeps llama-server's SIGTERM handler and its sockets, outlived
    # a SIGTERM that ended its parent: it held the request in flight and 16 GiB of GPU memory (H200, 2026-12-03).
    _signal_group(proc, signal.SIGKILL)
    with _lock:
        _live.pop(proc.pid, None)
    return proc.returncode


def forget(proc: subprocess.Popen[Any]) -> None:
    """Stop tracking a child that has exited and been reaped."""
    with _lock:
        _live.pop(proc.pid, None)


def _signal_group(proc: subprocess.Popen[Any], sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def live_pids() -> list[int]:
    with _lock:
        return [pid for pid, p in _live.items() if p.poll() is None]


def stop_all() -> None:
    with _lock:
        procs = list(_live.values())
    for p in procs:
        try:
            stop(p, timeout_s=3.0)
        except subprocess.TimeoutExpired:  # unkillable (uninterruptible sleep): nothing more to do
            pass


_interrupted = False


def _on_interrupt(signum: int, frame: object) -> None:
    """SIGINT and SIGTERM: the first unwinds like Ctrl-C (context managers stop the children); the
    process then ignores both, at the OS level, until it exits."""
    global _interrupted
    if _interrupted:
        return
    _interrupted = True
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        raise KeyboardInterrupt from None
    # Inside an event loop, raise between two callbacks, never inside one (an HTTP library's
    # cancellation machinery, say): asyncio lets KeyboardInterrupt out of run_until_complete and
    # asyncio.run then cancels every task, so each `async with LlamaServer` stops its server.
    loop.call_soon_threadsafe(_raise_interrupt)


def _raise_interrupt() -> None:
    raise KeyboardInterrupt


def interrupted_by(exc: BaseException) -> bool:
    """Whether ``exc`` is the unwinding of a SIGINT/SIGTERM this process took: a KeyboardInterrupt, or what
    asyncio raised while handling one. When the interrupt lands while ``asyncio.run`` is tidying up (its default
    executor's shutdown), the loop reports ``RuntimeError('Event loop stopped before Future completed.')`` with the
    KeyboardInterrupt as its context."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, KeyboardInterrupt):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def install_signal_handlers() -> None:
    """Make SIGINT and SIGTERM unwind like Ctrl-C, once (call from the main thread of the CLI)."""
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, _on_interrupt)


def ignore_signals_until_exit() -> None:
    """Once the CLI's work is done (results stored, children stopped, the last line printed): ignore SIGINT and
    SIGTERM at the OS level. Python's finalization resets the signals it handles to their defaults, so a Ctrl-C or
    SIGTERM arriving while the interpreter shuts down would otherwise end the process by the signal (exit -2/-15,
    without its line) after it had finished; an ignored signal stays ignored through finalization."""
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)


atexit.register(stop_all)
