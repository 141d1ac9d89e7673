"""The tuning stage of ``xover study``: each configuration's best llama.cpp settings, found on the study's
own workload, so that the study answers its question for tuned configurations beside llama.cpp's defaults.

For each configuration of the spec, :func:`xover.analysis.advise.coordinate_search` varies the knobs of
:func:`xover.analysis.advise.study_knobs` (load mode, ubatch with batch, op offload and its threshold, threads, flash
attention) one at a time on top of the configuration's own flags. Its objective is the expected time per turn
over the study's prompt lengths and response length, estimated from llama-bench ``pp`` and ``tg`` tests at
depth 0 and the ``tune-depths`` (short ones by default: llama-bench's depth prefill is untimed but not free;
the sweep that follows measures every length through llama-server). A knob is kept only when it beats the
defaults by more than the noise (repetition spread and the drift of the defaults measured again).

When the recommendation differs from the defaults, the configuration gets a variant named
``"<name> tuned"`` that the rest of the study measures like any configuration. The search's own measurements go
to a store of their own (``<study>/tune/results.sqlite``), so they never mix with the study's tables; what the
report needs (every trial's samples, each knob's verdict, the tuned flags) is stored in the study's store as
artifact ``tune``, one per configuration. A rerun reuses a stored result whose configuration is unchanged.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

from xover.analysis import advise
from xover.analysis.rounds import RatioInterval, can_still_fall_below_one, order, paired_ratio, possessive
from xover.domain import artifacts
from xover.domain import llama_options as opts
from xover.domain.artifacts import TuneRecord
from xover.domain.codec import decode
from xover.domain.config import LlamaConfig
from xover.domain.shapes import TensorInfo
from xover.domain.study_spec import StudySpec
from xover.errors import XoverError
from xover.gguf.inspect import model_table
from xover.hardware.detect import cpu_flags
from xover.llamacpp.binaries import Binaries
from xover.measure.advise import AdviseSpec, _Runner, is_gpu_build
from xover.measure.events import Measured, Measuring, Note
from xover.results.read_model import StudyData, load_if_any
from xover.results.store import Store

ARTIFACT = artifacts.TUNE
SCHEMA = artifacts.TUNE_SCHEMA
SUFFIX = " tuned"
DECODE_SUFFIX = " tuned for decode"
CACHED_SUFFIX = artifacts.FOR_CACHED_SUFFIX
SUBDIR = "tune"


def variant_name(config: str) -> str:
    return config + SUFFIX


def decode_variant_name(config: str, part: str = "decode") -> str:
    """The variant tuned for the second kind of turn: decode-heavy turns (``part`` "decode"), or the study's cached
    agentic turns ("cached")."""
    return config + (CACHED_SUFFIX if part == "cached" else DECODE_SUFFIX)


def base_name(variant: str) -> str:
    """The configuration a tuned variant (any kind) was tuned from."""
    for suffix in (DECODE_SUFFIX, CACHED_SUFFIX, SUFFIX):
        if variant.endswith(suffix):
            return variant.removesuffix(suffix)
    return variant


def _resolve(name: str, knobs: Sequence[advise.Knob]) -> advise.Knob | None:
    return next((k for k in knobs if name in (k.name, k.short)), None)


def knobs_for(spec: StudySpec, gpu_build: bool, engine: str = opts.ENGINE) -> tuple[advise.Knob, ...]:
    """The knobs the spec asks to search on ``engine`` (its own knobs included, each in its spelling), with its
    candidate values. A knob named in ``tune-knobs`` is searched even where the build makes it moot (the search then
    reports it as having no effect); one the engine does not take is not."""
    cpus, longest = os.cpu_count() or 1, max(spec.lengths)
    here = advise.study_knobs(cpus, gpu_build, longest, engine)
    # every knob, the GPU-only ones included (:func:`applicable` leaves them out with a reason), with this build's values
    every = tuple(
        next((x for x in here if x.name == k.name), k) for k in advise.study_knobs(cpus, True, longest, engine)
    )
    knobs = every
    if spec.tune_knobs is not None:
        wanted = {k.name for n in spec.tune_knobs if (k := _resolve(n, every)) is not None}
        knobs = tuple(k for k in every if k.name in wanted)
    for name, values in spec.tune_values:
        knob = _resolve(name, knobs)
        if knob is not None:
            knobs = advise.with_candidates(knobs, knob.name, values)
    return knobs


def workload(spec: StudySpec) -> advise.Workload:
    return advise.uniform_workload(spec.lengths, spec.response_tokens[0], "study")


def cached_turns(spec: StudySpec) -> advise.Workload | None:
    """The study's cached agentic turns as the search's second kind of turn (None: the search's second kind is the
    decode part of a turn)."""
    depth = spec.turns_depth
    if depth is None:
        return None
    return advise.cached_workload(spec.cached_new_tokens, depth, spec.response_tokens[0])


def depths(spec: StudySpec) -> tuple[int, ...]:
    """The llama-bench depths the search would measure at: 0 and the spec's ``tune-depths``; by default the shortest
    length, and the cached turns' context where the study measures cached turns (their score then rests on rates at
    the depth they run at, not at depth 0). Under a budget the deep one is planned from its cost (:func:`planned`)."""
    return tuple(sorted({*cheap_depths(spec), *planned(spec)}))


def cheap_depths(spec: StudySpec) -> tuple[int, ...]:
    """The depths every search measures at: 0 and the spec's ``tune-depths``, else 0 and the shortest length."""
    return tuple(sorted({0, *(spec.tune_depths if spec.tune_depths is not None else (min(spec.lengths),))}))


def planned(spec: StudySpec) -> tuple[int, ...]:
    """The depths a search measures at only where its budget allows (:func:`xover.analysis.advise.plan_depths`): the
    cached turns' context, by default; none where ``tune-depths`` is given (it is what it says)."""
    if spec.tune_depths is not None or spec.turns_depth is None:
        return ()
    return (spec.turns_depth,)


def search_plan(
    knobs: Sequence[advise.Knob],
    spec: StudySpec,
    chunk_tokens: int,
    per_process_s: float,
    reused: bool = False,
    at: Sequence[int] | None = None,
    own: Sequence[str] = (),
) -> str:
    """The search's plan and its cost, said before it starts: the knobs, the llama-bench processes (the defaults',
    each candidate's, the defaults again, then the rounds that confirm a recommendation in fresh processes) and
    their time at what the defaults' own process took (``per_process_s``; ``reused``: stored, so not timed); ``at``:
    the depths (default :func:`depths`); ``own``: the knobs the configuration sets, searched first."""
    search = search_processes(knobs) + (1 if own else 0)  # the defaults again after the own knobs too
    lo = 2 * spec.rounds  # a recommendation against the defaults, round by round; more only under a budget
    hi = 2 * spec.max_rounds if spec.budget_s is not None else lo
    first = [k.short for k in knobs if k.name in own]
    order = f" ({', '.join(first)} first: the others on top of its winner)" if first else ""
    text = (
        f"searching {', '.join(k.short for k in knobs) or 'nothing'}{order}: at most {search} llama-bench processes "
        f"(pp{chunk_tokens}/tg{spec.tg} at depths {', '.join(str(d) for d in (at or depths(spec)))}), then {lo}{f'-{hi}' if hi > lo else ''} to "
        "confirm each recommendation in fresh processes; a trial that runs another configuration's command is its "
        "process"
    )
    if not reused:
        text += (
            f"; at the {per_process_s:.0f} s the defaults' process took, the search {search * per_process_s / 60:.1f} "
            f"min, each confirmation {lo * per_process_s / 60:.1f}"
            + (f"-{hi * per_process_s / 60:.1f}" if hi > lo else "")
            + " min more"
        )
    return text


def search_processes(knobs: Sequence[advise.Knob]) -> int:
    """llama-bench processes a search starts: each candidate, then the defaults again."""
    return 1 + sum(len(k.candidates) for k in knobs)


def plan_depths(
    spec: StudySpec, knobs: Sequence[advise.Knob], base: advise.Measurement, per_process_s: float, configs: int
) -> advise.DepthPlan:
    """The depths this configuration's search measures at, from what its defaults' process measured at the cheap
    depths: the planned ones (the cached turns' context) where the search, with the rounds that confirm it, stays
    within its share of the study's budget (split between the ``configs`` tuned)."""
    cheap, deep = cheap_depths(spec), planned(spec)
    if not deep or not base.prefill:
        return advise.DepthPlan(tuple(sorted({*cheap, *deep})))
    deepest = max(base.prefill, key=lambda r: r.depth)  # the rate nearest the planned depth
    allowance = spec.budget_s * advise.SEARCH_SHARE / max(1, configs) if spec.budget_s is not None else None
    return advise.plan_depths(
        cheap,
        deep,
        prefill_tps=deepest.median_tps,
        per_process_s=per_process_s,
        processes=search_processes(knobs) + 2 * spec.rounds,
        allowance_s=allowance,
    )


def chunk(knobs: Sequence[advise.Knob], longest: int | None = None) -> int:
    """Prompt tokens per llama-bench prefill test: the largest ubatch tried (a smaller prompt would cap it), but no
    more than the study's ``longest`` prompt (a longer test would time prompts the study never sends)."""
    ubatches = [int(v) for k in knobs if k.name == "ubatch-size" for v in k.candidates]
    most = max([advise.LLAMA_DEFAULT_UBATCH, *ubatches])
    return most if longest is None else min(most, longest)


def applicable(
    spec: StudySpec,
    knobs: Sequence[advise.Knob],
    ctx: advise.Context,
    ubatch: int = advise.LLAMA_DEFAULT_UBATCH,
    batch: int = advise.LLAMA_DEFAULT_BATCH,
) -> tuple[tuple[advise.Knob, ...], tuple[tuple[str, str], ...]]:
    """The knobs that can act on this configuration (its own ``ubatch`` and logical ``batch``) here
    (:mod:`xover.analysis.advise.applicability`), and the others with their reasons; a knob the spec names in
    ``tune-knobs`` is searched whatever the theory says."""
    if spec.tune_knobs is not None:  # the spec's knobs, less those of another backend
        other = tuple((k.name, why) for k in knobs if (why := advise.backend_reason(k.name, ctx.backend)) is not None)
        return tuple(k for k in knobs if k.name not in dict(other)), other
    keep, skipped = advise.split([k.name for k in knobs], ctx)
    b_knob = next((k for k in knobs if k.name == opts.BATCH_SIZE.name and k.name in keep), None)
    if b_knob is not None and (why := advise.batch_reason(b_knob.candidates, ubatch, batch)) is not None:
        keep, skipped = tuple(n for n in keep if n != b_knob.name), (*skipped, (b_knob.name, why))
    out = tuple(k for k in knobs if k.name in keep)
    ub = advise.knob_named(out, opts.UBATCH_SIZE.name)
    if ub is not None:  # ubatches no prompt of the study fills run as the smallest of them
        left, why = advise.ubatch_reason(ub.candidates, spec.longest_prompt, min(ubatch, batch))  # min(-ub, -b)
        if why is not None:
            gone = ", ".join(v for v in ub.candidates if v not in left)
            skipped = (*skipped, (f"{ub.name} {gone}", why))
            out = advise.with_candidates(out, ub.name, left) if left else tuple(k for k in out if k is not ub)
    return out, skipped


def context(
    config: LlamaConfig,
    tensors: Sequence[TensorInfo],
    gpu_build: bool,
    budget: bool = False,
    backend: str | None = None,
) -> advise.Context:
    """What decides which knobs can act on ``config``: the build, this CPU's flags, the experts (of the model's
    ``tensors``) it keeps on the CPU (every expert while a fit level is not placed yet) and whether a VRAM budget
    places it (``budget``)."""

    try:
        level: int | None = config.n_cpu_moe
    except XoverError:
        level = None
    overrides = tuple(x for x in (config.get("override-tensor") or "").split(",") if x)
    return advise.Context(
        gpu_build, cpu_flags(), advise.cpu_experts(tensors, level, overrides, gpu_build), budget, backend
    )


@dataclasses.dataclass(frozen=True)
class Tuned:
    """One configuration's tuning result."""

    config: LlamaConfig
    setting: advise.Setting
    label: str  # "lm=none ub=4096 b=4096"; "defaults"
    variant: LlamaConfig | None  # None: llama.cpp's defaults stay the best measured
    server_command: str
    reused: bool = False
    decode_setting: advise.Setting = ()
    decode_label: str = ""
    decode_variant: LlamaConfig | None = None  # tuned for decode-heavy turns, where that differs (None: it does not)

    @property
    def changed(self) -> bool:
        return self.variant is not None

    @property
    def variants(self) -> tuple[LlamaConfig, ...]:
        return tuple(v for v in (self.variant, self.decode_variant) if v is not None)


def _body(
    config: LlamaConfig,
    knobs: Sequence[advise.Knob],
    search: advise.Search,
    spec: StudySpec,
    model: Path,
    backend: str,
    chunk_tokens: int,
    confirmed: Confirmed,
    skipped: Sequence[tuple[str, str]] = (),
) -> dict[str, Any]:
    setting, confirmation, decode_confirmation = confirmed.setting, confirmed.turn, confirmed.decode
    variant = advise.apply_setting(config, knobs, setting, variant_name(config.name)) if setting else None
    shown = variant or config
    decode: dict[str, Any] = {}
    if decode_confirmation is not None:
        decode["decode_confirmation"] = decode_confirmation.to_body()
        if decode_confirmation.kept:
            d_setting = decode_confirmation.setting
            d_variant = advise.apply_setting(
                config, knobs, d_setting, decode_variant_name(config.name, decode_confirmation.part)
            )
            decode |= {
                "decode_variant": d_variant.name,
                "decode_setting": [list(x) for x in d_setting],
                "decode_setting_label": advise.setting_label(knobs, d_setting),
                "decode_server_command": d_variant.server_command(model.name),
            }
    return {
        "schema": SCHEMA,
        "config": config.name,
        "signature": config.key,  # the configuration tuned: a rerun reuses the result while it is unchanged
        "variant": variant.name if variant else None,
        "setting": [list(s) for s in setting],
        "setting_label": advise.setting_label(knobs, setting),
        "server_args": list(shown.server_argv()),
        "env": [list(e) for e in shown.environment()],
        "server_command": shown.server_command(model.name),
        "response": spec.response_tokens[0],
        "depths": list(depths(spec)),
        "chunk": chunk_tokens,
        "workload": workload(spec).describe(),
        "backend": backend,
        "knobs": [dataclasses.asdict(k) for k in knobs],
        "search": dataclasses.asdict(search),
        **({"confirmation": confirmation.to_body()} if confirmation is not None else {}),
        **({"origin_confirmation": confirmed.origin.to_body()} if confirmed.origin is not None else {}),
        **decode,
        "skipped": [list(x) for x in skipped],
    }


@dataclasses.dataclass(frozen=True)
class Confirmation:
    """The search's recommendation against llama.cpp's defaults in rounds of fresh llama-bench processes (the order
    alternating between rounds): each round's expected time per turn of both, and the recommendation's time over the
    defaults', paired by round (:func:`xover.analysis.rounds.paired_ratio`). The recommendation is kept only where
    that ratio's 95 % interval lies below 1. A decode-heavy turn's setting is confirmed the same way against the
    recommendation (``against``), on the decode part of a turn (``part``)."""

    setting: advise.Setting
    against_s: dict[int, float]  # round -> ``against``'s (the defaults') expected time per turn, or its decode part (s)
    tuned_s: dict[int, float]  # round -> the recommendation's
    failure: str | None = None
    against: advise.Setting = ()
    part: str = "turn"  # "turn": the whole expected turn; "decode": its decode part; "cached": a cached turn
    stopped: int | None = None  # the most rounds allowed, where it stopped before them: none could call it faster

    @property
    def interval(self) -> RatioInterval | None:
        return paired_ratio(self.tuned_s, self.against_s)

    @property
    def kept(self) -> bool:
        r = self.interval
        return self.failure is None and r is not None and r.sign < 0

    def to_body(self) -> dict[str, Any]:
        r = self.interval
        return {
            "setting": [list(x) for x in self.setting],
            "rounds": [[n, self.against_s.get(n), self.tuned_s.get(n)] for n in sorted(self.against_s)],
            "ratio": r.ratio if r else None,
            "low": r.low if r else None,
            "high": r.high if r else None,
            "n": r.n if r else 0,
            "kept": self.kept,
            "failure": self.failure,
            "against": [list(x) for x in self.against],
            "part": self.part,
            **({"stopped": self.stopped} if self.stopped is not None else {}),
        }


def _in_round(
    runner: Any,
    config: LlamaConfig,
    sweep: Any,
    work: advise.Workload,
    place: Callable[[LlamaConfig, str], LlamaConfig] | None,
    setting: advise.Setting,
    n: int,
    fresh: bool = False,
) -> advise.Measurement:
    """``config`` with ``setting`` in one fresh llama-bench process of round ``n`` (the one stored for that round,
    unless ``fresh``)."""
    return runner.measure_config_fn(config, dataclasses.replace(sweep, round=n), work, place)(setting, fresh)  # type: ignore[no-any-return]


def confirm(
    measure: Callable[..., advise.Measurement],
    setting: advise.Setting,
    work: advise.Workload,
    spec: StudySpec,
    emit: Event,
    name: str,
    against: advise.Setting = advise.DEFAULTS,
    part: str = "turn",
    max_rounds: int | None = None,
) -> Confirmation:
    """``setting`` against ``against`` (the defaults) in rounds (``measure(setting, round)`` is one fresh
    llama-bench process; ``measure(setting, round, True)`` a new one even if one is stored): ``spec.rounds`` of
    them, then more while the interval straddles 1, up to ``max_rounds`` (default ``spec.max_rounds``); it stops
    sooner where no result of the rounds left could put the interval below 1 (:func:`can_still_fall_below_one`: the
    setting would not be kept whatever they measured). ``part``: compare whole expected
    turns, their decode parts ("decode": ``work``'s) or cached agentic turns ("cached": ``work`` is those turns). A
    round is one session's pair: where an earlier, interrupted session stored only
    one side of a round, that side is measured again beside the other, so no round pairs two sessions' machines."""

    def cost(m: advise.Measurement) -> float:
        return advise.decode_turn_s(m, work) if part == "decode" else advise.estimate(m, work).turn_s

    times: dict[str, dict[int, float]] = {"against": {}, "tuned": {}}
    most = spec.max_rounds if max_rounds is None else max(spec.rounds, max_rounds)
    for n in range(1, most + 1):
        reused: dict[str, bool] = {}
        for which in order(["against", "tuned"], n - 1) + ["again"]:
            if which == "again":  # half a round from an earlier session: its stored side in a process of this one
                if len(set(reused.values())) < 2:
                    break
                which = next(w for w, r in reused.items() if r)
                emit(
                    "info", f"{name}: round {n} was half stored by an earlier session: its other side again", None, None
                )
            m = measure(against if which == "against" else setting, n, which in reused)
            if not (m.ok or (part == "decode" and m.failure is None and m.decode)):
                return Confirmation(setting, times["against"], times["tuned"], f"round {n}: {m.failure}", against, part)
            times[which][n] = cost(m)
            reused[which] = m.reused
        c = Confirmation(setting, times["against"], times["tuned"], None, against, part)
        r = c.interval
        if n >= spec.rounds and r is not None and r.decided:
            break
        if n < most and not can_still_fall_below_one(times["tuned"], times["against"], most):
            c = dataclasses.replace(c, stopped=most)
            break
    what = {"decode": "tuned for decode", "cached": "tuned for cached turns"}.get(part, "tuned")
    base = "defaults" if not against else "tuned" if part != "turn" else advise.pairs_label(against)
    told = (
        c.interval.describe(what, base)
        if c.interval is not None
        else f"{what} took {c.tuned_s[1] / c.against_s[1]:.2f}x {possessive(base)} time in round 1"
        if c.stopped and 1 in c.tuned_s and 1 in c.against_s
        else "no rounds to confirm"
    )
    if c.stopped:
        told += (
            f"; stopped after {len(c.tuned_s)} of at most {c.stopped} rounds: no result of the rest could confirm it"
        )
    emit("info", f"{name}: checked in rounds of fresh llama-bench processes ({part}): {told}", None, None)
    return c


def _from_record(config: LlamaConfig, record: TuneRecord, reused: bool) -> Tuned:
    knobs = tuple(decode(advise.Knob, k) for k in record.knobs)
    setting = record.setting
    variant = advise.apply_setting(config, knobs, setting, variant_name(config.name)) if record.variant else None
    d_setting = record.decode_setting
    d_variant = advise.apply_setting(config, knobs, d_setting, record.decode_variant) if record.decode_variant else None
    return Tuned(
        config,
        setting,
        record.setting_label,
        variant,
        record.server_command,
        reused,
        d_setting,
        record.decode_setting_label,
        d_variant,
    )


def stored(data: StudyData, configs: Sequence[LlamaConfig]) -> dict[str, Tuned]:
    """The latest stored tuning result of each configuration that is unchanged since (the same key) and complete: a
    search or confirmation with an interrupted process (:attr:`TuneRecord.interrupted`) is searched again, reusing
    every measurement stored, so that its interrupted processes run again (:func:`xover.measure.bench.run_sweep`)."""
    latest = {r.config: r for r in data.tune_results()}
    out = {}
    for c in configs:
        record = latest.get(c.name)
        if record is not None and record.signature == c.key and not record.interrupted:
            out[c.name] = _from_record(c, record, reused=True)
    return out


def incomplete(data: StudyData, configs: Sequence[LlamaConfig]) -> dict[str, str]:
    """Each unchanged configuration whose latest tuning was interrupted, with the first interrupted reason."""
    latest = {r.config: r for r in data.tune_results()}
    return {
        c.name: r.interrupted[0]
        for c in configs
        if (r := latest.get(c.name)) is not None and r.signature == c.key and r.interrupted
    }


def variants(results: Iterable[Tuned]) -> tuple[LlamaConfig, ...]:
    """The tuned variants to measure beside their configurations (each configuration's tuned one, then the one
    tuned for decode)."""
    return tuple(v for t in results for v in t.variants)


Event = Callable[[str, str, float | None, float | None], None]  # (status, detail, completed, total)


def same_run(config: LlamaConfig, in_effect: dict[str, str]) -> str:
    """What two trials of different configurations share when they run the same llama-bench command in effect: the
    configuration's key with the settings that name llama.cpp's default, or the value a configuration without that
    setting ran at here (``in_effect``: ``-t 2`` on a machine whose llama.cpp runs 2 threads), left out, and the rest
    in one order."""
    moot = {n: None for n, v in config.settings if v == in_effect.get(n) or v == opts.option(n).default}
    plain = config.with_values(moot)
    return dataclasses.replace(plain, settings=tuple(sorted(plain.settings))).key


class SharedTrials:
    """The search's llama-bench processes across the configurations of one tuning stage: a trial whose command in
    effect (:func:`same_run`) and tests (the sweep) another configuration's trial already ran is that process, not
    a new one of the same evidence. Each value is still one fresh process of its own; only its repetition is
    saved. Likewise a confirmation in rounds of the same two commands (:meth:`confirm_once`)."""

    def __init__(self) -> None:
        # (engine, backend) -> option -> the value that build ran where no configuration set it
        self.by_build: dict[tuple[str, str | None], dict[str, str]] = {}
        self.done: dict[tuple[Any, ...], tuple[advise.Measurement, str]] = {}
        self.confirmed: dict[tuple[Any, ...], tuple[Confirmation, str]] = {}

    def confirm_once(
        self,
        config: LlamaConfig,
        knobs: Sequence[advise.Knob],
        sweep: Any,
        emit: Event,
        max_rounds: int | None,
        setting: advise.Setting,
        against: advise.Setting,
        part: str,
        rounds: Callable[[], Confirmation],
    ) -> Confirmation:
        """``rounds()`` (the confirmation of ``setting`` against ``against`` on ``config``), or the rounds another
        configuration already ran of the same two commands in effect, kind of turn and tests: the same processes,
        the same evidence (``-t 1``'s ``-nr -t 2`` against ``-t 2`` is the defaults' ``-nr`` against the defaults
        on a machine whose llama.cpp runs 2 threads), asked with the same most rounds (``max_rounds``)."""
        ran = [self.command(config, knobs, x) for x in (setting, against)]
        n_prompt = 0 if part == "decode" else sweep.n_prompt  # decode alone runs llama-bench -p 0 whatever the sweep
        key = (*ran, part, sweep.depths, n_prompt, sweep.n_gen, sweep.repetitions, max_rounds)
        label = f"{config.name} {advise.setting_label(knobs, setting)}"
        if key in self.confirmed:
            c, first = self.confirmed[key]
            emit(
                "info",
                f"{label}: the same two llama-bench commands as {first}'s rounds: they count for both",
                None,
                None,
            )
            return dataclasses.replace(c, setting=setting, against=against)
        c = rounds()
        if c.failure is None:
            self.confirmed.setdefault(key, (c, label))
        return c

    def learn(self, config: LlamaConfig, knobs: Sequence[advise.Knob], base: advise.Measurement) -> None:
        """The values in effect of the knobs ``config`` leaves at llama.cpp's defaults, from its defaults' record."""
        effective = dict(base.effective)
        mine = self.by_build.setdefault((config.engine, config.backend), {})
        for k in knobs:
            # an ``auto`` that llama.cpp resolves per context (-fa: off where the op lands on another device than
            # its layer) is not the build's: what one configuration's ran as is not taken for the others'
            value = None if k.record_values else k.in_effect(effective)
            if value is not None and config.get(k.name) is None:
                mine.setdefault(k.name, value)

    def in_effect(self, config: LlamaConfig) -> dict[str, str]:
        """What ``config``'s build runs where nothing sets it (learned from its configurations' defaults)."""
        return self.by_build.get((config.engine, config.backend), {})

    def command(self, config: LlamaConfig, knobs: Sequence[advise.Knob], setting: advise.Setting) -> str:
        """The command in effect (:func:`same_run`) of ``config`` with ``setting``, as this build runs it."""
        return same_run(advise.apply_setting(config, knobs, setting, config.name), self.in_effect(config))

    def measure(
        self,
        config: LlamaConfig,
        knobs: Sequence[advise.Knob],
        sweep: Any,
        inner: Callable[..., advise.Measurement],
        emit: Event,
    ) -> Callable[..., advise.Measurement]:
        """``inner`` (one trial of ``config``), or the process another trial of the same command ran."""
        tests = (sweep.depths, sweep.n_prompt, sweep.n_gen, sweep.repetitions, sweep.round)

        def measure(setting: advise.Setting, fresh: bool = False) -> advise.Measurement:
            key = (self.command(config, knobs, setting), tests)
            label = f"{config.name} {advise.setting_label(knobs, setting)}"
            if not fresh and key in self.done:
                m, first = self.done[key]
                emit(
                    "info", f"{label}: the same llama-bench command as {first}: its process counts for both", None, None
                )
                return m
            m = inner(setting, fresh)
            if m.ok:
                self.done.setdefault(key, (m, label))
            return m

        return measure

    def configuration_of(
        self, config: LlamaConfig, knobs: Sequence[advise.Knob], setting: advise.Setting, spec: StudySpec
    ) -> str | None:
        """The other configuration of ``spec`` whose command ``config`` with ``setting`` runs, where the study's
        cold stage will measure both in its rounds of fresh servers; else None."""
        if not setting or "ttft" in spec.skip:
            return None
        known, mine = self.in_effect(config), self.command(config, knobs, setting)
        return next((c.name for c in spec.configs if c.name != config.name and same_run(c, known) == mine), None)


def confirm_rounds(
    spec: StudySpec, per_process_s: float, spent_s: float, configs: int, confirmations: int = 1, reused: bool = False
) -> int:
    """The most rounds a confirmation of the search may take: the study's ``rounds``, then more (up to
    ``max-rounds``) only under a budget and while they fit the search's share of it for this configuration
    (``spent_s`` of it spent; a round is two processes of ``per_process_s``). A setting still undecided after them
    is indistinguishable here, and the defaults are kept: more rounds could settle a difference that small, at a
    cost no smaller than what it would decide."""
    if spec.budget_s is None or reused or confirmations < 1:  # reused: the process time is not known
        return spec.rounds
    n, round_s = confirmations, 2 * max(per_process_s, 1e-9)  # the study's rounds of each confirmation come first
    left = spec.budget_s * advise.SEARCH_SHARE / max(1, configs) - spent_s - n * spec.rounds * round_s
    extra = int(max(0.0, left) // (n * round_s))
    return min(spec.max_rounds, spec.rounds + extra)


@dataclasses.dataclass(frozen=True)
class Confirmed:
    """What the confirmations in rounds decided: the setting the tuned variant runs (``setting``; the defaults: no
    variant), the rounds behind it, and the study's configuration whose rounds confirm it instead (``same_as``)."""

    setting: advise.Setting
    turn: Confirmation | None = None  # the recommendation against the defaults, or against its origin
    decode: Confirmation | None = None  # the second kind of turn's own setting against ``setting``
    origin: Confirmation | None = None  # against the defaults after a confirmation against the origin: the origin,
    # where what the search added on top of it was not confirmed; the whole recommendation, where it was and the
    # origin is no other configuration's command
    same_as: str | None = None
    # the study's configuration whose command the origin runs, where ``setting`` extends it and only what it adds was
    # confirmed here: the origin's own gain over this configuration rests on the study's rounds of that one
    origin_same_as: str | None = None


Once = Callable[[advise.Setting, advise.Setting, str, Callable[[], Confirmation]], Confirmation]
"""``once(setting, against, part, rounds)``: ``rounds()``, or the same rounds another configuration already ran."""


def _extends_origin(search: advise.Search) -> bool:
    """The recommendation adds knobs on top of an origin the search moved first (``-t 1`` to ``-t 2``): what it adds
    is confirmed against that origin, since a large gain of the origin's own would carry a rider of noise through a
    confirmation against the defaults."""
    origin = search.origin
    return bool(origin) and search.recommended != origin and set(origin) <= set(search.recommended)


def _checks(search: advise.Search, leaves: bool, origin_leaves: bool = False) -> int:
    """The confirmations in rounds a search may need: its recommendation (none where it ``leaves`` it to the
    study's rounds, as another configuration's command), and where that extends its origin one more, against the
    defaults (none where the origin ``origin_leaves`` its gain to the study's rounds, as another configuration's
    command), and the second kind of turn's own setting."""
    turn = 0 if leaves or not search.recommended else 1 + int(_extends_origin(search) and not origin_leaves)
    return turn + int(search.decode_recommended is not None)


def _confirmations(
    search: advise.Search,
    in_round: Callable[..., advise.Measurement],
    decode_only: Callable[..., advise.Measurement],
    work: advise.Workload,
    turns: advise.Workload | None,
    spec: StudySpec,
    emit: Event,
    config: LlamaConfig,
    same_as_of: SameAsOf,
    max_rounds: int | None = None,
    once: Once | None = None,
) -> Confirmed:
    """The search's recommendation in rounds of fresh processes, kept only if it wins there: against the defaults,
    or (:func:`_extends_origin`) against the origin, and then against the defaults: where what it adds is not
    confirmed, the origin; where it is, the whole recommendation, unless the origin is another configuration's
    command. A setting that runs another configuration's command (``same_as_of(setting, say=True)``) is left to the
    study's own rounds of fresh servers, which compare the two. Then the second kind of turn's own setting against the one kept: cached
    turns with the search's tests (``in_round``), decode alone (``decode_only``, llama-bench -p 0: a setting that
    runs prompts on the CPU would spend most of each round on prefill tests its comparison does not read).
    ``max_rounds``: the most rounds each may take (:func:`confirm_rounds`). ``once(setting, against, part, rounds)``
    may answer with rounds another configuration ran of the same commands (:meth:`SharedTrials.confirm_once`)."""

    def rounds(
        measure: Callable[..., advise.Measurement],
        setting: advise.Setting,
        w: advise.Workload,
        against: advise.Setting,
        part: str,
    ) -> Confirmation:
        def run() -> Confirmation:
            return confirm(measure, setting, w, spec, emit, config.name, against, part, max_rounds)

        return run() if once is None else once(setting, against, part, run)

    def decided(setting: advise.Setting, against: advise.Setting = advise.DEFAULTS) -> tuple[Confirmation | None, bool]:
        if setting == against:
            return None, True
        c = rounds(in_round, setting, work, against, "turn")
        return c, c.kept

    turn = origin_check = origin_same_as = None
    kept, same_as = search.recommended, same_as_of(search.recommended) if search.recommended else None
    if search.recommended and same_as is None:
        extends = _extends_origin(search)
        against = search.origin if extends else advise.DEFAULTS
        turn, ok = decided(search.recommended, against)
        if ok and extends:
            # what it adds is confirmed; the origin's own gain rests on the search's processes (an own knob moves on
            # two processes that each beat the defaults'), unless another configuration runs the origin's command
            # (the study's rounds measure it beside this one); if none does, the whole recommendation against the
            # defaults, kept only if it wins there too
            origin_same_as = same_as_of(search.origin, say=False)
            if origin_same_as is None:
                origin_check, ok = decided(search.recommended)
                kept = search.recommended if ok else advise.DEFAULTS
        elif not ok:
            kept = against
            same_as = same_as_of(against) if against else None
            if against and same_as is None:
                origin_check, ok = decided(against)
                kept = against if ok else advise.DEFAULTS
    decode = None
    if search.decode_recommended is not None and search.decode_recommended != kept:
        if turns is not None:
            decode = rounds(in_round, search.decode_recommended, turns, kept, "cached")
        else:
            decode = rounds(decode_only, search.decode_recommended, work, kept, "decode")
    return Confirmed(kept, turn, decode, origin_check, same_as, origin_same_as)


class SameAsOf(Protocol):
    """The study's other configuration whose command a setting of this configuration runs, or None
    (``_same_as_of`` bound to its configuration; with ``say``, the line that says so)."""

    def __call__(self, setting: advise.Setting, say: bool = True) -> str | None: ...


def _same_as_of(
    shared: SharedTrials,
    config: LlamaConfig,
    knobs: Sequence[advise.Knob],
    spec: StudySpec,
    emit: Event,
    placed: bool,
    setting: advise.Setting,
    say: bool = True,
) -> str | None:
    """The study's other configuration whose command ``config`` with ``setting`` runs (with ``say``, said in a line:
    the setting is the recommendation), or None; a placed trial's level follows its own settings, so it is never
    another configuration's."""
    other = None if placed else shared.configuration_of(config, knobs, setting, spec)
    if other is not None and say:  # its rounds follow anyway: the cold stage's, of fresh servers, beside this one
        emit("info", f"{config.name}: {LEFT_TO_ROUNDS.format(other)}", None, None)
    return other


LEFT_TO_ROUNDS = (
    "its recommendation runs {}'s command, which the study measures beside it in rounds of fresh servers: those "
    "rounds confirm it, not llama-bench rounds here"
)


def _say_skipped(config: LlamaConfig, skipped: Sequence[tuple[str, str]], emit: Event) -> None:
    """One line per knob (or some of its values: ``"ubatch-size 4096"``) the search leaves out, with its reason."""
    for knob_name, why in skipped:
        option, _, values = knob_name.partition(" ")
        short = opts.option(option).short + (f" {values}" if values else "")
        emit("info", f"{config.name}: not searching {short}: {why}", None, None)


def _store_result(config: LlamaConfig, body: dict[str, Any], study_dir: Path, emit: Event) -> Tuned:
    """The configuration's tuning stored (artifact ``tune``), said in a line, and returned."""
    with Store(study_dir) as store:
        store.add_artifact(None, ARTIFACT, body)
    t = _from_record(config, TuneRecord.from_body(body), reused=False)
    kept = "tuned " + t.label if t.changed else "no knob beat the noise between processes: defaults kept"
    decode = f"; tuned for decode {t.decode_label}" if t.decode_variant is not None else ""
    emit("info", f"{config.name}: {kept}{decode}", None, None)
    return t


def _reused(spec: StudySpec, study_dir: Path, fresh: bool, emit: Event) -> dict[str, Tuned]:
    """The stored tunings a run reuses (none when ``fresh``), each said in a line, and those searched again because a
    process of theirs was interrupted, said too."""
    if fresh:
        return {}
    data = load_if_any(study_dir)
    done = stored(data, spec.configs)
    for name, t in done.items():
        emit("info", f"{name}: tuned settings already stored ({t.label})", None, None)
    for name, why in incomplete(data, spec.configs).items():
        emit(
            "info", f"{name}: its tuning was interrupted ({why}): searched again, what was measured reused", None, None
        )
    return done


def run_tune(
    spec: StudySpec,
    model: Path,
    binaries: Binaries,
    study_dir: Path,
    command: Sequence[str],
    fresh: bool,
    emit: Event,
    place: Callable[[LlamaConfig, str], LlamaConfig] | None = None,
) -> tuple[Tuned, ...]:
    """Search every configuration of ``spec`` still without a stored result (all of them when ``fresh``)."""

    done = _reused(spec, study_dir, fresh, emit)
    todo = [c for c in spec.configs if c.name not in done]
    if not todo:
        return tuple(done[c.name] for c in spec.configs)
    tune_dir = study_dir / SUBDIR
    work, turns = workload(spec), cached_turns(spec)
    measured = 0

    def on_event(ev: object) -> None:
        nonlocal measured
        if isinstance(ev, Measuring):
            emit("progress", f"llama-bench {ev.label}", None, None)
        elif isinstance(ev, Note):  # a process killed from outside and retried, said
            emit("info", ev.text, None, None)
        elif isinstance(ev, Measured):
            measured += 1
            if ev.estimate is None and ev.measurement.failure is not None:
                emit("fail", f"{ev.label}: {ev.measurement.failure}", None, None)

    tensors = model_table(model)[0].tensors  # which experts stay on the CPU decides which knobs can act
    results = dict(done)
    shared = SharedTrials()
    for config in todo:
        # The defaults first: the build's backends decide which knobs can matter at all.
        probe_spec = AdviseSpec(model=model, knobs=(), repetitions=spec.tune_repetitions, timeout_s=spec.timeout_s)
        probe_runner = _Runner(probe_spec, binaries, tune_dir, command, on_event)
        all_knobs = knobs_for(spec, True, config.engine)
        chunk_tokens = chunk(all_knobs, spec.longest_prompt)
        # under a budget the defaults' process at the cheap depths first: what it measures plans the deep ones
        probe_at = cheap_depths(spec) if spec.budget_s is not None else depths(spec)
        sweep = probe_runner.sweep(probe_at, chunk_tokens, spec.tg, spec.tune_repetitions)
        t_base = time.perf_counter()
        base = probe_runner.measure_config_fn(config, sweep, work)(advise.DEFAULTS)
        per_process = time.perf_counter() - t_base
        if not base.ok:
            emit(
                "fail",
                f"{config.name}: llama.cpp's defaults could not be measured ({base.failure}); not tuned",
                None,
                None,
            )
            continue
        backend = dict(base.effective).get("backends", "")
        gpu_build = is_gpu_build(backend)
        placed = place is not None and place(config, config.name) is not config
        own = knobs_for(spec, gpu_build, config.engine)
        built_for = config.backend or opts.backend_of(backend)  # the record's backends say which build ran
        own_ub = int(config.get(opts.UBATCH_SIZE.name) or opts.UBATCH_SIZE.default)
        own_b = int(config.get(opts.BATCH_SIZE.name) or opts.BATCH_SIZE.default)
        knobs, skipped = applicable(spec, own, context(config, tensors, gpu_build, placed, built_for), own_ub, own_b)
        _say_skipped(config, skipped, emit)
        at = plan_depths(spec, knobs, base, per_process, len(todo))
        if at.left_out:
            emit("info", f"{config.name}: search {at.describe()}", None, None)
        wanted = min(max(chunk(knobs), own_ub), spec.longest_prompt)
        if wanted != chunk_tokens or at.depths != sweep.depths:  # candidates, ubatch, depths
            chunk_tokens = wanted
            sweep = probe_runner.sweep(at.depths, chunk_tokens, spec.tg, spec.tune_repetitions)
        runner = _Runner(dataclasses.replace(probe_spec, knobs=knobs), binaries, tune_dir, command, on_event)
        own_knobs = tuple(k.name for k in knobs if config.get(k.name) is not None)
        plan_line = search_plan(knobs, spec, chunk_tokens, per_process, base.reused, at.depths, own_knobs)
        emit("info", f"{config.name}: {plan_line}", None, None)
        trial = runner.measure_config_fn(config, sweep, work, place)
        if not placed:  # a placed trial's level follows its own settings: never shared
            shared.learn(config, knobs, base)
            trial = shared.measure(config, knobs, sweep, trial, emit)
        try:
            search = advise.coordinate_search(knobs, trial, work, None, second=turns, first=own_knobs)
        except XoverError as e:
            emit("fail", f"{config.name}: {e}", None, None)
            continue
        in_round = functools.partial(_in_round, runner, config, sweep, work, place)
        decode_only = functools.partial(_in_round, runner, config, dataclasses.replace(sweep, n_prompt=0), work, place)
        same_as_of = functools.partial(_same_as_of, shared, config, knobs, spec, emit, placed)
        # another configuration's command, the recommendation or the origin it extends: the study's rounds judge it
        leaves, origin_leaves = (same_as_of(s, say=False) is not None for s in (search.recommended, search.origin))
        to_confirm = _checks(search, leaves, origin_leaves)
        spent = time.perf_counter() - t_base
        rounds = confirm_rounds(spec, per_process, spent, len(todo), to_confirm, base.reused)
        once = None if placed else functools.partial(shared.confirm_once, config, knobs, sweep, emit, rounds)
        confirmed = _confirmations(
            search, in_round, decode_only, work, turns, spec, emit, config, same_as_of, rounds, once
        )
        body = _body(config, knobs, search, spec, model, backend, chunk_tokens, confirmed, skipped)
        body |= {"placed_trials": placed, "depths": list(at.depths), "depths_left_out": [list(x) for x in at.left_out]}
        body |= {"same_as": confirmed.same_as, "origin_same_as": confirmed.origin_same_as}
        results[config.name] = _store_result(config, body, study_dir, emit)
    return tuple(results[c.name] for c in spec.configs if c.name in results)
