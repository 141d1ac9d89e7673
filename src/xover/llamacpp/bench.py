"""llama-bench as a library: argument lists from typed configuration, a streaming runner, pure parsers.

One :class:`BenchJob` is one llama-bench process: a configuration (:class:`xover.domain.config.LlamaConfig`)
and the tests to measure with it (``pp{n_prompt} @ dN`` and ``tg{n_gen} @ dN`` at each depth N). An
ik_llama.cpp configuration runs that engine's llama-bench, which has no ``-d``, no JSONL and no ``--progress``:
prefill from an empty context, decode at each depth through its ``-gp DEPTH,TG`` test, one JSON array read test by
test (:class:`IkJsonRecords`) and put in mainline's terms (:func:`normalize_ik_record`).
:func:`run` starts it with ``-o jsonl -oe md --progress`` and yields events as lines arrive:

* stdout carries one JSON object per finished test (flushed by llama-bench) -> :class:`RecordLine`;
* stderr carries ``llama-bench: benchmark i/N: <phase>`` lines -> :class:`ProgressLine`, llama-bench's
  own markdown table (``-oe md``, kept so xover's rendering can be checked against it), and errors;
* the end of the process -> :class:`Exited` (exit code, timeout, stderr tail).

The I/O loop only splits the two pipes into lines; :func:`classify` turns a line into an event and
is tested on lines recorded from the real binary.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import re
import selectors
import subprocess
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from pathlib import Path
from typing import Any

from xover.domain import llama_options
from xover.domain.config import LlamaConfig
from xover.domain.records import BenchResult
from xover.errors import XoverError
from xover.llamacpp import memory, process

# A test point: (n_prompt, n_gen, n_depth), exactly as llama-bench reports it.
Point = tuple[int, int, int]

# llama-bench flags that xover sets itself, and what to use instead.
_OWN_FLAGS: dict[str, str] = {
    "-m": "-m/--model",
    "--model": "-m/--model",
    "-p": "--pp",
    "--n-prompt": "--pp",
    "-n": "--tg",
    "--n-gen": "--tg",
    "-d": "--depth",
    "--n-depth": "--depth",
    "-r": "-r/--repetitions",
    "--repetitions": "-r/--repetitions",
    "-pg": "--pp and --tg (xover measures prefill and decode as separate tests at each depth)",
    "-o": "nothing: xover reads llama-bench's JSONL itself",
    "--output": "nothing: xover reads llama-bench's JSONL itself",
    "-oe": "nothing: xover keeps llama-bench's markdown itself",
    "--output-err": "nothing: xover keeps llama-bench's markdown itself",
    "--progress": "nothing: xover always follows llama-bench's progress",
    "-h": "`xover bench --help`",
    "--help": "`xover bench --help`",
    "--version": "`xover llama which`",
    "--list-devices": "llama-bench --list-devices directly",
}
RESERVED_FLAGS: dict[str, str] = {**_OWN_FLAGS, **{s: o.cli[-1] for o in llama_options.SWEPT for s in o.bench}}
"""llama-bench flags that may not follow `--`: those xover sets itself and those of the options it sweeps (the
option table's), each with the xover option to use instead."""

_PROGRESS = re.compile(r"^llama-bench: benchmark (\d+)/(\d+): (.+?)\s*$")
_PHASE = re.compile(r"^(depth|prompt|generation) run (\d+)/(\d+)( \(cached\))?$")
_REQUIRED = ("n_prompt", "n_gen", "n_depth", "samples_ns", "avg_ts", "stddev_ts")


def check_extra_args(args: Sequence[str]) -> None:
    """Refuse passthrough arguments that would collide with what xover sets or sweeps itself."""
    for arg in args:
        # llama-bench treats `--n_prompt` as `--n-prompt`.
        flag = "--" + arg[2:].replace("_", "-") if arg.startswith("--") else arg
        if flag in RESERVED_FLAGS:
            raise XoverError(
                f"{arg} after `--` conflicts with what xover passes llama-bench: use {RESERVED_FLAGS[flag]} instead"
            )


@dataclasses.dataclass(frozen=True)
class BenchJob:
    """One llama-bench process: a configuration and the tests to run with it.

    ``n_prompt == 0`` leaves out the prefill tests, ``n_gen == 0`` the decode tests; every depth gets
    both kinds, as llama-bench's cartesian product does. ``verbose`` adds ``-v``: llama.cpp's own log,
    whose buffer sizes :func:`run` keeps (:attr:`Exited.buffer_lines`).
    """

    config: LlamaConfig
    n_prompt: int
    n_gen: int
    depths: tuple[int, ...]
    repetitions: int
    verbose: bool = False

    @property
    def ik(self) -> bool:
        """ik_llama.cpp's llama-bench: no ``-d``; decode at a depth is its ``-gp DEPTH,TG`` test, and prefill is
        measured from an empty context only."""
        return not llama_options.traits(self.config.engine).bench_depth

    def points(self) -> list[Point]:
        """The tests in llama-bench's own order: by depth, prefill before decode. ik_llama.cpp's llama-bench
        measures prefill at depth 0 only (it has no ``-d``), then decode at depth 0 and at each ``-gp`` depth."""
        out: list[Point] = []
        if self.ik:
            if self.n_prompt:
                out.append((self.n_prompt, 0, 0))
            return (
                out
                + [(0, self.n_gen, d) for d in self.depths if self.n_gen and d == 0]
                + [(0, self.n_gen, d) for d in self.depths if self.n_gen and d > 0]
            )
        for d in self.depths:
            if self.n_prompt:
                out.append((self.n_prompt, 0, d))
            if self.n_gen:
                out.append((0, self.n_gen, d))
        return out

    def _ik_argv(self, bench: Path, model: Path) -> list[str]:
        gen_at_zero = self.n_gen if 0 in self.depths else 0
        argv = [str(bench), "-m", str(model), "-p", str(self.n_prompt), "-n", str(gen_at_zero)]
        for d in (d for d in self.depths if d > 0 and self.n_gen):
            argv += ["-gp", f"{d},{self.n_gen}"]
        argv += ["-r", str(self.repetitions), *self.config.bench_argv()]
        return argv + (["-v"] if self.verbose else []) + ["-o", "json", "-oe", "md"]

    def to_argv(self, bench: Path, model: Path) -> list[str]:
        if self.ik:
            return self._ik_argv(bench, model)
        argv = [
            str(bench),
            "-m",
            str(model),
            "-p",
            str(self.n_prompt),
            "-n",
            str(self.n_gen),
            "-d",
            ",".join(str(d) for d in self.depths),
            "-r",
            str(self.repetitions),
        ]
        argv += self.config.bench_argv()
        return argv + (["-v"] if self.verbose else []) + ["-o", "jsonl", "-oe", "md", "--progress"]


@dataclasses.dataclass(frozen=True)
class Plan:
    """A sweep's plan: the llama-bench processes still to run, and the configurations already measured."""

    jobs: tuple[BenchJob, ...]  # what still needs measuring, one llama-bench process each
    skipped: tuple[LlamaConfig, ...]  # every test already in the store

    @property
    def total_tests(self) -> int:
        return sum(len(j.points()) for j in self.jobs)


# ---- events ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ProgressLine:
    """``llama-bench: benchmark 3/8: prompt run 2/5``: test 3 of 8, phase ``prompt``, repetition 2 of 5."""

    test_index: int  # 1-based
    test_count: int
    phase: str  # starting, warmup prompt, warmup generation, depth, prompt, generation
    rep: int | None = None
    reps: int | None = None
    cached: bool = False  # depth run restored from the saved KV state, not recomputed


@dataclasses.dataclass(frozen=True)
class RecordLine:
    """One finished test: llama-bench's JSONL object, untouched."""

    record: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class MarkdownLine:
    """A line of llama-bench's own markdown table (``-oe md``)."""

    text: str


@dataclasses.dataclass(frozen=True)
class OtherLine:
    """Anything else: log or error output."""

    stream: str  # "stdout" or "stderr"
    text: str


@dataclasses.dataclass(frozen=True)
class Exited:
    """The process is gone. ``returncode`` < 0 means killed by that signal (a crash, the OOM killer)."""

    returncode: int | None
    timed_out: bool
    duration_ns: int
    stderr_tail: str
    markdown: str  # llama-bench's own table for this process, as it printed it
    peak_rss_bytes: int | None = None  # VmHWM, last read while it ran
    buffer_lines: tuple[str, ...] = ()  # llama.cpp's "... buffer size = N MiB" lines (with -v)
    resolved: tuple[tuple[str, str], ...] = ()  # record field -> what an ``auto`` resolved to (with -v)
    aborted: str | None = None  # ggml's abort line, where the process printed one and then hung (stopped by xover)


Line = ProgressLine | RecordLine | MarkdownLine | OtherLine
BenchEvent = ProgressLine | RecordLine | Exited


# ---- pure parsing ---------------------------------------------------------------------------------


def parse_progress(text: str) -> ProgressLine | None:
    m = _PROGRESS.match(text)
    if m is None:
        return None
    index, count, phase = int(m.group(1)), int(m.group(2)), m.group(3)
    p = _PHASE.match(phase)
    if p is None:
        # "starting", "warmup prompt run", "warmup generation run"
        return ProgressLine(index, count, phase.removesuffix(" run"))
    return ProgressLine(index, count, p.group(1), int(p.group(2)), int(p.group(3)), cached=bool(p.group(4)))


def parse_record(text: str, required: Sequence[str] = _REQUIRED) -> dict[str, Any] | None:
    """A JSONL test record, or None when the line is not one (usage text, a truncated line)."""
    if not text.startswith("{"):
        return None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or any(k not in obj for k in required) or not isinstance(obj["samples_ns"], list):
        return None
    return obj


# With -v, llama.cpp logs what its flash attention ``auto`` resolved to when it made a context: "resolve_fused_ops:
# Flash Attention enabled", or "... Flash Attention not supported, set to disabled" (a layer whose attention would
# run on another device than the layer). llama-bench's record keeps -1 (auto) either way.
_FA_RESOLVED = re.compile(r"Flash Attention (enabled|not supported, set to disabled)\s*$")


def resolved_setting(text: str) -> tuple[str, str] | None:
    """A log line's word on what an ``auto`` ran as, in the record's terms (``("flash_attn", "1")``), or None."""
    m = _FA_RESOLVED.search(text)
    if m is None:
        return None
    field = llama_options.FLASH_ATTN.record_field
    assert field is not None
    return field, str(llama_options.FLASH_ATTN.record_value("on" if m.group(1) == "enabled" else "off"))


_IK_GP = re.compile(r"^tg(\d+)@pp(\d+)$")


def normalize_ik_record(record: dict[str, Any]) -> dict[str, Any]:
    """An ik_llama.cpp llama-bench JSON test in mainline's JSONL terms: ``n_depth`` (its ``tg{T}@pp{D}`` test is
    decode at depth D, timed without the prompt: n_prompt 0), and ``backends`` from its backend flags. The engine's
    own fields are kept."""
    out = dict(record)
    m = _IK_GP.match(str(record.get("test", "")))
    if m is not None:
        out["n_prompt"], out["n_depth"] = 0, int(m.group(2))
    else:
        out.setdefault("n_depth", 0)
    if "backends" not in out:
        names = [
            ggml  # as mainline's llama-bench names them
            for n, ggml in (
                ("cuda", "CUDA"),
                ("vulkan", "Vulkan"),
                ("metal", "MTL"),
                ("sycl", "SYCL"),
                ("kompute", "Kompute"),
                ("rpc", "RPC"),
            )
            if record.get(n) not in (None, False, 0, "0", "")
        ]
        out["backends"] = ",".join([*names, "CPU"] if not names else names)
    out.setdefault("engine", llama_options.IK_LLAMA)
    return out


class IkJsonRecords:
    """ik_llama.cpp's llama-bench writes one JSON array (``-o json``), each test an indented object it flushes as
    the test ends. :meth:`feed` takes stdout lines and returns a test's record (normalised) when its object
    closes."""

    def __init__(self) -> None:
        self._lines: list[str] | None = None

    def feed(self, text: str) -> dict[str, Any] | None:
        stripped = text.strip()
        if stripped == "{":
            self._lines = ["{"]
            return None
        if self._lines is None:
            return None
        if stripped in ("}", "},"):
            self._lines.append("}")
            body, self._lines = " ".join(self._lines), None
            record = parse_record(body, required=_REQUIRED_IK)
            return normalize_ik_record(record) if record is not None else None
        self._lines.append(text)
        return None


_REQUIRED_IK = ("n_prompt", "n_gen", "samples_ns", "avg_ts", "stddev_ts", "test")


def classify(stream: str, text: str) -> Line:
    if stream == "stdout":
        record = parse_record(text)
        return RecordLine(record) if record is not None else OtherLine(stream, text)
    progress = parse_progress(text)
    if progress is not None:
        return progress
    if text.startswith("|") or text.startswith("build: "):
        return MarkdownLine(text)
    return OtherLine(stream, text)


def result_from_record(config_key: str, record: dict[str, Any]) -> BenchResult:
    """A stored result from a JSONL record.

    ``samples_ts`` is recomputed from the integer ``samples_ns`` exactly as llama-bench does
    (tokens * 1e9 / ns): its printed ``samples_ts`` keeps only six significant digits.
    """
    n_prompt, n_gen, n_depth = int(record["n_prompt"]), int(record["n_gen"]), int(record["n_depth"])
    samples_ns = tuple(int(x) for x in record["samples_ns"])
    n_tokens = n_prompt + n_gen
    return BenchResult(
        config_key=config_key,
        n_prompt=n_prompt,
        n_gen=n_gen,
        n_depth=n_depth,
        samples_ns=samples_ns,
        samples_ts=tuple(1e9 * n_tokens / ns for ns in samples_ns),
        avg_ts=float(record["avg_ts"]),
        stddev_ts=float(record["stddev_ts"]),
        record=record,
    )


_DEVICE_LINE = re.compile(r"^\s+(?P<name>[A-Za-z][\w-]*\d+): (?P<desc>.*?)(?: \(\d+ MiB, \d+ MiB free\))?\s*$")


def list_devices(
    bench: Path, env: Sequence[tuple[str, str]] = (), timeout_s: float = 60.0
) -> tuple[tuple[str, str], ...] | None:
    """The devices a build's llama-bench sees with ``env`` (``llama-bench --list-devices``), as (name, description):
    ``("Vulkan0", "NVIDIA H200")``; none where it sees none (``(none)``); None where it cannot say (an engine's
    llama-bench without the flag)."""
    code, out, _ = process.run_short([str(bench), "--list-devices"], timeout_s, dict(env))
    if code != 0 or "Available devices" not in out:
        return None
    found = (_DEVICE_LINE.match(line) for line in out.splitlines())
    return tuple((m.group("name"), m.group("desc")) for m in found if m is not None)


def record_mismatch(config: LlamaConfig, record: dict[str, Any], backend: str | None = None) -> str | None:
    """Why a record cannot belong to ``config`` (a value the option table has llama-bench echo differs, or it did
    not run on ``backend``, the backend of the build that ran it: :func:`llama_options.backend_problem`), or None
    when it matches."""
    ran_on = llama_options.ran_on_bench(str(record.get("backends", "")), str(record.get("gpu_info", "")))
    problem = llama_options.backend_problem(backend, ran_on, "llama-bench")
    if problem is not None:
        return problem
    for name, value in config.settings:
        option = llama_options.BY_NAME[name].for_engine(config.engine)
        key = option.record_field
        if not option.checked or key is None or key not in record:
            continue
        expected = option.record_value(value)
        if expected is not None and int(record[key]) != expected:
            flag = " ".join(option.bench_args(value)) or f"{name}={value}"
            return f"llama-bench reported {key}={record[key]} for a configuration with {flag}"
    return None


# ---- the process ----------------------------------------------------------------------------------


def _raw_lines(proc: subprocess.Popen[bytes], deadline_ns: Callable[[], int | None]) -> Iterator[tuple[str, str]]:
    """(stream, line) as each full line arrives on stdout or stderr, until both close.

    Raises TimeoutError when ``deadline_ns()`` (a perf_counter_ns value, asked again after each line) passes first.
    """
    assert proc.stdout is not None and proc.stderr is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, "stdout")
    sel.register(proc.stderr, selectors.EVENT_READ, "stderr")
    buffers = {"stdout": b"", "stderr": b""}
    try:
        while sel.get_map():
            deadline = deadline_ns()
            timeout = None if deadline is None else (deadline - time.perf_counter_ns()) / 1e9
            if timeout is not None and timeout <= 0:
                raise TimeoutError
            ready = sel.select(timeout)
            for key, _ in ready:
                stream = key.data
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    sel.unregister(key.fileobj)
                    if buffers[stream]:
                        yield stream, buffers[stream].decode(errors="replace").rstrip("\r")
                    continue
                buffers[stream] += chunk
                *complete, buffers[stream] = buffers[stream].split(b"\n")
                for raw in complete:
                    yield stream, raw.decode(errors="replace").rstrip("\r")
    finally:
        sel.close()


def run(job: BenchJob, bench: Path, model: Path, timeout_s: float | None = None) -> Generator[BenchEvent, None, None]:
    """Run one llama-bench process and yield its progress and records as they arrive, then :class:`Exited`.

    The child runs in its own session; closing the generator (or an exception, Ctrl-C included)
    stops it with SIGTERM then SIGKILL before the generator returns.
    """
    process.ready_to_start()  # under a VRAM budget: the previous llama process's memory is back first
    start = time.perf_counter_ns()
    deadline = None if timeout_s is None else start + int(timeout_s * 1e9)
    try:
        proc = process.spawn(
            job.to_argv(bench, model),
            env=dict(job.config.environment()),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=False,
            die_with_parent=True,
        )
    except OSError as e:
        raise XoverError(
            f"cannot start {bench} ({e.strerror}): point --llama-bin-dir at a working llama.cpp build"
        ) from None
    tail: collections.deque[str] = collections.deque(maxlen=30)
    markdown: list[str] = []
    buffers: list[str] = []
    resolved: dict[str, str] = {}
    peak_rss: int | None = None
    timed_out = False
    abort: tuple[str, int] | None = None  # ggml's abort line, and the time it has to exit by
    hung = False
    recent: collections.deque[str] = collections.deque(maxlen=5)  # the last stderr lines: an abort's cause

    def until() -> int | None:
        ends = [d for d in (deadline, abort[1] if abort else None) if d is not None]
        return min(ends) if ends else None

    ik = IkJsonRecords() if job.ik else None
    try:
        try:
            for stream, text in _raw_lines(proc, until):
                if stream == "stderr":  # every line, whatever it is classified as below
                    recent.append(text)
                    if abort is None and process.fatal_line(text):
                        why = process.abort_message(list(recent)) or text.strip()
                        abort = (why, time.perf_counter_ns() + int(process.ABORT_GRACE_S * 1e9))
                if ik is not None and stream == "stdout":
                    record = ik.feed(text)
                    line: Line = RecordLine(record) if record is not None else OtherLine(stream, text)
                else:
                    line = classify(stream, text)
                if isinstance(line, (ProgressLine, RecordLine)):
                    peak_rss = memory.peak_rss_bytes(proc.pid) or peak_rss  # VmHWM only grows
                    yield line
                elif isinstance(line, MarkdownLine):
                    markdown.append(line.text)
                elif stream == "stderr" and "buffer size" in text:
                    buffers.append(text)
                elif stream == "stderr" and (found := resolved_setting(text)) is not None:
                    resolved.setdefault(*found)
                elif stream == "stderr" and text.strip():
                    tail.append(text)
            proc.wait(timeout=10)  # both pipes closed: the process is exiting; collect its real code
        except TimeoutError:
            hung = abort is not None  # an abort that hangs is stopped below, not timed out
            timed_out = not hung
        except subprocess.TimeoutExpired:
            pass  # closed its output but lingers: stop() below ends it
    finally:
        code = process.stop(proc)
    yield Exited(
        returncode=code,
        timed_out=timed_out,
        duration_ns=time.perf_counter_ns() - start,
        stderr_tail="\n".join(tail),
        markdown="\n".join(markdown),
        peak_rss_bytes=peak_rss,
        buffer_lines=tuple(buffers),
        resolved=tuple(resolved.items()),
        aborted=abort[0] if hung and abort else None,
    )
