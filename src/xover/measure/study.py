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

import dataclasses
import time
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any

from xover.analysis.pairs import headline, told_pairs
from xover.analysis.theory import TheoryInputs, build_prediction, model_terms, offload_of
from xover.analysis.your_turns import recorded_turns, study_sizes, summarize
from xover.domain import artifacts, llama_options
from xover.domain.artifacts import WORKLOAD, StudyRecord, WorkloadRecord
from xover.domain.config import LlamaConfig
from xover.domain.presets import preset
from xover.domain.shapes import total_bytes
from xover.domain.study_spec import STAGE_ORDER, StudySpec  # noqa: F401 (STAGE_ORDER re-exported)
from xover.domain.turn_shape import recorded_of, turn_count
from xover.domain.units import format_tokens
from xover.domain.workload import WorkloadSpec, session_id
from xover.errors import XoverError
from xover.gguf.inspect import check_offload_and_context, inspect_gguf, model_context, model_table
from xover.gguf.synth import write_model
from xover.hardware.detect import resolve as resolve_hw
from xover.hardware.vram import holding
from xover.llamacpp.bench import list_devices
from xover.llamacpp.binaries import Binaries
from xover.measure import bench as benchrun
from xover.measure import cachelab, fit, tune
from xover.measure import session as sessionrun
from xover.measure.cold import stage_ttft
from xover.measure.context import DEFAULT_SERVER_TIMEOUT_S, Emit, StageEvent, Study, server_timeout  # noqa: F401 (re-exported: the stages' context and events)
from xover.measure.events import ConfigFailed, ConfigStarted, LabRequestDone, Progressed, TurnDone
from xover.measure.resume import distinct, missing_ttft, stored_checks, stored_medians, ttft_todo  # noqa: F401 (missing_ttft, stored_medians re-exported)
from xover.measure.tune import variants
from xover.results.read_model import load_if_any
from xover.results.store import Store


@dataclasses.dataclass(frozen=True)
class StudyOutcome:
    study_dir: Path
    model: Path
    verdicts: tuple[str, ...]
    report_html: Path | None
    stage_seconds: dict[str, float]
    failures: int
    tuned: tuple[Any, ...] = ()  # xover.measure.tune.Tuned, one per configuration tuned (or found tuned in the store)


Reporter = Callable[[StudySpec, Path], tuple[tuple[str, ...], Path]]  # (spec, study dir) -> (verdicts, report.html)


def resolve_model(spec: StudySpec, study_dir: Path, emit: Emit) -> Path:
    """The model file: the spec's path, or the preset synthesized once into ``study_dir/models``."""
    if spec.model_path is not None:
        if not spec.model_path.is_file():
            raise XoverError(f"model {spec.model_path} does not exist: fix [model] path in the spec")
        return spec.model_path

    shape = preset(str(spec.model_preset))
    path = study_dir / "models" / f"{spec.model_preset}.gguf"
    if path.is_file():
        emit(StageEvent("model", "info", f"{path.name} already synthesized"))
        return path
    emit(StageEvent("model", "info", f"synthesizing {spec.model_preset}"))
    write_model(shape, path, seed=0, progress=lambda d, t: emit(StageEvent("model", "progress", "", d, t)))
    return path


def stage_theory(st: Study) -> None:
    """Theory and a prediction, stored before any measurement (skipped if one is stored already)."""
    spec, model, emit = st.spec, st.model, st.emit
    if load_if_any(st.study_dir).prediction() is not None:
        emit(StageEvent("theory", "info", "prediction already stored"))
        return

    table, name = model_table(model)
    measure = spec.hardware == "measure"
    hw, _ = resolve_hw(None if measure else spec.hardware, measure)
    now = time.time_ns()
    prediction = build_prediction(
        TheoryInputs(
            model_terms(table),
            hw,
            tuple(offload_of(c) for c in spec.configs),
            tuple(spec.lengths),
            model={"name": name, "source": str(model), "total_bytes": total_bytes(table)},
            created_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            created_unix_ns=now,
            response=spec.response_tokens[0],
            pp_tokens=spec.pp,
        )
    )
    # The study's own labels, so the report can match predictions to measured configurations.
    for entry, config in zip(prediction.get("configs", []), spec.configs):
        entry["study_label"] = config.name
    with Store(st.study_dir) as store:
        store.add_artifact(None, "inspect", inspect_gguf(model).to_dict())
        # The theory's view of the model, so the report can predict from the store alone (the translation of
        # measurements to other machines) without the model file.
        store.add_artifact(None, "model-terms", dataclasses.asdict(model_terms(table)))
        store.add_artifact(None, artifacts.PREDICTION, prediction)
    emit(StageEvent("theory", "info", f"prediction stored for {len(spec.configs)} configurations"))


def stage_tune(st: Study, fits: list[dict[str, Any]] | None = None) -> tuple[Any, ...]:
    """Each configuration's best settings (:mod:`xover.measure.tune`); returns the :class:`xover.measure.tune.Tuned`
    results. Under a budget, each trial of a ``fit`` configuration is placed for its own ubatch."""

    def on(status: str, detail: str, completed: float | None, total: float | None) -> None:
        st.emit(StageEvent("tune", status, detail, completed, total))

    place = fit.placer(st.terms, fits or [])
    return tune.run_tune(st.spec, st.model, st.binaries, st.study_dir, st.command, st.fresh_in("tune"), on, place)


def stored_tuning(st: Study) -> tuple[Any, ...]:
    """Tuning results already in the store, used when the tuning stage is skipped this time."""

    found = tune.stored(load_if_any(st.study_dir), st.spec.configs)
    if found:
        st.emit(StageEvent("tune", "info", f"using the stored tuned settings of {', '.join(found)}"))
    return tuple(found[c.name] for c in st.spec.configs if c.name in found)


def record_spec(spec: StudySpec, study_dir: Path, same_as: tuple[tuple[str, str], ...] = ()) -> None:
    """What the report needs of the spec (configuration order, headline pairs, responses, band), stored
    as artifact ``study`` when it changed, so the report rebuilds from the store alone."""
    before = load_if_any(study_dir).study_record()
    # The full spec sets the order; an invocation narrowed with --configs keeps the order (and pairs) stored before.
    ours, theirs = [c.name for c in spec.configs], list(before.configs) if before is not None else []
    names = ours if set(ours) >= set(theirs) else list(dict.fromkeys([*theirs, *ours]))
    record = StudyRecord(
        configs=tuple(names),
        pairs=tuple(spec.pairs) or (before.pairs if before is not None else ()),
        response_tokens=tuple(spec.response_tokens),
        band=(spec.band[0], spec.band[1]),
        decode_tokens=spec.decode_tokens,
        same_as=same_as,
        commands=tuple(spec.commands) or (before.commands if before is not None else ()),
    )
    if record != before:
        with Store(study_dir) as store:
            store.add_artifact(None, artifacts.STUDY, record.to_body())


def stage_bench(st: Study) -> int:
    spec, emit = st.spec, st.emit

    def on_event(ev: object) -> None:
        if isinstance(ev, Progressed):
            emit(StageEvent("bench", "progress", "", ev.completed, ev.total))
        elif isinstance(ev, ConfigStarted):
            emit(StageEvent("bench", "progress", f"llama-bench {ev.job.config.label}"))
        elif isinstance(ev, ConfigFailed):
            emit(StageEvent("bench", "fail", f"{ev.label}: {ev.reason}"))

    # One sweep per set of depths: a configuration placed for a shorter context (fit@8k) skips the deeper tests.
    groups: dict[tuple[int, ...], list[LlamaConfig]] = {}
    skipped = _not_benched(st)
    for c in spec.configs:
        if c.name in skipped:
            emit(StageEvent("bench", "info", f"{c.name}: {skipped[c.name]}"))
            continue
        groups.setdefault(spec.bench_depths_for(c), []).append(c)
    failures = 0
    for depths, configs in groups.items():
        if not depths:
            names = ", ".join(c.name for c in configs)
            emit(StageEvent("bench", "info", f"{names}: no bench depth fits its context; not benched"))
            continue
        sweep = benchrun.BenchTests(
            model=st.model,
            depths=depths,
            n_prompt=spec.pp,
            n_gen=spec.tg,
            repetitions=spec.bench_repetitions,
            timeout_s=spec.timeout_s,
        )
        outcome = benchrun.run_sweep(
            sweep, configs, st.binaries, st.study_dir, fresh=st.fresh_in("bench"), command=st.command, on_event=on_event
        )
        failures += len(outcome.failures)
    return failures


def _not_benched(st: Study) -> dict[str, str]:
    """The tuned variants llama-bench cannot measure where their server runs (:func:`xover.measure.fit.not_benched`)."""

    return fit.not_benched(load_if_any(st.study_dir).fit_records(artifacts.TUNED, checked=True) or ())


def verdict_pairs(
    spec: StudySpec, tuned: dict[str, str], for_decode: dict[str, str] | None = None
) -> list[tuple[str, str]]:
    """The pairs a study's verdicts answer (:func:`xover.analysis.pairs.told_pairs`, the rule the report tells them
    by): the ones whose open questions earn more rounds. ``tuned``: configuration -> its tuned variant;
    ``for_decode``: configuration -> its variant tuned for the other kind of turn."""

    for_decode = for_decode or {}
    variants = {*tuned.values(), *for_decode.values()}
    names = [c.name for c in spec.configs if c.name not in variants]
    told = told_pairs(headline(spec.pairs, names), names, tuned, for_decode, bool(tuned or for_decode))
    return list(dict.fromkeys((a, b) for _, a, b in told))


def stage_cache(st: Study) -> int:
    """The prompt-cache lab on the first configuration, at ``cache_length`` (default: the longest length that
    configuration holds: a "fit" level is placed for one context)."""
    spec, emit = st.spec, st.emit

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
    if not st.fresh_in("cache"):
        done = cachelab.complete_scenarios(load_if_any(st.study_dir).ttft, config.name, length)
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
        st.study_dir,
        st.binaries,
        st.model,
        length,
        config,
        command=st.command,
        startup_timeout_s=server_timeout(spec),
        on_event=on_event,
        only=only,
    )
    return len(outcome.failures)


def stage_session(st: Study) -> int:
    """Replay one generated agentic session per configuration and cache mode (recorded replies:
    synthetic models' own replies re-tokenize into many more tokens than they were)."""
    spec, model, study_dir, emit = st.spec, st.model, st.study_dir, st.emit

    modes: tuple[str, ...]
    if spec.workload is not None:  # the user's recording, once per configuration at the server's default cache
        workload, modes = spec.workload, ("default",)
        turns = turn_count(workload.read_text(encoding="utf-8"), str(workload))
    else:
        system, target = spec.session_sizes
        # Sizes are estimated as characters per token: about 4 for English and code on a real vocabulary, 1 on the
        # byte-level vocabulary of xover's synthetic models (as `xover session` estimates them).
        cpt = 1.0 if model_context(model).byte_vocab else 4.0
        workload = sessionrun.write_workload(
            study_dir,
            WorkloadSpec(seed=0, turns=spec.session_turns, system_tokens=system, target_tokens=target,
                         chars_per_token=cpt),
        )  # fmt: skip
        modes, turns = sessionrun.MODES, spec.session_turns
    if not st.fresh_in("session") and load_if_any(study_dir).turn_rows:
        emit(StageEvent("session", "info", "session already replayed"))
        return 0
    total = turns * len(spec.configs) * len(modes)
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
        st.binaries,
        model,
        workload,
        spec.configs,
        modes,
        response_tokens=spec.session_response_tokens,
        exact=True,
        command=st.command,
        startup_timeout_s=server_timeout(spec),
        on_event=on_event,
    )
    return len(outcome.failures)


def run_study(
    spec: StudySpec,
    study_dir: Path,
    binaries: Binaries,
    *,
    fresh: bool | Collection[str] = False,
    command: Sequence[str] = (),
    emit: Emit = lambda e: None,
    report: Reporter | None = None,
) -> StudyOutcome:
    """Every stage of ``spec`` in order; ``report`` renders the report from the store (the CLI passes
    :func:`xover.cli.study.write_report`: only the CLI imports the report package) and returns its verdicts.
    ``fresh``: True measures every stage again, a collection of stage names those stages (``model`` stands for the
    placement's check by llama.cpp); what is stored stays, and the cold TTFT stage adds new rounds after it."""
    study_dir.mkdir(parents=True, exist_ok=True)

    with holding(spec.vram_budget) as hold:  # every llama process of the study sees a card of the budget's size
        if hold is not None:
            emit(StageEvent("model", "info", hold.describe()))
        stages = frozenset(STAGE_ORDER) if fresh is True else frozenset(fresh or ())
        unknown = stages - set(STAGE_ORDER)
        if unknown:
            raise XoverError(f"--remeasure: unknown stage {sorted(unknown)[0]!r}; stages are {', '.join(STAGE_ORDER)}")
        return _Stages(spec, study_dir, emit).run(binaries, stages, tuple(command), report)


ENGINES_ARTIFACT = "engines"


def check_devices(config: LlamaConfig, binaries: Binaries) -> None:
    """Refuse, in one line and before anything runs, a configuration whose build is for a GPU backend that lists no
    device of it with the configuration's environment (``llama-bench --list-devices``): its numbers would be the
    CPU's. A build whose llama-bench cannot list devices is left to the check of every record and server."""
    backend = binaries.expected_backend
    if backend is None or not llama_options.backend_traits(backend).gpu:
        return
    devices = list_devices(binaries.bench, config.environment())
    traits = llama_options.backend_traits(backend)
    ran_on = llama_options.ran_on_server([d for d, _ in devices or ()])
    if devices is not None and llama_options.backend_problem(backend, ran_on, "llama-bench") is not None:
        seen = ", ".join(f"{d} ({desc})" for d, desc in devices) or "none"
        raise XoverError(
            f"[[config]] {config.name!r}: its {backend} build ({binaries.bin_dir}) lists no {traits.ggml_name} "
            f"device (llama-bench --list-devices: {seen}): {traits.no_device}"
        )


def sized_by_workload(spec: StudySpec, study_dir: Path, emit: Emit) -> StudySpec:
    """A study of a recording (``[study] workload``): the recording's turns stored (artifact ``workload``) and the
    spec's lengths, cached turns, their depth and the answer length drawn from them
    (:func:`xover.analysis.your_turns.study_sizes`); ``spec`` itself without one."""
    if spec.workload is None:
        return spec
    path = spec.workload
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise XoverError(f"cannot read the workload {path} ({e}): give a recording (xover record -o FILE)") from None
    turn_count(text, str(path))  # a malformed file is one line naming its line
    kind, recorded = recorded_of(text)
    turns = recorded_turns(recorded)
    if not turns:
        raise XoverError(
            f"{path} holds no recorded timings (a generated session?): record your agent's turns with xover record, "
            "or import a server's log with xover record --from-log"
        )
    sizes = study_sizes(turns)
    with Store(study_dir) as store:
        body = WorkloadRecord(path.name, session_id(text), kind, tuple((t.prompt, t.cached, t.answer) for t in turns))
        store.add_artifact(None, WORKLOAD, body.to_body())
    s = summarize(turns)
    emit(StageEvent("model", "info", (
        f"workload {path.name} ({kind}): {s.turns} turns, {s.cold} cold; new tokens a turn median "
        f"{format_tokens(round(s.new.median))} (90% {format_tokens(round(s.new.p90))}), cached prefix median "
        f"{format_tokens(round(s.depth.median))}, answers median {round(s.answer.median)} tokens; measured: cold "
        f"{', '.join(format_tokens(n) for n in sizes.lengths)}"
        + (f", cached turns of {', '.join(format_tokens(n) for n in sizes.cached_new_tokens)} new tokens on "
           f"{format_tokens(sizes.cached_depth)}" if sizes.cached_depth else "")
        + f", {sizes.response_tokens}-token answers")))  # fmt: skip
    return dataclasses.replace(
        spec,
        lengths=sizes.lengths,
        cached_new_tokens=sizes.cached_new_tokens,
        cached_depth=sizes.cached_depth,
        response_tokens=(sizes.response_tokens,),
        decode_tokens=None,
        session_response_tokens=sizes.response_tokens,
    )


def record_builds(spec: StudySpec, binaries: Binaries, study_dir: Path, emit: Callable[[StageEvent], None]) -> None:
    """A study whose configurations run on builds other than mainline's default (another engine, or a backend
    named): each build's binaries found (a one-line error naming the build to make, before anything runs) and their
    provenance stored (artifact ``engines``, a row per build: the engine, the backend asked for, the folder, how it
    was chosen, and for xover's builds the commit or sdist identity, backend, origin and cmake flags)."""
    builds = sorted({c.build for c in spec.configs}, key=lambda b: (b[0], b[1] or ""))
    if builds == [(llama_options.ENGINE, None)]:
        return
    rows = []
    for engine, backend in builds:
        b = binaries.for_build(engine, backend)
        m = b.manifest
        rows.append(
            {
                "engine": engine,
                "asked_backend": backend,
                "bin_dir": str(b.bin_dir),
                "source": b.source,
                "commit": m.commit if m else None,
                "backend": m.backend if m else b.backend,
                "origin": m.origin if m else None,
                "cmake_args": list(m.cmake_args) if m else None,
            }
        )
        build = f"{m.commit[:7]} ({m.backend}) from {m.origin}" if m else f"{b.source}"
        for config in (c for c in spec.configs if c.build == (engine, backend)):
            check_devices(config, b)
        emit(StageEvent("model", "info", f"{llama_options.build_name(engine, backend)}: {b.bin_dir} [{build}]"))
    with Store(study_dir) as store:
        store.add_artifact(None, ENGINES_ARTIFACT, rows)


def _check_fits(
    st: Study, configs: tuple[LlamaConfig, ...], records: list[dict[str, Any]], suffix: str
) -> tuple[tuple[LlamaConfig, ...], list[dict[str, Any]]]:
    """llama.cpp's word on the planner's levels (artifacts ``fit{suffix}`` and ``fit-check{suffix}``), asked
    once per set of levels and reused on resume (tuned variants: the level their own llama-server serves at); ``configs`` at the levels they are measured at, and the checked
    records (each with the compute buffer llama.cpp logged, which calibrates the placement of later trials)."""

    if not records:
        return configs, records
    stored = None if st.fresh_in("model") else stored_checks(load_if_any(st.study_dir), records, suffix)
    if stored is not None:
        return fit.apply_checks(configs, stored), stored
    for r in records:
        st.emit(StageEvent("model", "info", fit.describe(r)))
    with Store(st.study_dir) as store:
        store.add_artifact(None, artifacts.fit_artifact(suffix), records)

    def note(line: str) -> None:
        st.emit(StageEvent("model", "info", line))

    logs = st.study_dir / "logs"
    if suffix == artifacts.TUNED:  # a tuned variant runs at the level its own server serves, not llama-bench's
        checks = fit.place_by_server(st.spec, configs, st.model, st.binaries, records, st.terms, logs, note)
    else:
        checks = fit.check_fits(st.spec, configs, st.model, st.binaries, records, logs, note)
    with Store(st.study_dir) as store:
        store.add_artifact(None, artifacts.fit_artifact(suffix, checked=True), checks)
    return fit.apply_checks(configs, checks), checks


class _Stages:
    """One study's stages in order, each timed and skippable by the spec."""

    def __init__(self, spec: StudySpec, study_dir: Path, emit: Emit) -> None:
        self.spec, self.study_dir, self.emit = spec, study_dir, emit
        self.seconds: dict[str, float] = {}

    def timed(self, stage: str, fn: Callable[[], Any]) -> Any:
        if stage in self.spec.skip:
            self.emit(StageEvent(stage, "skip", "skipped by the spec"))
            return None
        self.emit(StageEvent(stage, "start"))
        t0 = time.perf_counter()
        result = fn()
        self.seconds[stage] = time.perf_counter() - t0
        self.emit(StageEvent(stage, "done", f"{self.seconds[stage]:.1f} s"))
        return result

    def run(
        self, binaries: Binaries, fresh: frozenset[str], command: tuple[str, ...], report: Reporter | None
    ) -> StudyOutcome:
        self.spec = sized_by_workload(self.spec, self.study_dir, self.emit)
        spec, emit = self.spec, self.emit
        started = time.perf_counter()
        record_builds(spec, binaries, self.study_dir, emit)  # before anything runs: each build found
        model = self.timed("model", lambda: resolve_model(spec, self.study_dir, emit))
        st = Study(spec, model, binaries, self.study_dir, fresh, command, emit, started=started)

        fits: list[dict[str, Any]] = []
        if fit.has_fits(spec):
            st = dataclasses.replace(st, terms=fit.model_terms(model))
            placed, fits = fit.resolve_fits(spec, st.terms)
            st = dataclasses.replace(st, spec=placed)
            checked, fits = _check_fits(st, placed.configs, fits, "")
            st = st.with_configs(checked)

        check_offload_and_context(
            model, [c.n_cpu_moe for c in st.spec.configs], max(spec.lengths) + max(spec.response_tokens)
        )
        st, same_as = self._distinct(st)
        record_spec(st.spec, self.study_dir, same_as)
        self.timed("theory", lambda: stage_theory(st))
        tuned, tuned_configs = self._tuned(st, fits)
        # Every stage below measures each configuration at its defaults and, where tuning changed a knob, tuned.
        measured, _ = self._distinct(st.with_configs(st.spec.configs + tuned_configs))
        failures = self.timed("bench", lambda: stage_bench(measured)) or 0

        variants = {t.config.name: t.variant.name for t in tuned if t.variant is not None}
        pairs = verdict_pairs(
            st.spec, variants, {t.config.name: t.decode_variant.name for t in tuned if t.decode_variant is not None}
        )
        # the report also tells each configuration against its tuned variant: rounds until they can be compared
        failures += self.timed("ttft", lambda: stage_ttft(measured, pairs, list(variants.items()))) or 0
        failures += self.timed("cache", lambda: stage_cache(st)) or 0
        failures += self.timed("session", lambda: stage_session(st)) or 0
        with Store(self.study_dir) as store:
            store.add_artifact(None, "stage-seconds", self.seconds)
        verdicts: tuple[str, ...] = ()
        html: Path | None = None
        res = self.timed("report", lambda: report(st.spec, self.study_dir)) if report is not None else None
        if res is not None:
            verdicts, html = res
        return StudyOutcome(self.study_dir, model, verdicts, html, self.seconds, failures, tuple(tuned))

    def _distinct(self, st: Study) -> tuple[Study, tuple[tuple[str, str], ...]]:
        """Each configuration measured once (:func:`xover.measure.resume.distinct`), saying which were the same."""
        spec, same_as = distinct(st.spec)
        for name, kept in same_as:
            self.emit(
                StageEvent("model", "info", f"{name} asks llama.cpp the same as {kept}: measured once, as {kept}")
            )
        return dataclasses.replace(st, spec=spec), same_as

    def _tuned(self, st: Study, fits: list[dict[str, Any]]) -> tuple[list[Any], tuple[LlamaConfig, ...]]:
        """The tuning results (searched now, or stored) and the tuned variants to measure, placed again for their
        own settings under a budget (a larger ubatch needs more VRAM)."""

        tuned = None
        if st.spec.tune:
            tuned = self.timed("tune", lambda: stage_tune(st, fits))
        else:
            self.emit(StageEvent("tune", "skip", "tune = false in the spec"))
        if tuned is None:
            tuned = stored_tuning(st)
        tuned_configs = variants(tuned)
        if not fits:
            return list(tuned), tuned_configs
        tuned_configs, refits = fit.refit_variants(st.spec, st.terms, fits, tuned_configs)
        tuned_configs, _ = _check_fits(st, tuned_configs, refits, artifacts.TUNED)
        placed = {c.name: c for c in tuned_configs}

        def replaced(t: Any) -> Any:
            if t.variant is not None and t.variant.name in placed:
                v = placed[t.variant.name]
                t = dataclasses.replace(t, variant=v, server_command=v.server_command(st.model.name))
            if t.decode_variant is not None and t.decode_variant.name in placed:
                t = dataclasses.replace(t, decode_variant=placed[t.decode_variant.name])
            return t

        return [replaced(t) for t in tuned], tuned_configs
