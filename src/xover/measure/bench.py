"""Plan and run a llama-bench sweep across configurations, storing every test as it finishes.

A sweep is a list of configurations (:class:`xover.domain.config.LlamaConfig`: a study's, or the cartesian product
of the values ``xover bench`` was given for the option table's swept options, :func:`xover.domain.config.matrix`)
and the tests each runs (:class:`BenchTests`). Each configuration is one llama-bench process measuring ``pp{P} @ dN``
and ``tg{G} @ dN`` at every depth, so a configuration that fails (does not fit, crashes, times out) is isolated and
stored as a failure while the sweep goes on, and resuming works per configuration. Each process runs with ``-v`` so
that its peak memory (the buffers llama.cpp logs, and VmHWM) is stored beside its results (artifact ``memory``,
:func:`memory_by_config`).

:func:`plan` is pure; :func:`run_sweep` does the I/O and reports progress as a stream of events for the terminal UI.
"""

from __future__ import annotations

import dataclasses
import os
import re
import signal
from collections.abc import Callable, Sequence
from contextlib import closing
from pathlib import Path
from typing import TYPE_CHECKING

from xover.domain import llama_options
from xover.domain.config import LlamaConfig, command_configs
from xover.domain.llama_options import LlamaOption
from xover.domain.records import INTERRUPTED, Failure, failure_round, interrupted
from xover.errors import XoverError
from xover.gguf.inspect import check_offload_and_context
from xover.hardware.vram import holding
from xover.llamacpp import bench, memory, process
from xover.llamacpp.bench import BenchJob, Exited, Plan, Point, ProgressLine, RecordLine
from xover.llamacpp.binaries import Binaries, resolve
from xover.measure.events import ConfigStarted, Note, Progressed, ResultStored, Retrying, SweepEvent, SweepPlanned
from xover.measure.provenance import machine_load, model_id
from xover.measure.recorder import Recording
from xover.results.read_model import bench_data, load
from xover.results.store import STORE_NAME, Store

if TYPE_CHECKING:
    from xover.results.read_model import BenchData

MD_ARTIFACT = "llama-bench-md"  # llama-bench's own markdown for a configuration's tests (-oe md)
RESOLVED_ARTIFACT = "llama-bench-resolved"  # {config_key, fields: {record field: value}}: what an ``auto`` ran as
RETRIED_ARTIFACT = "llama-bench-retried"  # {config_key, point, reason}: a process killed by a signal xover did not send


@dataclasses.dataclass(frozen=True)
class BenchTests:
    """The llama-bench tests every configuration of a sweep runs: ``pp{n_prompt} @ dN`` and ``tg{n_gen} @ dN`` at
    each depth N, ``repetitions`` times, on ``model``; a configuration running longer than ``timeout_s`` is stopped
    and stored as failed. ``round``: the round of fresh processes the sweep is (its results are stored with it and
    resumed by it; see :data:`xover.domain.records.ROUND_DOC`), None outside rounds."""

    model: Path
    depths: tuple[int, ...]
    n_prompt: int = 512
    n_gen: int = 128
    repetitions: int = 5
    timeout_s: float | None = None
    round: int | None = None

    def __post_init__(self) -> None:
        if not self.depths or any(d < 0 for d in self.depths):
            raise XoverError("--depth needs one or more integers >= 0 (e.g. --depth 1000,4000,16000,32000)")
        if self.n_prompt < 0 or self.n_gen < 0 or (self.n_prompt == 0 and self.n_gen == 0):
            raise XoverError("--pp and --tg must be >= 0 and not both 0 (e.g. --pp 512 --tg 128)")
        if self.repetitions < 1:
            raise XoverError("-r must be at least 1 (llama-bench's default is 5)")
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise XoverError("--timeout must be a positive number of seconds")


def sweep_configs(
    sweeps: Sequence[tuple[LlamaOption, Sequence[str]]],
    env: Sequence[tuple[str, Sequence[str]]] = (),
    bench_args: Sequence[str] = (),
) -> list[LlamaConfig]:
    """``xover bench``'s configurations: every combination of the swept values (:func:`xover.domain.config.matrix`),
    with the arguments given after ``--``: those the option table knows become settings of every configuration
    (``-ngl 99``), the rest are passed through; a flag xover sets or sweeps itself is refused."""
    bench.check_extra_args(bench_args)
    return command_configs(sweeps, env, bench_args, "bench")


def plan(spec: BenchTests, configs: Sequence[LlamaConfig], measured: Callable[[LlamaConfig, Point], bool]) -> Plan:
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
        for d in sorted({p[2] for p in missing}):  # an engine without -d measures prefill at depth 0 only
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
    if exited.aborted is not None:
        return f"llama-bench aborted {done} ({exited.aborted}) and hung: stopped after {process.ABORT_GRACE_S:g} s"
    if exited.timed_out:
        return f"timed out {done} (--timeout {timeout_s:g} s; raise it for long depths)"
    if exited.returncode is not None and exited.returncode < 0:
        try:
            name = signal.Signals(-exited.returncode).name
        except ValueError:
            name = f"signal {-exited.returncode}"
        # a crash leaves whatever llama-bench was logging last: only an error line says anything. xover's own stops
        # (a timeout, a hung abort, a record it refused) are told above or by the caller, and its Ctrl-C never reaches
        # llama-bench (a session of its own): this signal came from elsewhere
        return f"llama-bench was killed by {name} {done} ({INTERRUPTED})" + (
            f": {errors[-1].strip()}" if errors else ""
        )
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
    configs: tuple[LlamaConfig, ...]
    skipped: tuple[LlamaConfig, ...]
    stored: int  # tests stored by this run
    failures: tuple[Failure, ...]
    run_id: int | None  # None when nothing needed measuring

    @property
    def store_path(self) -> Path:
        return self.study_dir / STORE_NAME


# ---- the sweep, run -------------------------------------------------------------------------------


def _within_job(line: ProgressLine) -> float:
    """Tests finished inside one llama-bench process, from its progress line."""
    if line.rep is None or not line.reps:
        return float(line.test_index - 1)
    return line.test_index - 1 + (line.rep - 1) / line.reps


def run_sweep(
    spec: BenchTests,
    configs: Sequence[LlamaConfig],
    binaries: Binaries,
    study_dir: Path,
    *,
    fresh: bool = False,
    command: Sequence[str] = (),
    on_event: Callable[[SweepEvent], None] = lambda e: None,
) -> SweepOutcome:
    """Measure every test of ``configs`` not yet in ``study_dir``'s store (all with ``fresh``).

    Each test is stored the moment llama-bench prints its record. A process killed by a signal xover did not send is
    run again once, every test of it, in a fresh process (:func:`xover.domain.records.interrupted`); a configuration
    whose last process here was interrupted has every test measured again. A configuration that fails is
    stored as a failure and the sweep moves on; Ctrl-C stops llama-bench, marks the run
    interrupted and re-raises :class:`KeyboardInterrupt`.
    """
    if not spec.model.is_file():
        raise XoverError(f"model {spec.model} does not exist: pass -m PATH to a .gguf file")

    levels = tuple(dict.fromkeys(c.n_cpu_moe for c in configs if c.get("n-cpu-moe") is not None))
    check_offload_and_context(spec.model, levels, max(spec.depths) + spec.n_prompt + spec.n_gen)
    model_key = model_id(spec.model).key
    configs = list(configs)
    with Store(study_dir) as store:
        again = _interrupted_last(store, configs, model_key, spec.round)

        def measured(config: LlamaConfig, p: Point) -> bool:
            # a configuration whose last process here was interrupted runs every test again, in one fresh process
            return (
                not fresh
                and config.key not in again
                and store.has_bench_point(config.key, model_key, *p, round=spec.round)
            )

        the_plan = plan(spec, configs, measured)
        on_event(SweepPlanned(the_plan, study_dir))
        # begun at the first thing to store, so that provenance carries the build llama-bench reports in its first
        # record; never written when nothing needs measuring
        # the machine's load is sampled now, before llama-bench starts: a run's provenance is begun at its first
        # record, while llama-bench computes
        load = machine_load() if the_plan.jobs else None
        run = Recording(store, "bench", command, binaries=binaries, model=spec.model, always=False,
                        on_event=on_event, load=load)  # fmt: skip
        stored, done_tests = 0, 0
        with run:  # ends the run: interrupted, failed or done (xover.measure.recorder)
            for index, job in enumerate(the_plan.jobs):
                on_event(ConfigStarted(job, index, len(the_plan.jobs)))
                store.put_config(job.config)
                n_stored, failure = _run_job(
                    job, spec, binaries, store, run, model_key, done_tests, the_plan.total_tests, on_event
                )
                if failure is not None and interrupted(failure.reason):  # not a result: once more, every test
                    on_event(Retrying(job.config, failure.reason))
                    run.artifact(RETRIED_ARTIFACT, {"config_key": job.config.key, "point": failure.point,
                                                    "reason": failure.reason}, build=job.config.build)  # fmt: skip
                    more, failure = _run_job(
                        job, spec, binaries, store, run, model_key, done_tests, the_plan.total_tests, on_event
                    )
                    n_stored += more
                stored += n_stored
                done_tests += len(job.points())
                on_event(Progressed(done_tests, the_plan.total_tests))
                if failure is not None:
                    run.fail(job.config, failure)
        return SweepOutcome(
            study_dir=study_dir,
            configs=tuple(configs),
            skipped=the_plan.skipped,
            stored=stored,
            failures=tuple(run.failures),
            run_id=run.run_id,
        )


def screened_option(configs: Sequence[LlamaConfig]) -> str | None:
    """The one option whose values ``configs`` differ in, where one llama-bench process can run them all and its
    records tell them apart (llama-bench takes a repeated flag as more values, keeps the model loaded across values
    that leave the model's parameters alone, and echoes the option's record field); None where they differ in more
    than that, in anything else (environment, engine, pass-through arguments), or the option is not echoed."""
    first = configs[0]
    names = {n for c in configs for n, _ in c.settings}
    differ = [n for n in sorted(names) if len({c.get(n) for c in configs}) > 1]
    same = all(
        (c.engine, c.backend, c.env, c.bench_args, c.rpc_local) == (first.engine, first.backend, first.env,
                                                                     first.bench_args, first.rpc_local)
        for c in configs
    )  # fmt: skip
    if len(configs) < 2 or len(differ) != 1 or not same or any(c.get(differ[0]) is None for c in configs):
        return None
    option = llama_options.BY_NAME[differ[0]].for_engine(first.engine)
    return differ[0] if option.checked and option.record_field is not None and option.bench_args("1") else None


def screen_job(configs: Sequence[LlamaConfig], spec: BenchTests, verbose: bool = True) -> BenchJob:
    """One llama-bench process for ``configs`` (:func:`screened_option` names what they differ in): the first one's
    arguments without that option, then the option's flag once per value."""
    name = screened_option(configs)
    if name is None:
        raise XoverError("these configurations differ in more than one option llama-bench can sweep in one process")
    values = [c.get(name) for c in configs]
    option = llama_options.BY_NAME[name].for_engine(configs[0].engine)
    flags = tuple(a for v in values if v is not None for a in option.bench_args(v))
    base = configs[0].with_values({name: None}, name=f"{configs[0].name} [{name}: {', '.join(map(str, values))}]")
    screen = dataclasses.replace(base, bench_args=(*flags, *base.bench_args))
    return BenchJob(screen, spec.n_prompt, spec.n_gen, spec.depths, spec.repetitions, verbose=verbose)


def run_screen(
    spec: BenchTests,
    configs: Sequence[LlamaConfig],
    binaries: Binaries,
    study_dir: Path,
    *,
    command: Sequence[str] = (),
    on_event: Callable[[SweepEvent], None] = lambda e: None,
) -> SweepOutcome:
    """Every test of ``configs``, which differ in one option's value (:func:`screened_option`), in ONE llama-bench
    process (:func:`screen_job`): each record stored under the configuration whose value it echoes. A screen saves
    the start-up (and the model's load) of each value after the first; it is one process's evidence for them all,
    so a value that leads by a little is measured again in a process of its own (advise's search), and only
    what reaches the confirmation counts. A value that failed is stored as failed; the others keep their records."""
    model_key = model_id(spec.model).key
    job = screen_job(configs, spec)
    with Store(study_dir) as store:
        load = machine_load()
        run = Recording(store, "bench", command, binaries=binaries, model=spec.model, always=False,
                        on_event=on_event, load=load)  # fmt: skip
        total = len(job.points()) * len(configs)
        with run:
            on_event(ConfigStarted(job, 0, 1))
            for c in configs:
                store.put_config(c)
            stored, failure = _run_job(job, spec, binaries, store, run, model_key, 0, total, on_event, configs)
            on_event(Progressed(total, total))
            for c in configs:  # the values it did not finish, where it failed
                done = all(store.has_bench_point(c.key, model_key, *p, round=spec.round) for p in job.points())
                if failure is not None and not done:
                    run.fail(c, dataclasses.replace(failure, config_key=c.key))
        return SweepOutcome(study_dir=study_dir, configs=tuple(configs), skipped=(), stored=stored,
                            failures=tuple(run.failures), run_id=run.run_id)  # fmt: skip


def _run_job(
    job: BenchJob,
    spec: BenchTests,
    binaries: Binaries,
    store: Store,
    run: Recording,
    model_key: str,
    done_before: int,
    total: int,
    on_event: Callable[[SweepEvent], None],
    members: Sequence[LlamaConfig] = (),
) -> tuple[int, Failure | None]:
    """One llama-bench process: store its records as they come; return (tests stored, failure or None).
    ``members``: a screen's configurations (:func:`run_screen`), each record stored under the one it echoes."""
    expected = job.points()
    owners = tuple(members) or (job.config,)
    seen_by: dict[str, set[Point]] = {c.key: set() for c in owners}
    seen: set[tuple[str, Point]] = set()  # of the process (a screen: every value's tests)
    problem: str | None = None
    exited: Exited | None = None
    bins = binaries.for_config(job.config)
    bench_bin, backend = bins.bench, bins.expected_backend
    with closing(bench.run(job, bench_bin, spec.model, spec.timeout_s)) as events:
        for event in events:
            if isinstance(event, ProgressLine):
                on_event(Progressed(done_before + max(_within_job(event), len(seen)), total))
            elif isinstance(event, RecordLine):
                owner = next((c for c in owners if bench.record_mismatch(c, event.record, backend) is None), None)
                problem = bench.record_mismatch(owner or owners[0], event.record, backend)
                owner = owner or owners[0]
                result = dataclasses.replace(bench.result_from_record(owner.key, event.record), round=spec.round)
                point = (result.n_prompt, result.n_gen, result.n_depth)
                if problem is None and (point not in expected or point in seen_by[owner.key]):
                    problem = (
                        f"llama-bench measured {result.test_name}, which this configuration did not ask for or already "
                        "measured: an argument after `--` sweeps a value (e.g. -b 256,512); sweep with xover's options"
                    )
                if problem is not None:
                    break  # closing() stops llama-bench
                store.add_bench_result(run.ensure(event.record, build=job.config.build), model_key, result)
                if not any(seen_by.values()):
                    _fault_hook(job, spec.round)
                seen_by[owner.key].add(point)
                seen.add((owner.key, point))
                on_event(ResultStored(owner, result))
                on_event(Progressed(done_before + len(seen), total))
            else:
                exited = event
    if exited is not None:
        if seen and exited.markdown:
            run.artifact(
                MD_ARTIFACT, {"config_key": job.config.key, "markdown": exited.markdown}, build=job.config.build
            )
        if seen and exited.resolved:
            run.artifact(
                RESOLVED_ARTIFACT,
                {"config_key": job.config.key, "model_key": model_key, "fields": dict(exited.resolved)},
                build=job.config.build,
            )
        use = memory.MemoryUse(exited.peak_rss_bytes, memory.parse_buffer_lines(exited.buffer_lines))
        if seen and (use.peak_rss_bytes is not None or use.buffers):
            run.artifact(
                memory.ARTIFACT,
                {"config_key": job.config.key, "label": job.config.label, "source": "llama-bench", **use.to_dict()},
                build=job.config.build,
            )
        problem = problem or exit_problem(exited, len(seen), len(expected) * len(owners), spec.timeout_s)
    if problem is None:
        return len(seen), None
    tail = exited.stderr_tail if exited is not None else ""
    where = describe_job(job) + (f" in round {spec.round}" if spec.round is not None else "")
    return len(seen), Failure(config_key=job.config.key, stage="bench", point=where, reason=problem, stderr_tail=tail)


KILL_HOOK = "XOVER_TEST_KILL_BENCH"
"""A test hook (issue 69's fault tests): ``ROUND:LABEL:COUNT``, ROUND a round number or ``search`` (a process outside
rounds), LABEL a regular expression searched in the configuration's label. The first COUNT llama-bench processes of
this xover process that match are killed with SIGKILL after their first stored test, as the OOM killer or a stray
``kill`` would: a signal xover did not send. Unset, it does nothing."""
_killed: list[int] = []


def _fault_hook(job: BenchJob, round: int | None) -> None:
    hook = os.environ.get(KILL_HOOK)
    if not hook:
        return
    m = re.fullmatch(r"(search|-?\d+):(.*):(\d+)", hook)
    if m is None:
        raise XoverError(f"{KILL_HOOK}={hook!r}: give ROUND:LABEL:COUNT, e.g. 1:slow:2 or search:ub=256:1")
    where, label, count = m.group(1), m.group(2), int(m.group(3))
    if where != ("search" if round is None else str(round)) or not re.search(label, job.config.label):
        return
    if len(_killed) >= count:
        return
    for pid in process.live_pids():  # the sweep's one llama-bench process (never a server or a worker)
        try:
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        if comm == "llama-bench":
            os.kill(pid, signal.SIGKILL)
            _killed.append(pid)
            return


def _interrupted_last(
    store: Store, configs: Sequence[LlamaConfig], model_key: str, round: int | None
) -> frozenset[str]:
    """The configurations whose last llama-bench process in ``round`` was interrupted (:func:`interrupted`: killed by
    a signal xover did not send, and its retry too): no process of theirs in this round has stored a test since."""
    keys = {c.key for c in configs}
    failed: dict[str, int] = {}
    for run_id, f in store.failures():
        if f.config_key in keys and f.stage == "bench" and interrupted(f.reason) and failure_round(f.point) == round:
            failed[f.config_key] = max(run_id, failed.get(f.config_key, 0))
    out = set()
    for key, run_id in failed.items():
        runs = [r for _, r, mk, res in store.bench_results(key) if mk == model_key and res.round == round]
        if not runs or max(runs) <= run_id:
            out.add(key)
    return frozenset(out)


def memory_by_config(store: Store, source: str = "llama-bench") -> dict[str, memory.MemoryUse]:
    """The latest peak memory stored for each configuration key by ``source`` (llama-bench or llama-server)."""
    return {
        body["config_key"]: memory.MemoryUse.from_dict(body)
        for _, _, body in store.artifacts(memory.ARTIFACT)
        if body.get("source") == source
    }


def resolved_by_config(store: Store, model_key: str | None = None) -> dict[str, dict[str, str]]:
    """The latest values each configuration key's ``auto`` settings ran as (record field -> value in the record's
    terms), from llama-bench's log; with ``model_key``, on that model only (flash attention's support depends on
    the model's heads)."""
    return {
        body["config_key"]: dict(body["fields"])
        for _, _, body in store.artifacts(RESOLVED_ARTIFACT)
        if model_key is None or body.get("model_key") == model_key
    }


def describe_memory(use: memory.MemoryUse) -> str:
    """``peak RSS 812 MiB; buffers: CUDA0 model 9.1 GiB, CUDA0 compute 342 MiB, ...`` in one line."""

    def size(n: int) -> str:
        return f"{n / (1 << 30):.1f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MiB"

    parts = [f"peak RSS {size(use.peak_rss_bytes)}" if use.peak_rss_bytes is not None else "peak RSS unknown"]
    if use.buffers:
        parts.append("buffers: " + ", ".join(f"{dev} {kind} {size(b)}" for dev, kind, b in use.buffers if b))
    return "; ".join(parts)


# ---- `xover bench`: from its options to the stored sweep ------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BenchRequest:
    """What ``xover bench`` was asked: the tests, the configurations to sweep (every combination of the swept
    values and ``env`` values, with ``bench_args`` after ``--``), the study to store them in, and the VRAM budget
    (bytes of GPU memory left to llama.cpp) to run under."""

    tests: BenchTests
    study_dir: Path
    sweeps: tuple[tuple[LlamaOption, tuple[str, ...]], ...] = ()
    env: tuple[tuple[str, tuple[str, ...]], ...] = ()
    bench_args: tuple[str, ...] = ()
    fresh: bool = False
    llama_bin_dir: Path | None = None
    vram_budget: int | None = None


@dataclasses.dataclass(frozen=True)
class BenchRun:
    """A ``xover bench`` run: the sweep's outcome, its configurations' results as stored, and each one's peak
    memory in words (label, description)."""

    outcome: SweepOutcome
    data: BenchData
    memory: tuple[tuple[str, str], ...]


def run_bench(
    request: BenchRequest,
    *,
    command: Sequence[str] = (),
    on_event: Callable[[SweepEvent | Note], None] = lambda e: None,
) -> BenchRun:
    """``xover bench``: the configurations checked, the binaries found, then :func:`run_sweep` under the VRAM
    budget (a :class:`xover.measure.events.Note` says what is held before the sweep's events)."""

    configs = sweep_configs(request.sweeps, request.env, request.bench_args)
    binaries = resolve(request.llama_bin_dir)
    with holding(request.vram_budget) as hold:
        if hold is not None:
            on_event(Note(hold.describe()))
        outcome = run_sweep(
            request.tests, configs, binaries, request.study_dir, fresh=request.fresh, command=command, on_event=on_event
        )
    data = bench_data(load(request.study_dir), {c.key for c in outcome.configs})
    with Store(request.study_dir) as store:
        peaks = memory_by_config(store)
    memory = tuple((c.label, describe_memory(peaks[c.key])) for c in outcome.configs if c.key in peaks)
    return BenchRun(outcome, data, memory)
