"""`xover study`: the whole investigation, resumable, in stages.

    model -> theory + stored prediction -> llama-bench sweep over depth -> cold TTFT per config
    and length -> prompt-cache lab (first configuration) -> agentic session replay per cache mode
    -> report (+ verdict)

Every stage writes into the study directory's one results store as it measures; rerunning a study
skips every point already measured and valid (``fresh`` redoes them), so an interrupted study
continues where it stopped; what is measured already is read through :mod:`xover.results.read_model`.
Stage wall time is stored beside the compute time the binaries report, so the study's own overhead is
visible (``benchmarks/study_efficiency.py``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any

from xover.domain.records import ServerConfig, TtftSample
from xover.domain.study_spec import LlamaConfig, StudySpec
from xover.errors import XoverError
from xover.llamacpp.binaries import Binaries
from xover.measure.provenance import model_id
from xover.results.read_model import StoredSample, load
from xover.results.store import Store

STAGE_ORDER = ("model", "theory", "tune", "bench", "ttft", "cache", "session", "report")
DEFAULT_SERVER_TIMEOUT_S = 600.0


@dataclasses.dataclass(frozen=True)
class StageEvent:
    stage: str
    status: str  # "start"/"done" (stage boundaries), "progress", "info", "skip", "fail"
    detail: str = ""
    completed: float | None = None
    total: float | None = None


@dataclasses.dataclass(frozen=True)
class StudyOutcome:
    study_dir: Path
    model: Path
    verdicts: tuple[str, ...]
    report_html: Path | None
    stage_seconds: dict[str, float]
    failures: int
    tuned: tuple[Any, ...] = ()  # xover.measure.tune.Tuned, one per configuration tuned (or found tuned in the store)


Emit = Callable[[StageEvent], None]
Reporter = Callable[[StudySpec, Path], tuple[tuple[str, ...], Path]]  # (spec, study dir) -> (verdicts, report.html)


def resolve_model(spec: StudySpec, study_dir: Path, emit: Emit) -> Path:
    """The model file: the spec's path, or the preset synthesized once into ``study_dir/models``."""
    if spec.model_path is not None:
        if not spec.model_path.is_file():
            raise XoverError(f"model {spec.model_path} does not exist: fix [model] path in the spec")
        return spec.model_path
    from xover.gguf.presets import preset
    from xover.gguf.synth import write_model

    shape = preset(str(spec.model_preset))
    path = study_dir / "models" / f"{spec.model_preset}.gguf"
    if path.is_file():
        emit(StageEvent("model", "info", f"{path.name} already synthesized"))
        return path
    emit(StageEvent("model", "info", f"synthesizing {spec.model_preset}"))
    write_model(shape, path, seed=0, progress=lambda d, t: emit(StageEvent("model", "progress", "", d, t)))
    return path


def server_timeout(spec: StudySpec) -> float:
    """Seconds a study waits for a llama-server to answer ``/health``: the spec's ``timeout`` (which
    bounds a llama-bench configuration, model load included, alike), else 600."""
    return spec.timeout_s if spec.timeout_s is not None else DEFAULT_SERVER_TIMEOUT_S


def _offload_configs(configs: Sequence[LlamaConfig]) -> list[Any]:
    from xover.analysis.theory import config_from_flags

    return [config_from_flags(c.bench_config().fields, c.env, c.server_args) for c in configs]


def stage_theory(spec: StudySpec, model: Path, store: Store, emit: Emit) -> None:
    """Theory and a prediction, stored before any measurement (skipped if one is stored already)."""
    if store.artifacts("prediction"):
        emit(StageEvent("theory", "info", "prediction already stored"))
        return
    from xover.analysis.theory import build_prediction, model_terms
    from xover.gguf.inspect import inspect_gguf, model_table
    from xover.gguf.shapes import total_bytes
    from xover.hardware.detect import resolve as resolve_hw

    store.add_artifact(None, "inspect", inspect_gguf(model).to_dict())
    table, name = model_table(model)
    # The theory's view of the model, so the report can predict from the store alone (the translation of
    # measurements to other machines) without the model file.
    store.add_artifact(None, "model-terms", dataclasses.asdict(model_terms(table)))
    measure = spec.hardware == "measure"
    hw, _ = resolve_hw(None if measure else spec.hardware, measure)
    now = time.time_ns()
    prediction = build_prediction(
        model_terms(table),
        hw,
        _offload_configs(spec.configs),
        list(spec.lengths),
        model={"name": name, "source": str(model), "total_bytes": total_bytes(table)},
        created_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        created_unix_ns=now,
        response=spec.response_tokens[0],
        pp_tokens=spec.pp,
    )
    # The study's own labels, so the report can match predictions to measured configurations.
    for entry, config in zip(prediction.get("configs", []), spec.configs):
        entry["study_label"] = config.name
    store.add_artifact(None, "prediction", prediction)
    emit(StageEvent("theory", "info", f"prediction stored for {len(spec.configs)} configurations"))


def stage_tune(
    spec: StudySpec,
    model: Path,
    binaries: Binaries,
    study_dir: Path,
    fresh: bool,
    command: Sequence[str],
    emit: Emit,
    fits: list[dict[str, Any]] | None = None,
) -> tuple[Any, ...]:
    """Each configuration's best settings (:mod:`xover.measure.tune`); returns the :class:`xover.measure.tune.Tuned`
    results. Under a budget, each trial of a ``fit`` configuration is placed for its own ubatch."""
    from xover.measure import fit, tune

    def on(status: str, detail: str, completed: float | None, total: float | None) -> None:
        emit(StageEvent("tune", status, detail, completed, total))

    place = fit.placer(model, fits or [])
    return tune.run_tune(spec, model, binaries, study_dir, command, fresh, on, place)


def stored_tuning(spec: StudySpec, study_dir: Path, emit: Emit) -> tuple[Any, ...]:
    """Tuning results already in the store, used when the tuning stage is skipped this time."""
    from xover.measure import tune

    with Store(study_dir) as store:
        found = tune.stored(store, spec.configs)
    if found:
        emit(StageEvent("tune", "info", f"using the stored tuned settings of {', '.join(found)}"))
    return tuple(found[c.name] for c in spec.configs if c.name in found)


def record_spec(spec: StudySpec, store: Store) -> None:
    """What the report needs of the spec (configuration order, headline pairs, responses, band), stored
    as artifact ``study`` when it changed, so the report rebuilds from the store alone."""
    previous = store.artifacts("study")
    before = previous[-1][2] if previous else {}
    # The full spec sets the order; an invocation narrowed with --configs keeps the order (and pairs) stored before.
    ours, theirs = [c.name for c in spec.configs], before.get("configs", [])
    names = ours if set(ours) >= set(theirs) else list(dict.fromkeys([*theirs, *ours]))
    body = {
        "configs": names,
        "pairs": [list(p) for p in spec.pairs] or before.get("pairs", []),
        "response_tokens": list(spec.response_tokens),
        "band": list(spec.band),
    }
    if spec.decode_tokens is not None:
        body["decode_tokens"] = spec.decode_tokens
    if body != before:
        store.add_artifact(None, "study", body)


def stage_bench(
    spec: StudySpec, model: Path, binaries: Binaries, study_dir: Path, fresh: bool, command: Sequence[str], emit: Emit
) -> int:
    from xover.measure import bench as benchrun
    from xover.measure.events import ConfigFailed, ConfigStarted, Progressed

    def on_event(ev: object) -> None:
        if isinstance(ev, Progressed):
            emit(StageEvent("bench", "progress", "", ev.completed, ev.total))
        elif isinstance(ev, ConfigStarted):
            emit(StageEvent("bench", "progress", f"llama-bench {ev.job.config.label}"))
        elif isinstance(ev, ConfigFailed):
            emit(StageEvent("bench", "fail", f"{ev.label}: {ev.reason}"))

    # One sweep per set of depths: a configuration placed for a shorter context (fit@8k) skips the deeper tests.
    groups: dict[tuple[int, ...], list[LlamaConfig]] = {}
    for c in spec.configs:
        groups.setdefault(spec.bench_depths_for(c), []).append(c)
    failures = 0
    for depths, configs in groups.items():
        if not depths:
            names = ", ".join(c.name for c in configs)
            emit(StageEvent("bench", "info", f"{names}: no bench depth fits its context; not benched"))
            continue
        sweep = benchrun.SweepSpec(
            model=model,
            depths=depths,
            n_prompt=spec.pp,
            n_gen=spec.tg,
            repetitions=spec.bench_repetitions,
            timeout_s=spec.timeout_s,
        )
        outcome = benchrun.run_sweep(
            sweep,
            binaries,
            study_dir,
            fresh=fresh,
            command=command,
            on_event=on_event,
            configs=[c.bench_config() for c in configs],
        )
        failures += len(outcome.failures)
    return failures


def missing_ttft(
    stored: Sequence[StoredSample],
    spec: StudySpec,
    model_key: str,
    config_key: str | Collection[str],
    fresh: bool,
    lengths: Sequence[int] | None = None,
) -> dict[int, int]:
    """Prompt length -> cold samples still needed (passing the cold check) for one configuration, given the
    study's stored samples (the read model's ``ttft_rows``), among ``lengths`` (default: the study's).
    ``config_key``: its key, or every stored key of the same server (:func:`same_server_keys`)."""
    lengths = spec.lengths if lengths is None else lengths
    have = Counter(s.length for s in ([] if fresh else _passed(stored, model_key, config_key)))
    return {L: spec.repetitions - have[L] for L in lengths if have[L] < spec.repetitions}


def same_server_keys(stored: Sequence[object], config: ServerConfig) -> frozenset[str]:
    """``config``'s key and the keys of the stored server configurations with its identity: the same server
    stored from another directory (a study copied or moved keeps its measurements)."""
    from xover.domain.llama_options import server_identity

    same = server_identity(config)
    return frozenset(
        {config.key} | {c.key for c in stored if isinstance(c, ServerConfig) and server_identity(c) == same}
    )


def _passed(stored: Sequence[StoredSample], model_key: str, config_key: str | Collection[str]) -> list[TtftSample]:
    """One configuration's stored cold samples that passed their cold check and completed."""
    keys = {config_key} if isinstance(config_key, str) else set(config_key)
    return [
        row.sample
        for row in stored
        if row.sample.config_key in keys
        and row.model_key == model_key
        and row.sample.mode == "cold"
        and row.sample.cache_ok
        and row.sample.error is None
    ]


def stored_medians(
    stored: Sequence[StoredSample], model_key: str, config_key: str | Collection[str]
) -> dict[int, float]:
    """Length -> median cold TTFT (s) of one configuration's stored samples that passed their cold check."""
    import statistics

    by_length: dict[int, list[float]] = {}
    for s in _passed(stored, model_key, config_key):
        if s.first_token_ns is not None:
            by_length.setdefault(s.length, []).append(s.first_token_ns / 1e9)
    return {L: statistics.median(v) for L, v in by_length.items()}


def stage_ttft(
    spec: StudySpec, model: Path, binaries: Binaries, study_dir: Path, fresh: bool, command: Sequence[str], emit: Emit
) -> int:
    """Cold TTFT for every configuration and length still missing; stores per-server efficiency
    (wall time, load time until /health answered, and the requests' own durations) as an artifact."""
    from xover.llamacpp.server import ServerSpec, context_size
    from xover.measure import ttft as ttftrun
    from xover.measure.events import ConfigFailed, PointSkipped, Rerun, SampleDone, ServerUp

    ctx = context_size(max(spec.lengths), max(spec.response_tokens))
    mk = model_id(model).key
    failures = 0
    data = None if fresh else load(study_dir)
    stored = () if data is None else data.ttft_rows
    with Store(study_dir) as store:
        todo = []
        for c in spec.configs:
            sspec = ServerSpec(
                model=model, label=c.name, ctx_size=c.max_context or ctx, extra_args=c.server_args_list(), env=c.env
            )
            keys = same_server_keys(() if data is None else data.configs, sspec.config())
            lengths = spec.lengths_for(c)
            if len(lengths) < len(spec.lengths):
                beyond = ", ".join(f"{L:,}" for L in spec.lengths if L not in lengths)
                emit(StageEvent("ttft", "info", f"{c.name}: placed for {c.max_context:,} tokens; not at {beyond}"))
            missing = missing_ttft(stored, spec, mk, keys, fresh, lengths)
            if missing and spec.max_ttft_s is not None:  # lengths the stored samples already put over the cap
                medians = stored_medians(stored, mk, keys)
                for L in sorted(missing):
                    est = ttftrun.linear_estimate(L, medians)
                    if est is not None and est[0] > spec.max_ttft_s:
                        del missing[L]
                        emit(
                            StageEvent(
                                "ttft",
                                "info",
                                f"{c.name} L={L:,}: not measured, about {est[0]:.0f} s by the stored "
                                f"{est[1]:,}-token samples, over max-ttft {spec.max_ttft_s:.0f} s",
                            )
                        )
            if missing:
                todo.append((c, sspec, missing, keys))
            else:
                emit(StageEvent("ttft", "info", f"{c.name}: every length already has {spec.repetitions} cold samples"))
        total = sum(sum(m.values()) for _, _, m, _ in todo)
        done = 0
        for c, sspec, missing, keys in todo:
            # One server per configuration; the repetitions still missing at each length.
            reps = max(missing.values())
            lengths = tuple(sorted(missing))
            plan = ttftrun.TtftPlan(
                lengths=lengths,
                reps=reps,
                response_tokens=spec.generated_tokens,
                mode="cold",
                seed=time.time_ns() % 2**31,
                points=tuple(ttftrun.TtftPoint(L, r) for r in range(reps) for L in lengths if r < missing[L]),
                max_ttft_s=spec.max_ttft_s,
                known=tuple((sspec.config().key, L, m) for L, m in stored_medians(stored, mk, keys).items()),
            )

            t_start = time.perf_counter()
            t_up: list[float] = []
            busy_ns: list[int] = []

            def on_event(
                ev: object, label: str = c.name, t_up: list[float] = t_up, busy_ns: list[int] = busy_ns
            ) -> None:
                nonlocal done
                if isinstance(ev, ServerUp):
                    t_up.append(time.perf_counter())
                if isinstance(ev, SampleDone) and ev.sample.end_ns is not None:
                    busy_ns.append(ev.sample.end_ns)
                if isinstance(ev, SampleDone) and ev.check is None and ev.sample.error is None:
                    done += 1
                    emit(StageEvent("ttft", "progress", f"{label} L={ev.sample.length}", done, total))
                elif isinstance(ev, ConfigFailed):
                    emit(StageEvent("ttft", "fail", f"{label}: {ev.reason}"))
                elif isinstance(ev, Rerun):
                    emit(StageEvent("ttft", "progress", f"{label} L={ev.length}: re-run ({ev.reason})"))
                elif isinstance(ev, PointSkipped):
                    done += 1
                    emit(
                        StageEvent(
                            "ttft",
                            "progress",
                            f"{label} L={ev.length} skipped: about {ev.estimate_s:.0f} s > max-ttft "
                            f"{ev.max_ttft_s:.0f} s",
                            done,
                            total,
                        )
                    )

            run = ttftrun.TtftRun(store, plan, command, binaries=binaries, model=model, on_event=on_event)
            outcome = asyncio.run(run.run_managed([sspec], study_dir / "logs", startup_timeout_s=server_timeout(spec)))
            failures += len(outcome.failures)
            wall = time.perf_counter() - t_start
            store.add_artifact(
                outcome.run_id,
                "ttft-efficiency",
                {
                    "label": c.name,
                    "wall_s": wall,
                    "load_s": (t_up[0] - t_start) if t_up else None,
                    "requests_s": sum(busy_ns) / 1e9,
                    "samples": len(busy_ns),
                },
            )
    return failures


def stage_cache(
    spec: StudySpec, model: Path, binaries: Binaries, study_dir: Path, fresh: bool, command: Sequence[str], emit: Emit
) -> int:
    """The prompt-cache lab on the first configuration, at ``cache_length`` (default: the longest length that
    configuration holds: a "fit" level is placed for one context)."""
    from xover.measure import cachelab
    from xover.measure.events import ConfigFailed, LabRequestDone

    config = spec.configs[0]
    length = spec.cache_length_for(config, cachelab.lab_context)
    if length is None:
        asked = spec.cache_length or min(spec.lengths)
        emit(
            StageEvent(
                "cache",
                "info",
                f"skipped: {config.name} is placed for {config.max_context:,} tokens and the lab's "
                f"{asked:,}-token prompts need a {cachelab.lab_context(asked):,}-token context",
            )
        )
        return 0
    if length < cachelab.MIN_LENGTH:
        emit(StageEvent("cache", "info", f"skipped: the lab needs prompts of at least {cachelab.MIN_LENGTH} tokens"))
        return 0
    only = None
    if not fresh:
        done = cachelab.complete_scenarios(load(study_dir).ttft, config.name, length)
        if done >= set(cachelab.CASES):
            emit(StageEvent("cache", "info", f"{config.name}: cache lab already measured"))
            return 0
        only = [case for case in cachelab.CASES if case not in done]
        if done:
            emit(StageEvent("cache", "info", f"{config.name}: cache lab resumes with {', '.join(only)}"))

    def on_event(ev: object) -> None:
        if isinstance(ev, LabRequestDone):
            emit(StageEvent("cache", "progress", ev.scenario, ev.done, ev.total))
        elif isinstance(ev, ConfigFailed):
            emit(StageEvent("cache", "fail", f"{ev.scenario}: {ev.reason}"))

    outcome = cachelab.run_cache_lab(
        study_dir,
        binaries,
        model,
        length,
        config.server_args_list(),
        config.name,
        env=config.env,
        command=command,
        startup_timeout_s=server_timeout(spec),
        on_event=on_event,
        only=only,
    )
    return len(outcome.failures)


def stage_session(
    spec: StudySpec, model: Path, binaries: Binaries, study_dir: Path, fresh: bool, command: Sequence[str], emit: Emit
) -> int:
    """Replay one generated agentic session per configuration and cache mode (recorded replies:
    synthetic models' own replies re-tokenize into many more tokens than they were)."""
    from xover.domain.workload import WorkloadSpec
    from xover.gguf.inspect import model_context
    from xover.measure import session as sessionrun
    from xover.measure.events import ConfigFailed, TurnDone

    target = spec.session_target_tokens or max(spec.lengths)
    system = spec.session_system_tokens or min(10240, max(256, target // 4))
    # Sizes are estimated as characters per token: about 4 for English and code on a real vocabulary, 1 on the
    # byte-level vocabulary of xover's synthetic models (as `xover session` estimates them).
    cpt = 1.0 if model_context(model).byte_vocab else 4.0
    workload = sessionrun.write_workload(
        study_dir,
        WorkloadSpec(seed=0, turns=spec.session_turns, system_tokens=system, target_tokens=target, chars_per_token=cpt),
    )
    if not fresh and load(study_dir).turn_rows:
        emit(StageEvent("session", "info", "session already replayed"))
        return 0
    total = spec.session_turns * len(spec.configs) * len(sessionrun.MODES)
    done = 0

    def on_event(ev: object) -> None:
        nonlocal done
        if isinstance(ev, TurnDone):
            done += 1
            emit(StageEvent("session", "progress", "", done, total))
        elif isinstance(ev, ConfigFailed):
            emit(StageEvent("session", "fail", f"{ev.label} {ev.mode}: {ev.reason}"))

    outcome = sessionrun.run_session(
        study_dir,
        binaries,
        model,
        workload,
        [(c.name, c.server_args_list()) for c in spec.configs],
        response_tokens=spec.session_response_tokens,
        max_context={c.name: c.max_context for c in spec.configs if c.max_context is not None},
        exact=True,
        command=command,
        startup_timeout_s=server_timeout(spec),
        on_event=on_event,
    )
    return len(outcome.failures)


def run_study(
    spec: StudySpec,
    study_dir: Path,
    binaries: Binaries,
    *,
    fresh: bool = False,
    command: Sequence[str] = (),
    emit: Emit = lambda e: None,
    report: Reporter | None = None,
) -> StudyOutcome:
    """Every stage of ``spec`` in order; ``report`` renders the report from the store (the CLI passes
    :func:`xover.cli.study.write_report`: only the CLI imports the report package) and returns its verdicts."""
    study_dir.mkdir(parents=True, exist_ok=True)
    from xover.hardware.vram import holding

    with holding(spec.vram_budget) as hold:  # every llama process of the study sees a card of the budget's size
        if hold is not None:
            emit(StageEvent("model", "info", hold.describe()))
        return _run_stages(spec, study_dir, binaries, fresh, command, emit, report)


def _check_fits(
    spec: StudySpec,
    configs: tuple[LlamaConfig, ...],
    records: list[dict[str, Any]],
    suffix: str,
    model: Path,
    binaries: Binaries,
    study_dir: Path,
    fresh: bool,
    emit: Emit,
) -> tuple[LlamaConfig, ...]:
    """llama.cpp's word on the planner's levels (artifacts ``fit{suffix}`` and ``fit-check{suffix}``), asked
    once per set of levels and reused on resume; ``configs`` at the levels they are measured at."""
    from xover.measure import fit

    if not records:
        return configs
    with Store(study_dir) as store:
        checked = [body for _, _, body in store.artifacts("fit-check" + suffix)]
        planned = [(r["config"], r["n_cpu_moe"], r["n_ctx"]) for r in records]
        if checked and not fresh and [(c["config"], c["n_cpu_moe"], c["n_ctx"]) for c in checked[-1]] == planned:
            checks = checked[-1]
        else:
            for r in records:
                emit(StageEvent("model", "info", fit.describe(r)))
            store.add_artifact(None, "fit" + suffix, records)
            checks = fit.check_fits(
                spec,
                configs,
                model,
                binaries,
                records,
                study_dir / "logs",
                lambda line: emit(StageEvent("model", "info", line)),
            )
            store.add_artifact(None, "fit-check" + suffix, checks)
    return fit.apply_checks(configs, checks)


def _run_stages(
    spec: StudySpec,
    study_dir: Path,
    binaries: Binaries,
    fresh: bool,
    command: Sequence[str],
    emit: Emit,
    report: Reporter | None,
) -> StudyOutcome:
    seconds: dict[str, float] = {}
    failures = 0

    def timed(stage: str, fn: Callable[[], Any]) -> Any:
        if stage in spec.skip:
            emit(StageEvent(stage, "skip", "skipped by the spec"))
            return None
        emit(StageEvent(stage, "start"))
        t0 = time.perf_counter()
        result = fn()
        seconds[stage] = time.perf_counter() - t0
        emit(StageEvent(stage, "done", f"{seconds[stage]:.1f} s"))
        return result

    model = timed("model", lambda: resolve_model(spec, study_dir, emit))
    from xover.measure import fit

    fits: list[dict[str, Any]] = []
    if fit.has_fits(spec):
        spec, fits = fit.resolve_fits(spec, model)
        configs = _check_fits(spec, spec.configs, fits, "", model, binaries, study_dir, fresh, emit)
        spec = dataclasses.replace(spec, configs=configs)
    from xover.gguf.inspect import check_offload_and_context

    check_offload_and_context(
        model, [int(c.flag("-ncmoe") or 0) for c in spec.configs], max(spec.lengths) + max(spec.response_tokens)
    )
    with Store(study_dir) as store:
        record_spec(spec, store)
        timed("theory", lambda: stage_theory(spec, model, store, emit))
    if spec.tune:
        tuned = timed("tune", lambda: stage_tune(spec, model, binaries, study_dir, fresh, command, emit, fits))
    else:
        emit(StageEvent("tune", "skip", "tune = false in the spec"))
        tuned = None
    if tuned is None:
        tuned = stored_tuning(spec, study_dir, emit)
    from xover.measure.tune import variants

    # Every stage below measures each configuration at its defaults and, where tuning changed a knob, tuned.
    tuned_configs = variants(tuned)
    if fits:  # a tuned fit configuration is placed again for its own settings (a larger ubatch needs more VRAM)
        tuned_configs, refits = fit.refit_variants(spec, model, fits, tuned_configs)
        tuned_configs = _check_fits(spec, tuned_configs, refits, "-tuned", model, binaries, study_dir, fresh, emit)
        from xover.analysis.advise import server_command

        placed = {c.name: c for c in tuned_configs}
        tuned = [
            dataclasses.replace(
                t, variant=placed[t.variant.name], server_command=server_command(placed[t.variant.name], model.name)
            )
            if t.variant is not None and t.variant.name in placed
            else t
            for t in tuned
        ]
    measured = dataclasses.replace(spec, configs=spec.configs + tuned_configs)
    failures += timed("bench", lambda: stage_bench(measured, model, binaries, study_dir, fresh, command, emit)) or 0
    failures += timed("ttft", lambda: stage_ttft(measured, model, binaries, study_dir, fresh, command, emit)) or 0
    failures += timed("cache", lambda: stage_cache(spec, model, binaries, study_dir, fresh, command, emit)) or 0
    failures += timed("session", lambda: stage_session(spec, model, binaries, study_dir, fresh, command, emit)) or 0
    with Store(study_dir) as store:
        store.add_artifact(None, "stage-seconds", seconds)
    verdicts: tuple[str, ...] = ()
    html: Path | None = None
    res = timed("report", lambda: report(spec, study_dir)) if report is not None else None
    if res is not None:
        verdicts, html = res
    return StudyOutcome(study_dir, model, verdicts, html, seconds, failures, tuple(tuned))


# A typical local GPU, for a default study on a card so large that nothing needs offloading.
CONSUMER_VRAM_BYTES = 24 << 30


def gpu_default_spec(free_vram_bytes: int, preset: str = "qwen3-30b-a3b") -> StudySpec:
    """The default study on a GPU machine: the seed's question with offload levels chosen by the
    placement planner for this GPU's free memory: the smallest ``--n-cpu-moe`` that fits an 8K
    context against the one a 32K context forces. When both are the same (a card big enough for
    everything), the second level is what a 24 GiB card would need at 32K, so the study still
    measures a real offload penalty."""
    from xover.analysis.theory import model_terms, plan_placement
    from xover.gguf.presets import preset as get_preset
    from xover.gguf.shapes import tensor_table

    terms = model_terms(tensor_table(get_preset(preset)))
    short, long_ = (p.n_cpu_moe for p in plan_placement(terms, free_vram_bytes, (8192, 32768 + 512)))
    if short is None or long_ is None:
        raise XoverError(
            f"{preset} does not fit this GPU's {free_vram_bytes / 2**30:.1f} GiB free even with every "
            "expert on the CPU: write a spec with a smaller model (examples/*.toml)"
        )
    if short == long_:
        (alt,) = (p.n_cpu_moe for p in plan_placement(terms, min(free_vram_bytes, CONSUMER_VRAM_BYTES), (32768 + 512,)))
        long_ = alt if alt is not None and alt != short else short + max(1, terms.n_layer // 4)
    return StudySpec(
        configs=tuple(
            LlamaConfig(name=f"ncmoe={n}", flags=(("-ncmoe", str(n)), ("-ngl", "99"))) for n in (short, long_)
        ),
        model_preset=preset,
        lengths=(1024, 4096, 16384, 32768),
        response_tokens=(200,),
        repetitions=3,
        bench_repetitions=3,
    )
