"""`xover advise`, measured: :func:`xover.analysis.advise.coordinate_search` driven through llama-bench, the
winner confirmed against the defaults through llama-server, the result stored as artifact ``advise``.

Every measurement is one :func:`xover.measure.bench.run_sweep` of one configuration into the study's
store, so a rerun with the same study directory reuses what was measured (and says so), and the
raw samples, failures and peak memory sit beside the advice like any ``xover bench`` result.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from xover.analysis import advise
from xover.analysis.advise import Advice, Knob, Measurement, RateSamples, Search, ServerPoint, Setting, Workload
from xover.analysis.theory import model_terms
from xover.domain import llama_options
from xover.domain.config import LlamaConfig
from xover.domain.records import BenchResult
from xover.errors import XoverError
from xover.gguf.inspect import check_offload_and_context, model_context, model_table
from xover.hardware.detect import resolve as resolve_hw
from xover.hardware.vram import holding
from xover.llamacpp.bench import BenchJob
from xover.llamacpp.binaries import Binaries, resolve
from xover.llamacpp.server import ServerLaunch, buffer_log_verbosity, context_size, has_flag
from xover.measure import bench as benchrun
from xover.measure import ttft as ttftrun
from xover.measure.events import Measured, Measuring, Note, Retrying
from xover.measure.provenance import model_id
from xover.results.store import Store

GPU_FREE_BACKENDS = {"CPU", "BLAS", "RPC"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class AdviseSettings:
    """How ``xover advise`` measures: as it was asked (:class:`AdviseRequest`) and as its search runs
    (:class:`AdviseSpec`)."""

    response_tokens: int = 200
    repetitions: int = 3
    n_gen: int = 64  # T of tg{T} @ dN
    chunk: int | None = None  # P of pp{P} @ dN; None: the largest ubatch candidate, at least 512
    budget_s: float = 240.0  # seconds the whole run may take: the plan shrinks to fit (xover.analysis.advise.plan)
    confirm: bool = True
    confirm_repetitions: int = 2
    timeout_s: float | None = None

    def settings(self) -> dict[str, Any]:
        """These fields by name, to pass on to the search's :class:`AdviseSpec`."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(AdviseSettings)}


@dataclasses.dataclass(frozen=True, kw_only=True)
class AdviseSpec(AdviseSettings):
    """What ``xover advise`` searches and measures: the knobs on the model at each offload level, over the
    workload, with the settings."""

    model: Path
    knobs: tuple[Knob, ...]
    ncmoe: tuple[int | None, ...] = (None,)
    workload: Workload | None = None  # None: the agentic band, scaled to the model and then to fit budget_s

    def __post_init__(self) -> None:
        if self.repetitions < 2:
            raise XoverError("-r must be at least 2: telling an effect from noise needs the spread of repeated samples")
        if self.n_gen < 8:
            raise XoverError("--tg must be at least 8 tokens")
        if self.chunk is not None and self.chunk < 32:
            raise XoverError("--pp must be at least 32 tokens (a ubatch op offload takes)")
        if self.budget_s <= 0 or self.confirm_repetitions < 1 or self.response_tokens < 1:
            raise XoverError("--budget, --confirm-reps and --response-tokens must be positive")
        if not self.ncmoe:
            raise XoverError("give at least one --ncmoe value (or none at all for llama.cpp's default)")

    @property
    def chunk_tokens(self) -> int:
        ubatches = [int(v) for k in self.knobs if k.name == "ubatch-size" for v in k.candidates]
        return self.chunk or max([advise.LLAMA_DEFAULT_UBATCH, *ubatches])


# ---- reading measurements back from the store ------------------------------------------------------

_EFFECTIVE_FIELDS = frozenset(llama_options.record_fields())  # the values in effect, as llama-bench reports them
_AUTO = {  # record field -> what llama-bench reports for an option's "auto" (resolved only in llama.cpp's log)
    o.record_field: str(dict(o.record_values)["auto"])
    for o in llama_options.OPTIONS
    if o.record_field and "auto" in dict(o.record_values)
}


def measurement_from_store(
    store: Store, config: LlamaConfig, model_key: str, sweep: benchrun.BenchTests, failure: str | None, reused: bool
) -> Measurement:
    """A configuration's tests at the sweep's depths (the latest of each in the sweep's round: a round's process is
    never read for another round, nor for the search outside rounds), as a :class:`Measurement`."""
    latest: dict[tuple[int, int, int], BenchResult] = {}
    for _, _, mk, r in store.bench_results(config.key):
        if mk == model_key and r.round == sweep.round:
            latest[(r.n_prompt, r.n_gen, r.n_depth)] = r
    # the tests one llama-bench process of this configuration runs (an engine without -d: prefill at depth 0 only)
    wanted = BenchJob(config, sweep.n_prompt, sweep.n_gen, sweep.depths, sweep.repetitions).points()
    if failure is not None or not wanted or any(p not in latest for p in wanted):
        return Measurement(failure=failure or "llama-bench left tests unmeasured", reused=reused)
    prefill = [latest[p] for p in wanted if p[0]]
    decode = [latest[p] for p in wanted if p[1]]
    record = (prefill or decode)[0].record
    effective = tuple((k, str(v)) for k, v in record.items() if k in _EFFECTIVE_FIELDS)
    # an ``auto`` the record reports as given (-fa auto: -1), replaced by what llama.cpp logged it ran as
    ran_as = benchrun.resolved_by_config(store, model_key).get(config.key, {})
    effective = tuple((k, ran_as.get(k, v) if v == _AUTO.get(k) else v) for k, v in effective)
    use = benchrun.memory_by_config(store).get(config.key)
    return Measurement(
        prefill=tuple(RateSamples(r.n_depth, r.n_prompt, r.samples_ts) for r in prefill),
        decode=tuple(RateSamples(r.n_depth, r.n_gen, r.samples_ts) for r in decode),
        effective=effective + (("backends", str(record.get("backends", ""))),),
        peak_rss_bytes=use.peak_rss_bytes if use else None,
        device_bytes=use.device_bytes if use else None,
        reused=reused,
    )


def is_gpu_build(backends: str) -> bool:
    """Whether llama-bench's ``backends`` field names a GPU backend (``CUDA``, ``ROCm``, ``Vulkan``...)."""
    return bool({b.strip() for b in backends.split(",") if b.strip()} - GPU_FREE_BACKENDS)


# ---- the run --------------------------------------------------------------------------------------


class _Runner:
    def __init__(
        self,
        spec: AdviseSpec,
        binaries: Binaries,
        study_dir: Path,
        command: Sequence[str],
        on_event: Callable[[object], None],
    ) -> None:

        self.spec, self.binaries, self.study_dir, self.command, self.on_event = (
            spec,
            binaries,
            study_dir,
            command,
            on_event,
        )
        self.model_key = model_id(spec.model).key
        self.count = 0
        self.plan: advise.SearchPlan | None = None  # once planned: the processes and seconds the ETA counts down
        # (configuration key, round, tests) this runner measured: the plan's probe of the defaults runs other tests
        self.measured_here: set[tuple[object, ...]] = set()

    def sweep(self, depths: tuple[int, ...], n_prompt: int, n_gen: int, repetitions: int) -> benchrun.BenchTests:
        return benchrun.BenchTests(
            model=self.spec.model,
            depths=depths,
            n_prompt=n_prompt,
            n_gen=n_gen,
            repetitions=repetitions,
            timeout_s=self.spec.timeout_s,
        )

    def bench(self, sweep: benchrun.BenchTests, config: LlamaConfig, fresh: bool = False) -> Measurement:
        def told(ev: object) -> None:  # a process killed from outside, retried: said, never silent
            if isinstance(ev, Retrying):
                self.on_event(Note(f"{config.label}: {ev.reason}; retried once in a fresh process"))

        outcome = benchrun.run_sweep(
            sweep, [config], self.binaries, self.study_dir, fresh=fresh, command=self.command, on_event=told
        )
        failure = outcome.failures[0].reason if outcome.failures else None
        here = (config.key, sweep.round, sweep.n_prompt, sweep.n_gen, tuple(sweep.depths), sweep.repetitions)
        if outcome.stored:
            self.measured_here.add(here)
        reused = outcome.stored == 0 and not failure and here not in self.measured_here  # stored by another session
        with Store(self.study_dir) as store:
            return measurement_from_store(store, config, self.model_key, sweep, failure, reused=reused)

    def measure_fn(
        self, level: int | None, sweep: benchrun.BenchTests, workload: Workload
    ) -> Callable[[Setting], Measurement]:
        settings = (("n-cpu-moe", str(level)),) if level is not None else ()
        return self.measure_config_fn(LlamaConfig(advise.level_label(level), settings), sweep, workload)

    def measure_config_fn(
        self,
        base: LlamaConfig,
        sweep: benchrun.BenchTests,
        workload: Workload,
        place: Callable[[LlamaConfig, str], LlamaConfig] | None = None,
    ) -> Callable[..., Measurement]:
        """``measure(setting, fresh=False)``: ``base`` with the setting on top, through llama-bench (``fresh``: in a
        new process even if its tests are stored), labelled ``"<base name> <setting>"``; ``place(trial, base
        name)`` may move the trial's ``--n-cpu-moe`` (a fit configuration under a VRAM budget is placed for each
        trial's own ubatch)."""

        def measure(setting: Setting, fresh: bool = False) -> Measurement:
            label = f"{base.name} {advise.setting_label(self.spec.knobs, setting)}"
            self.count += 1
            plan = self.plan
            left = (max(0, plan.processes - self.count + 1) * plan.per_process_s + plan.confirm_s) if plan else None
            self.on_event(Measuring(label, self.count, plan.processes if plan else None, left))
            trial = advise.apply_setting(base, self.spec.knobs, setting, label)
            try:
                placed = place(trial, base.name) if place is not None else trial
            except XoverError as e:  # a setting the budget cannot hold: a failed trial, and the search goes on
                m = Measurement(failure=str(e))
            else:
                m = self.bench(sweep, placed, fresh)
            self.on_event(Measured(label, m, advise.estimate(m, workload) if m.ok else None))
            return m

        return measure

    def screen_fn(
        self, level: int | None, sweep: benchrun.BenchTests, workload: Workload
    ) -> Callable[[Sequence[Setting]], list[Measurement]]:
        """``screen(settings)``: settings that differ in one knob's value, in ONE llama-bench process
        (:func:`xover.measure.bench.run_screen`), each labelled as :meth:`measure_fn` labels it; where one process
        cannot tell them apart (they differ in more than that option), each in its own process."""
        base = LlamaConfig(advise.level_label(level), (("n-cpu-moe", str(level)),) if level is not None else ())
        measure = self.measure_config_fn(base, sweep, workload)

        def screen(settings: Sequence[Setting]) -> list[Measurement]:
            labels = [f"{base.name} {advise.setting_label(self.spec.knobs, s)}" for s in settings]
            configs = [advise.apply_setting(base, self.spec.knobs, s, lb) for s, lb in zip(settings, labels)]
            if benchrun.screened_option(configs) is None:
                return [measure(s) for s in settings]
            self.count += 1
            plan = self.plan
            left = (max(0, plan.processes - self.count + 1) * plan.per_process_s + plan.confirm_s) if plan else None
            what = f"{base.name} {' / '.join(lb.removeprefix(base.name + ' ') for lb in labels)} (one process)"
            self.on_event(Measuring(what, self.count, plan.processes if plan else None, left))
            outcome = benchrun.run_screen(sweep, configs, self.binaries, self.study_dir, command=self.command)
            failed = {f.config_key: f.reason for f in outcome.failures}
            out = []
            with Store(self.study_dir) as store:
                for c in configs:
                    m = measurement_from_store(store, c, self.model_key, sweep, failed.get(c.key), reused=False)
                    self.on_event(Measured(c.label, m, advise.estimate(m, workload) if m.ok else None))
                    out.append(m)
            return out

        return screen


def run_advise(
    spec: AdviseSpec,
    binaries: Binaries,
    study_dir: Path,
    *,
    command: Sequence[str] = (),
    on_event: Callable[[object], None] = lambda e: None,
) -> Advice:
    """Search every offload level, confirm the winner through llama-server (``spec.confirm``), store
    and return the advice. ``on_event`` gets :data:`xover.measure.events.AdviseEvent` and, while confirming,
    :data:`xover.measure.events.TtftEvent`."""

    if not spec.model.is_file():
        raise XoverError(f"model {spec.model} does not exist: pass -m PATH to a .gguf file")
    started = time.perf_counter()
    runner = _Runner(spec, binaries, study_dir, command, on_event)
    chunk = spec.chunk_tokens
    table, _ = model_table(spec.model)
    terms = model_terms(table)
    hw, _ = resolve_hw(None, False)
    workload, note, probe = _workload(spec, runner, chunk)
    on_event(Note(f"workload {workload.describe()}" + (f" ({note})" if note else "")))
    gpu_build = is_gpu_build(dict(probe.measurement.effective).get("backends", ""))
    plan = _plan(spec, workload, chunk, probe, terms, hw, gpu_build, time.perf_counter() - started)
    runner.plan = plan
    on_event(Note(plan.describe()))
    workload = plan.workload
    if spec.chunk is None:  # the largest ubatch the plan still tries, no longer than the longest prompt (as tuning)
        ubs = [int(v) for k in plan.knobs if k.name == "ubatch-size" for v in k.candidates]
        chunk = min(chunk, max([advise.LLAMA_DEFAULT_UBATCH, *ubs]), max(workload.lengths))
    sweep = runner.sweep(plan.depths, chunk, spec.n_gen, spec.repetitions)
    searches: list[Search] = []
    for level in spec.ncmoe:
        try:
            searches.append(
                advise.coordinate_search(
                    plan.knobs,
                    runner.measure_fn(level, sweep, workload),
                    workload,
                    level,
                    screen=runner.screen_fn(level, sweep, workload),
                    screened=plan.screened,
                )
            )
        except XoverError as e:
            on_event(Note(f"{advise.level_label(level)} left out: {e}"))
    if not searches:
        raise XoverError("no offload level could be measured at llama.cpp's defaults: check -m and --ncmoe")
    backends = dict(searches[0].defaults.measurement.effective).get("backends", "")
    gpu_build = is_gpu_build(backends)
    expectations = tuple(
        e for s in searches for e in advise.expectations(terms, hw, plan.knobs, s, workload, gpu_build)
    )
    if plan.left_out:
        note = "; ".join(x for x in (note, "to fit --budget: " + "; ".join(plan.left_out)) if x)
    response = max(1, round(workload.mean_response))
    crossovers = (
        advise.revisit_crossovers(
            [(s.label, s.defaults.measurement, s.best.measurement) for s in searches],
            workload.representative(),
            response,
        )
        if len(searches) > 1
        else ()
    )
    advice = Advice(
        model=str(spec.model),
        backend=backends or "unknown",
        hardware=hw.name + ("" if gpu_build or hw.gpu is None else " (CPU-only llama.cpp build)"),
        workload=workload,
        workload_note=note,
        chunk=chunk,
        n_gen=spec.n_gen,
        repetitions=spec.repetitions,
        knobs=plan.knobs,
        searches=tuple(searches),
        expectations=expectations,
        crossovers=crossovers,
        confirmation=None,
    )
    if spec.confirm:
        advice = dataclasses.replace(
            advice, confirmation=_confirm(spec, advice, plan.points, binaries, study_dir, command, on_event)
        )
    with Store(study_dir) as store:
        store.add_artifact(None, advise.ARTIFACT, advice.to_dict())
    return advice


@dataclasses.dataclass(frozen=True)
class _Probe:
    """The defaults' first llama-bench process, which the plan is priced from: its rates at depth 0 and at
    ``depth`` (one repetition, sizes the search never uses so it is never reused for a trial) and its wall time."""

    measurement: Measurement
    depth: int
    wall_s: float
    seconds: Callable[[Sequence[int]], float]  # a process's test time at these depths, at the probed rates
    pp: dict[int, float]
    tg: dict[int, float]
    own_s: float  # the probe's own tests, at its rates

    @property
    def start_s(self) -> float:
        """What a process costs beyond its tests (start-up, model load): the probe's wall time less its own tests',
        at least half a second."""
        return max(0.5, self.wall_s - self.own_s)


def _workload(spec: AdviseSpec, runner: _Runner, chunk: int) -> tuple[Workload, str, _Probe]:
    """The spec's workload, or the agentic band scaled to the model's training context (each depth plus the prefill
    test must fit it; the plan may then halve it to fit the budget), with a line about it, and the probe of the
    defaults at depth 0 and at the workload's shortest length (pp and tg, one repetition, stored like the rest)."""
    fitted = ""
    if spec.workload is not None:
        workload = spec.workload
    else:
        workload, fitted = _agentic_for_context(spec, chunk)
    level = max(spec.ncmoe, key=lambda n: -1 if n is None else n)  # most experts in host memory: the slowest
    probe_gen = spec.n_gen // 2  # sizes the search never uses, so the probe's single repetition is never reused
    label = f"{advise.level_label(level)} defaults"
    probe_depth = min(workload.lengths)
    t0 = time.perf_counter()
    probe = runner.bench(  # always a fresh process: its wall time prices the plan
        runner.sweep((0, probe_depth), chunk // 2, probe_gen, 1),
        advise.llama_config(spec.knobs, advise.DEFAULTS, level, label),
        fresh=True,
    )
    wall = time.perf_counter() - t0
    if not probe.ok:
        raise XoverError(
            f"llama.cpp's defaults could not run at {advise.level_label(level)} ({probe.failure}): "
            "check -m, --ncmoe and --llama-bin-dir"
        )
    pp = {r.depth: r.median_tps for r in probe.prefill}
    tg = {r.depth: r.median_tps for r in probe.decode}
    seconds = _measurement_seconds(pp, tg, chunk, spec.n_gen, spec.repetitions)
    own = _measurement_seconds(pp, tg, chunk // 2, probe_gen, 1)((0, probe_depth))
    estimate = (
        f"{pp[0]:,.0f} prefill and {tg[0]:,.0f} decode tok/s, {pp[probe_depth]:,.0f} and {tg[probe_depth]:,.0f} at "
        f"depth {probe_depth:,}"
    )
    note = f"{fitted}: {estimate}" if fitted else estimate
    return workload, note, _Probe(probe, probe_depth, wall, seconds, pp, tg, own)


def _plan(
    spec: AdviseSpec,
    workload: Workload,
    chunk: int,
    probe: _Probe,
    terms: Any,
    hw: Any,
    gpu_build: bool,
    spent_s: float,
) -> advise.SearchPlan:
    """The search within what is left of ``spec.budget_s`` (:func:`xover.analysis.advise.plan_search`), priced from
    the probe: a process is its start-up and its tests; the confirmation two servers, each prefilling and answering
    every representative length ``confirm_repetitions`` times after its warm-ups. Values are ranked by what the
    theory expects of them at the slowest level (a ubatch longer than every prompt of the workload lowest: nothing
    fills it)."""
    level = max(spec.ncmoe, key=lambda n: -1 if n is None else n) or 0
    response = max(16, round(workload.mean_response))
    turn_s = advise.expected_turn_s(terms, hw, spec.knobs, level, workload, gpu_build)
    base_s = turn_s(advise.DEFAULTS)

    def rank(knob: Knob, value: str) -> float:
        try:
            return base_s / turn_s(advise.normalize(spec.knobs, {knob.name: value}))
        except (XoverError, ValueError, ZeroDivisionError):
            return 1.0

    def per_process(w: Workload, points: int) -> float:
        return probe.start_s + probe.seconds(w.depths(points))

    def confirm(w: Workload, points: int) -> float:
        if not spec.confirm:
            return 0.0

        def turn(L: int) -> float:
            return L * advise.per_token_s(probe.pp, L / 2) + response * advise.per_token_s(probe.tg, L)

        lengths = w.representative(points)
        warm = turn(min(advise.LLAMA_DEFAULT_UBATCH, max(lengths))) + turn(min(lengths))
        return 2 * (probe.start_s + warm + spec.confirm_repetitions * sum(turn(L) for L in lengths))

    return advise.plan_search(
        workload,
        [k for k in spec.knobs if k.candidates],
        rank,
        per_process,
        confirm,
        spec.budget_s - spent_s,
        levels=len(spec.ncmoe),
        scalable=spec.workload is None,
        spent_s=spent_s,
        start_s=probe.start_s,
        screenable=advise.screenable,
    )


def _measurement_seconds(
    pp: dict[int, float], tg: dict[int, float], chunk: int, n_gen: int, repetitions: int
) -> Callable[[Sequence[int]], float]:
    """Rough wall time of one measurement at some depths, from probed speeds at two depths: time per
    token taken as linear in depth (attention reads the whole context), each test prefilling its depth
    once (untimed by llama-bench, but waited for), warming up, then repeating."""
    per_token = advise.per_token_s

    def seconds(depths: Sequence[int]) -> float:
        return sum(
            2 * d * per_token(pp, d / 2) + (repetitions + 1) * (chunk * per_token(pp, d) + n_gen * per_token(tg, d))
            for d in depths
        )

    return seconds


def _agentic_for_context(spec: AdviseSpec, chunk: int) -> tuple[Workload, str]:
    """The 10K-40K agentic band, scaled down when the model's training context cannot hold its longest
    prompt as a llama-bench depth with the ``chunk``-token prefill test and ``n_gen`` decode tokens on top
    (nor with the response, for the llama-server confirmation); and a line saying so ("" when unscaled)."""

    agentic = advise.agentic_workload(spec.response_tokens)
    context = model_context(spec.model)
    n_ctx = context.n_ctx_train
    room = n_ctx - max(chunk + spec.n_gen, spec.response_tokens) if n_ctx else 0
    top = max(agentic.lengths)
    if not n_ctx or top <= room:
        return agentic, ""
    unit = 256
    if room < unit:
        raise XoverError(
            f"{context.name}'s training context of {n_ctx:,} tokens leaves no room for the agentic band "
            f"after the {chunk}-token prefill test (--pp, or the largest --ubatch tried) and {spec.n_gen} "
            f"decode tokens (--tg): give --lengths up to {max(room, 0)}, or a smaller --pp / --ubatch"
        )
    factor = room / top
    scaled = agentic.scaled(factor, unit)
    while max(scaled.lengths) > room:
        factor *= 0.98
        scaled = agentic.scaled(factor, unit)
    return scaled, (
        f"the 10K-40K band scaled to {context.name}'s training context of {n_ctx:,} tokens (each depth "
        f"plus the {chunk}-token prefill test and {spec.n_gen} decode tokens fits)"
    )


def _confirm(
    spec: AdviseSpec,
    advice: Advice,
    depth_points: int,
    binaries: Binaries,
    study_dir: Path,
    command: Sequence[str],
    on_event: Callable[[object], None],
) -> advise.Confirmation | None:
    """Cold TTFT and decode through llama-server: the defaults against the recommendation, at the best
    offload level and the workload's representative lengths (as many as the plan measured)."""

    best = advice.best
    if best.recommended == advise.DEFAULTS:
        on_event(Note(f"nothing to confirm: llama.cpp's defaults are the recommendation at {best.label}"))
        return None
    workload = advice.workload
    lengths = workload.representative(depth_points)
    response = max(16, round(workload.mean_response))
    ctx = context_size(max(lengths), response)
    fit_off, verbosity = has_flag(binaries.server, "-fit"), buffer_log_verbosity(binaries.server)
    trials = (best.defaults, best.best)
    specs = []
    for trial in trials:
        config = advice.config(best, trial.setting)
        specs.append(ServerLaunch(config, spec.model.resolve(), ctx, fit_off=fit_off, log_verbosity=verbosity))
    plan = ttftrun.TtftPlan(
        lengths=lengths,
        reps=spec.confirm_repetitions,
        response_tokens=response,
        mode="cold",
        seed=time.time_ns() % 2**31,
    )
    with Store(study_dir) as store:
        run = ttftrun.TtftRun(store, plan, list(command), binaries=binaries, model=spec.model, on_event=on_event)
        outcome = asyncio.run(run.run_managed(specs, study_dir / "logs"))
    points: dict[str, list[ServerPoint]] = {}
    for p in ttftrun.summarize_points(outcome.samples):
        if p.ttft_ns is not None and p.decode_tps_server is not None:
            points.setdefault(p.config_key, []).append(
                ServerPoint(p.length, p.ttft_ns.median / 1e9, p.decode_tps_server.median)
            )
    keys = [s.config.key for s in specs]
    if any(len(points.get(k, [])) < len(lengths) for k in keys):
        reason = (
            outcome.failures[0].reason if outcome.failures else "some lengths have no sample that passed the cold check"
        )
        on_event(Note(f"llama-server confirmation incomplete ({reason}); the advice rests on llama-bench alone"))
        return None
    return advise.confirmation(best.n_cpu_moe, points[keys[0]], points[keys[1]], workload, spec.confirm_repetitions)


# ---- `xover advise`: from its options to the advice ------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class AdviseRequest(AdviseSettings):
    """What ``xover advise`` was asked: the model, the workload (``"agentic"``, a file of turns, or uniform
    ``lengths``), the knobs to search (``knob_names`` as given, None for all) with any values to try
    (``values``: option name -> values; ``n-cpu-moe``'s are the offload levels, each searched on its own), and
    how to measure (the settings)."""

    model: Path
    study_dir: Path
    workload: str = "agentic"  # "agentic", or a file of turns: PROMPT_TOKENS[,RESPONSE_TOKENS[,WEIGHT]] per line
    lengths: tuple[int, ...] | None = None  # uniform prompt lengths, instead of the agentic workload
    knob_names: str | None = None
    values: tuple[tuple[str, tuple[str, ...]], ...] = ()
    llama_bin_dir: Path | None = None
    vram_budget: int | None = None  # bytes of GPU memory left to llama.cpp (xover.hardware.vram)


@dataclasses.dataclass(frozen=True)
class Remark:
    """A line said before the search starts: a knob value left out, or the VRAM budget held."""

    text: str


def ubatches_that_fit(knobs: tuple[Knob, ...], n_ctx: int, name: str) -> tuple[tuple[Knob, ...], str | None]:
    """The default -ub candidates without those above half the training context (the largest one tried
    is the prefill test's size, and the depths of the workload need the other half), and a line saying what
    was left out (None when nothing was)."""
    knob = next((k for k in knobs if k.name == "ubatch-size"), None)
    if knob is None:
        return knobs, None
    keep = [v for v in knob.candidates if int(v) <= n_ctx // 2]
    if len(keep) == len(knob.candidates):
        return knobs, None
    dropped = [v for v in knob.candidates if v not in keep]
    line = (
        f"-ub {','.join(dropped)} left out: more than half of {name}'s training context of "
        f"{n_ctx:,} tokens (--ubatch to choose)"
    )
    if not keep:
        return tuple(k for k in knobs if k.name != "ubatch-size"), line
    return advise.with_candidates(knobs, "ubatch-size", keep), line


def _chosen_knobs(request: AdviseRequest, given: dict[str, tuple[str, ...]]) -> tuple[Knob, ...]:
    """The knobs to search: all of them (with the values given to try), or those ``--knobs`` names."""

    knobs = advise.default_knobs(os.cpu_count() or 1)
    for name, values in given.items():
        knobs = advise.with_values_to_try(knobs, name, values)
    if request.knob_names is None:
        return knobs
    wanted = [n.strip() for n in request.knob_names.split(",") if n.strip()]
    known = {k.name: k for k in knobs} | {k.short: k for k in knobs}
    bad = [n for n in wanted if n not in known]
    if bad or not wanted:
        raise XoverError(
            f"--knobs {request.knob_names!r}: choose from {', '.join(k.name for k in knobs)} (or lm, ub, b, nopo, t)"
        )
    names = {known[n].name for n in wanted}
    return tuple(k for k in knobs if k.name in names)


def _request_workload(request: AdviseRequest) -> Workload | None:
    """The workload the request names: uniform ``lengths``, a file of turns, or None for the agentic band."""
    if request.lengths is not None:
        if request.workload != "agentic":
            raise XoverError("give either --lengths or --workload FILE, not both")
        return advise.uniform_workload(request.lengths, request.response_tokens)
    if request.workload == "agentic":
        return None
    path = Path(request.workload)
    try:
        text = path.read_text()
    except OSError as e:
        raise XoverError(
            f"--workload {request.workload}: cannot read it ({e.strerror or e}); give agentic or a file of turns"
        ) from None
    return advise.parse_workload(text, request.response_tokens, path.name)


def _check_context(
    model: Path,
    levels: tuple[int | None, ...],
    workload: Workload,
    knobs: tuple[Knob, ...],
    chunk: int | None,
    n_gen: int,
    option: str,
) -> None:
    """Fail before measuring when a given workload's prompts, as llama-bench depths with the prefill and
    decode tests on top, exceed the model's training context; the message names the lengths that fit."""

    ubatches = [int(v) for k in knobs if k.name == "ubatch-size" for v in k.candidates]
    pp = chunk or max([advise.LLAMA_DEFAULT_UBATCH, *ubatches])
    check_offload_and_context(
        model,
        [n for n in levels if n is not None],
        lengths=workload.lengths,
        extra_tokens=pp + n_gen,
        option=option,
        extra_what=f"llama-bench test tokens (pp{pp} + tg{n_gen})",
    )


def run_advise_request(
    request: AdviseRequest, *, command: Sequence[str] = (), on_event: Callable[[object], None] = lambda e: None
) -> Advice:
    """``xover advise``: the request checked (knobs, binaries, model, workload, context), then :func:`run_advise`
    under the VRAM budget. ``on_event`` gets a :class:`Remark` for each knob value left out (a -ub the model's
    context cannot hold, as soon as it is known; the GPU-only knobs of a CPU-only build, once every input is
    known to be good) and for the budget held, then :func:`run_advise`'s events."""

    given = dict(request.values)
    levels = tuple(int(v) for v in given.pop("n-cpu-moe", ())) or (None,)
    knobs = _chosen_knobs(request, given)
    binaries = resolve(request.llama_bin_dir)
    backend = binaries.manifest.backend if binaries.manifest is not None else None
    dropped: list[Knob] = []
    if backend == "cpu" and request.knob_names is None:
        # pinned memory, op offload and its threshold only change how weights reach a GPU: nothing to copy here
        dropped = [k for k in knobs if k.gpu_only and k.name not in given]
        knobs = tuple(k for k in knobs if k not in dropped)
    model = request.model
    if not model.is_file():
        raise XoverError(f"model {model} does not exist: pass -m PATH to a .gguf file")
    context = model_context(model)
    if "ubatch-size" not in given and context.n_ctx_train:
        knobs, line = ubatches_that_fit(knobs, context.n_ctx_train, context.name)
        if line is not None:
            on_event(Remark(line))
    workload = _request_workload(request)
    if workload is not None:
        option = "--lengths" if request.lengths is not None else "--workload"
        _check_context(model, levels, workload, knobs, request.chunk, request.n_gen, option)
    spec = AdviseSpec(model=model, knobs=knobs, ncmoe=levels, workload=workload, **request.settings())
    if dropped:  # said once every input is known to be good, so a bad one still gets a one-line error
        on_event(
            Remark(
                f"{', '.join(k.name for k in dropped)} left out: this llama.cpp build is CPU-only and "
                "they only change how weights reach a GPU (name them with --knobs to search them)"
            )
        )
    with holding(request.vram_budget) as hold:
        if hold is not None:
            on_event(Remark(hold.describe()))
        return run_advise(spec, binaries, request.study_dir, command=command, on_event=on_event)
