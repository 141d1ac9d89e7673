"""Plan and run a llama-bench sweep across offload configurations, storing every test as it finishes.

A configuration is one combination of the swept knobs (``--ncmoe`` x ``--load-mode`` x ``--batch`` x
``--ubatch`` x ``--flash-attn`` x ``--no-op-offload`` x ``--threads`` x each ``--env``), kept in
llama-bench's own flag names. Each configuration is one llama-bench process measuring ``pp{P} @ dN``
and ``tg{G} @ dN`` at every depth, so a configuration that fails (does not fit, crashes, times out)
is isolated and stored as a failure while the sweep goes on, and resuming works per configuration.
Each process runs with ``-v`` so that its peak memory (the buffers llama.cpp logs, and VmHWM) is
stored beside its results (artifact ``memory``, :func:`memory_by_config`).

:func:`expand` and :func:`plan` are pure; :func:`run_sweep` does the I/O and reports progress as a
stream of events for the terminal UI.
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
import re
import signal
from collections.abc import Callable, Sequence
from contextlib import closing
from pathlib import Path
from typing import Any

from xover.domain.llama_options import (
    BATCH_SIZE,
    FLASH_ATTN,
    LOAD_MODE,
    LOAD_MODES,
    N_CPU_MOE,
    NO_OP_OFFLOAD,
    THREADS,
    UBATCH_SIZE,
)
from xover.domain.records import BenchConfig, Failure, short_labels
from xover.errors import XoverError
from xover.llamacpp import bench, memory
from xover.llamacpp.bench import BenchJob, Exited, Point, ProgressLine, RecordLine
from xover.llamacpp.binaries import Binaries
from xover.measure.events import ConfigStarted, Progressed, ResultStored, SweepEvent, SweepPlanned
from xover.measure.provenance import model_id
from xover.measure.recorder import Recording
from xover.results.store import Store

FLASH_ATTN_CHOICES = FLASH_ATTN.choices
MD_ARTIFACT = "llama-bench-md"  # llama-bench's own markdown for a configuration's tests (-oe md)

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


# ---- option parsing (pure) ------------------------------------------------------------------------


def _dedupe(values: Sequence[Any]) -> tuple[Any, ...]:
    return tuple(dict.fromkeys(values))


def parse_int_list(option: str, text: str, minimum: int = 0) -> tuple[int, ...]:
    """``"12,18"`` -> ``(12, 18)``; a one-line error naming the option otherwise."""
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise XoverError(f"{option} {text!r} is not a comma-separated list of integers (e.g. {option} 12,18)") from None
    low = [v for v in values if v < minimum]
    if low:
        raise XoverError(f"{option} {text!r}: values must be at least {minimum}")
    return _dedupe(values)


def parse_choice_list(option: str, text: str, choices: Sequence[str]) -> tuple[str, ...]:
    values = [v.strip() for v in text.split(",")]
    bad = [v for v in values if v not in choices]
    if bad:
        raise XoverError(
            f"{option} {text!r}: {bad[0]!r} is not one of {', '.join(choices)} (e.g. {option} {','.join(choices[:2])})"
        )
    return _dedupe(values)


def parse_env(text: str) -> tuple[str, tuple[str, ...]]:
    """``"GGML_OP_OFFLOAD_MIN_BATCH=32,4096"`` -> the variable and the values to sweep."""
    name, sep, values = text.partition("=")
    if not sep or not _ENV_NAME.match(name) or not values:
        raise XoverError(f"--env {text!r} is not NAME=VALUE[,VALUE...] (e.g. --env GGML_OP_OFFLOAD_MIN_BATCH=32,4096)")
    return name, _dedupe(values.split(","))


# ---- the sweep, planned (pure) --------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SweepSpec:
    """Everything a ``xover bench`` sweep measures. Empty knob tuples leave llama-bench's default."""

    model: Path
    depths: tuple[int, ...]
    n_prompt: int = 512
    n_gen: int = 128
    repetitions: int = 5
    ncmoe: tuple[int, ...] = ()
    load_mode: tuple[str, ...] = ()
    batch: tuple[int, ...] = ()
    ubatch: tuple[int, ...] = ()
    flash_attn: tuple[str, ...] = ()
    no_op_offload: tuple[int, ...] = ()
    threads: tuple[int, ...] = ()
    env: tuple[tuple[str, tuple[str, ...]], ...] = ()
    extra_args: tuple[str, ...] = ()
    timeout_s: float | None = None

    def __post_init__(self) -> None:
        if not self.depths or any(d < 0 for d in self.depths):
            raise XoverError("--depth needs one or more integers >= 0 (e.g. --depth 1000,4000,16000,32000)")
        if self.n_prompt < 0 or self.n_gen < 0 or (self.n_prompt == 0 and self.n_gen == 0):
            raise XoverError("--pp and --tg must be >= 0 and not both 0 (e.g. --pp 512 --tg 128)")
        if self.repetitions < 1:
            raise XoverError("-r must be at least 1 (llama-bench's default is 5)")
        if any(v < 0 for v in self.ncmoe) or any(v < 1 for v in self.ubatch + self.batch + self.threads):
            raise XoverError("--ncmoe must be >= 0, --batch, --ubatch and --threads >= 1")
        if any(v not in LOAD_MODES for v in self.load_mode):
            raise XoverError(f"--load-mode takes {', '.join(LOAD_MODES)} (e.g. --load-mode none,mmap)")
        if any(v not in (0, 1) for v in self.no_op_offload):
            raise XoverError("--no-op-offload takes 0 and/or 1 (e.g. --no-op-offload 0,1)")
        if any(v not in FLASH_ATTN_CHOICES for v in self.flash_attn):
            raise XoverError(f"--flash-attn takes {', '.join(FLASH_ATTN_CHOICES)} (e.g. --flash-attn on,off)")
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise XoverError("--timeout must be a positive number of seconds")
        names = [name for name, _ in self.env]
        if len(set(names)) != len(names):
            raise XoverError("--env names a variable twice: give all its values in one --env NAME=V1,V2")
        bench.check_extra_args(self.extra_args)


def expand(spec: SweepSpec) -> list[BenchConfig]:
    """Every configuration of the sweep, in a stable order (ncmoe slowest, env fastest): :func:`combinations`
    of the spec's knob fields, which carry its parameters' names."""
    return combinations(**{name: getattr(spec, name) for name in inspect.signature(combinations).parameters})


def combinations(
    *,
    ncmoe: Sequence[int] = (),
    load_mode: Sequence[str] = (),
    batch: Sequence[int] = (),
    ubatch: Sequence[int] = (),
    flash_attn: Sequence[str] = (),
    no_op_offload: Sequence[int] = (),
    threads: Sequence[int] = (),
    env: Sequence[tuple[str, Sequence[str]]] = (),
    extra_args: tuple[str, ...] = (),
) -> list[BenchConfig]:
    """The cartesian product of knob values as llama-bench configurations labelled by what differs
    (``xover bench`` and ``xover ttft`` name their configurations alike). An empty knob is left out."""
    dims: list[list[tuple[str, str]]] = []
    for option, values in (
        (N_CPU_MOE, ncmoe),
        (LOAD_MODE, load_mode),
        (BATCH_SIZE, batch),
        (UBATCH_SIZE, ubatch),
        (FLASH_ATTN, flash_attn),
        (NO_OP_OFFLOAD, no_op_offload),
        (THREADS, threads),
    ):
        if values:
            dims.append([(option.bench[0], str(v)) for v in values])
    env_dims = [[(name, v) for v in values] for name, values in env]
    n_fields = len(dims)
    configs = []
    for combo in itertools.product(*dims, *env_dims):
        configs.append(
            BenchConfig(label="", fields=tuple(combo[:n_fields]), env=tuple(combo[n_fields:]), extra_args=extra_args)
        )
    return [dataclasses.replace(c, label=label) for c, label in zip(configs, short_labels(configs))]


@dataclasses.dataclass(frozen=True)
class Plan:
    jobs: tuple[BenchJob, ...]  # what still needs measuring, one llama-bench process each
    skipped: tuple[BenchConfig, ...]  # every test already in the store

    @property
    def total_tests(self) -> int:
        return sum(len(j.points()) for j in self.jobs)


def plan(spec: SweepSpec, configs: Sequence[BenchConfig], measured: Callable[[BenchConfig, Point], bool]) -> Plan:
    """Jobs for the tests not yet measured, and nothing else. llama-bench runs the cartesian product
    of its -p/-n and -d lists, so depths that miss the same test kinds share one job; a depth that
    misses only its tg test gets a job without -p (and the other way round)."""
    jobs, skipped = [], []
    for config in configs:
        full = BenchJob(config, spec.n_prompt, spec.n_gen, spec.depths, spec.repetitions, verbose=True)
        missing = [p for p in full.points() if not measured(config, p)]
        if not missing:
            skipped.append(config)
            continue
        kinds_at: dict[int, tuple[bool, bool]] = {}
        for d in spec.depths:
            at = [p for p in missing if p[2] == d]
            if at:
                kinds_at[d] = (any(p[0] for p in at), any(p[1] for p in at))
        for kinds in dict.fromkeys(kinds_at.values()):  # first-seen order: shallow depths first
            depths = tuple(d for d, k in kinds_at.items() if k == kinds)
            n_prompt = spec.n_prompt if kinds[0] else 0
            n_gen = spec.n_gen if kinds[1] else 0
            jobs.append(BenchJob(config, n_prompt, n_gen, depths, spec.repetitions, verbose=True))
    return Plan(tuple(jobs), tuple(skipped))


def exit_problem(exited: Exited, measured: int, expected: int, timeout_s: float | None) -> str | None:
    """Why a llama-bench process counts as failed, or None when it measured everything."""
    done = f"after {measured} of {expected} tests"
    lines = exited.stderr_tail.splitlines()
    errors = [
        ln
        for ln in lines
        if re.search(r"error|fail|abort|assert|out of memory|unknown argument", ln, re.I)
        and "set_abort_callback" not in ln
    ]  # a -v log line, not an error
    detail = f": {(errors or lines)[-1].strip()}" if lines else ""
    if exited.timed_out:
        return f"timed out {done} (--timeout {timeout_s:g} s; raise it for long depths)"
    if exited.returncode is not None and exited.returncode < 0:
        try:
            name = signal.Signals(-exited.returncode).name
        except ValueError:
            name = f"signal {-exited.returncode}"
        # a crash leaves whatever llama-bench was logging last: only an error line says anything
        return f"llama-bench was killed by {name} {done}" + (f": {errors[-1].strip()}" if errors else "")
    if exited.returncode:
        return f"llama-bench exited with code {exited.returncode} {done}{detail}"
    if measured < expected:
        return f"llama-bench exited normally {done}{detail}"
    return None


def describe_job(job: BenchJob) -> str:
    tests = ",".join(f"{k}{n}" for k, n in (("pp", job.n_prompt), ("tg", job.n_gen)) if n)
    return f"{job.config.label}: {tests} @ d{','.join(str(d) for d in job.depths)} x{job.repetitions}"


@dataclasses.dataclass(frozen=True)
class SweepOutcome:
    study_dir: Path
    store_path: Path
    configs: tuple[BenchConfig, ...]
    skipped: tuple[BenchConfig, ...]
    stored: int  # tests stored by this run
    failures: tuple[Failure, ...]
    run_id: int | None  # None when nothing needed measuring


# ---- the sweep, run -------------------------------------------------------------------------------


def _within_job(line: ProgressLine) -> float:
    """Tests finished inside one llama-bench process, from its progress line."""
    if line.rep is None or not line.reps:
        return float(line.test_index - 1)
    return line.test_index - 1 + (line.rep - 1) / line.reps


def run_sweep(
    spec: SweepSpec,
    binaries: Binaries,
    study_dir: Path,
    *,
    fresh: bool = False,
    command: Sequence[str] = (),
    on_event: Callable[[SweepEvent], None] = lambda e: None,
    configs: Sequence[BenchConfig] | None = None,
) -> SweepOutcome:
    """Measure every configuration of ``spec`` not yet in ``study_dir``'s store (all with ``fresh``).

    Each test is stored the moment llama-bench prints its record. A configuration that fails is
    stored as a failure and the sweep moves on; Ctrl-C stops llama-bench, marks the run
    interrupted and re-raises :class:`KeyboardInterrupt`. ``configs`` replaces the cartesian
    expansion of the spec's knob lists with named configurations (a study's).
    """
    if not spec.model.is_file():
        raise XoverError(f"model {spec.model} does not exist: pass -m PATH to a .gguf file")
    from xover.gguf.inspect import check_offload_and_context

    check_offload_and_context(spec.model, spec.ncmoe, max(spec.depths) + spec.n_prompt + spec.n_gen)
    model_key = model_id(spec.model).key
    configs = list(configs) if configs is not None else expand(spec)
    with Store(study_dir) as store:

        def measured(config: BenchConfig, p: Point) -> bool:
            return not fresh and store.has_bench_point(config.key, model_key, *p)

        the_plan = plan(spec, configs, measured)
        on_event(SweepPlanned(the_plan, study_dir))
        # begun at the first thing to store, so that provenance carries the build llama-bench reports in its first
        # record; never written when nothing needs measuring
        run = Recording(store, "bench", command, binaries=binaries, model=spec.model, always=False, on_event=on_event)
        stored, done_tests = 0, 0
        with run:  # ends the run: interrupted, failed or done (xover.measure.recorder)
            for index, job in enumerate(the_plan.jobs):
                on_event(ConfigStarted(job, index, len(the_plan.jobs)))
                store.put_config(job.config)
                n_stored, failure = _run_job(
                    job, spec, binaries, store, run, model_key, done_tests, the_plan.total_tests, on_event
                )
                stored += n_stored
                done_tests += len(job.points())
                on_event(Progressed(done_tests, the_plan.total_tests))
                if failure is not None:
                    run.fail(job.config, failure)
        return SweepOutcome(
            study_dir=study_dir,
            store_path=store.path,
            configs=tuple(configs),
            skipped=the_plan.skipped,
            stored=stored,
            failures=tuple(run.failures),
            run_id=run.run_id,
        )


def _run_job(
    job: BenchJob,
    spec: SweepSpec,
    binaries: Binaries,
    store: Store,
    run: Recording,
    model_key: str,
    done_before: int,
    total: int,
    on_event: Callable[[SweepEvent], None],
) -> tuple[int, Failure | None]:
    """One llama-bench process: store its records as they come; return (tests stored, failure or None)."""
    expected = job.points()
    seen: set[Point] = set()
    problem: str | None = None
    exited: Exited | None = None
    with closing(bench.run(job, binaries.bench, spec.model, spec.timeout_s)) as events:
        for event in events:
            if isinstance(event, ProgressLine):
                on_event(Progressed(done_before + max(_within_job(event), len(seen)), total))
            elif isinstance(event, RecordLine):
                result = bench.result_from_record(job.config.key, event.record)
                point = (result.n_prompt, result.n_gen, result.n_depth)
                problem = bench.record_mismatch(job.config, event.record)
                if problem is None and (point not in expected or point in seen):
                    problem = (
                        f"llama-bench measured {result.test_name}, which this configuration did not ask for or already "
                        "measured: an argument after `--` sweeps a value (e.g. -b 256,512); sweep with xover's options"
                    )
                if problem is not None:
                    break  # closing() stops llama-bench
                store.add_bench_result(run.ensure(event.record), model_key, result)
                seen.add(point)
                on_event(ResultStored(job.config, result))
                on_event(Progressed(done_before + len(seen), total))
            else:
                exited = event
    if exited is not None:
        if seen and exited.markdown:
            run.artifact(MD_ARTIFACT, {"config_key": job.config.key, "markdown": exited.markdown})
        use = memory.MemoryUse(exited.peak_rss_bytes, memory.parse_buffer_lines(exited.buffer_lines))
        if seen and (use.peak_rss_bytes is not None or use.buffers):
            run.artifact(
                memory.ARTIFACT,
                {"config_key": job.config.key, "label": job.config.label, "source": "llama-bench", **use.to_dict()},
            )
        problem = problem or exit_problem(exited, len(seen), len(expected), spec.timeout_s)
    if problem is None:
        return len(seen), None
    tail = exited.stderr_tail if exited is not None else ""
    return len(seen), Failure(
        config_key=job.config.key, stage="bench", point=describe_job(job), reason=problem, stderr_tail=tail
    )


def memory_by_config(store: Store, source: str = "llama-bench") -> dict[str, memory.MemoryUse]:
    """The latest peak memory stored for each configuration key by ``source`` (llama-bench or llama-server)."""
    return {
        body["config_key"]: memory.MemoryUse.from_dict(body)
        for _, _, body in store.artifacts(memory.ARTIFACT)
        if body.get("source") == source
    }


def describe_memory(use: memory.MemoryUse) -> str:
    """``peak RSS 812 MiB; buffers: CUDA0 model 9.1 GiB, CUDA0 compute 342 MiB, ...`` in one line."""

    def size(n: int) -> str:
        return f"{n / (1 << 30):.1f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MiB"

    parts = [f"peak RSS {size(use.peak_rss_bytes)}" if use.peak_rss_bytes is not None else "peak RSS unknown"]
    if use.buffers:
        parts.append("buffers: " + ", ".join(f"{dev} {kind} {size(b)}" for dev, kind, b in use.buffers if b))
    return "; ".join(parts)
