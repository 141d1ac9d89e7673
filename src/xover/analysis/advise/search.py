"""advise's coordinate search: one knob at a time from llama.cpp's defaults, over an injected
``measure(setting)``; the verdict per knob and the recommendation. Pure."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

from xover.analysis.advise.knobs import (
    DEFAULTS,
    RECHECK,
    Knob,
    Setting,
    again,
    is_again,
    level_label,
    normalize,
    setting_label,
)
from xover.analysis.advise.objective import Estimate, Measurement, estimate, noise_between, within_noise
from xover.analysis.advise.workload import Workload
from xover.errors import XoverError

CLEAR_MARGIN = 3.0
"""A best value whose gain over the defaults is at least this many times its noise band is kept on one process's
evidence; a smaller gain is measured again in a fresh process first (a no-op knob on a 2-core CPU machine once
measured 1.7 times its noise band faster)."""


@dataclasses.dataclass(frozen=True)
class Trial:
    setting: Setting
    label: str
    varied: str | None  # the knob this trial changes from the defaults; None: the defaults or the combination
    measurement: Measurement
    estimate: Estimate | None  # None when it could not be measured


@dataclasses.dataclass(frozen=True)
class Effect:
    """One value of a knob against the defaults."""

    value: str
    change_s: float  # time per turn minus the defaults' (negative: faster)
    noise_s: float  # the two spreads added (or the drift of the defaults, if larger)
    decode_change_s: float = 0.0  # the decode part of a turn minus the defaults' (a knob can trade one for the other)
    decode_noise_s: float = 0.0
    processes: int = 1  # llama-bench processes of this value: 2 when a marginal gain was measured again

    @property
    def within_noise(self) -> bool:
        return abs(self.change_s) <= self.noise_s

    @property
    def decode_within_noise(self) -> bool:
        return abs(self.decode_change_s) <= self.decode_noise_s


@dataclasses.dataclass(frozen=True)
class KnobVerdict:
    knob: str
    kept: str | None  # the value kept; None: llama.cpp's default
    effects: tuple[Effect, ...]  # every value measured
    skipped: tuple[str, ...]  # not measured: llama.cpp runs them as its default
    failed: tuple[str, ...]

    @property
    def best(self) -> Effect | None:
        """The fastest value measured, kept or not."""
        return min(self.effects, key=lambda e: e.change_s) if self.effects else None

    @property
    def no_effect(self) -> bool:
        """Every value measured is within noise of the defaults (nothing measured: unknown, False)."""
        return bool(self.effects) and all(e.within_noise for e in self.effects)


@dataclasses.dataclass(frozen=True)
class Search:
    """One offload level's coordinate search."""

    n_cpu_moe: int | None
    trials: tuple[Trial, ...]
    verdicts: tuple[KnobVerdict, ...]
    combination: Setting  # the kept values together
    recommended: Setting
    drift_s: float | None = None  # |defaults again - defaults| per turn; None: not re-measured
    # The fastest setting for the decode part of a turn where it is not :attr:`recommended` and decodes faster than
    # it beyond the noise: a decode-heavy turn's choice. None: the recommendation is decode's best too.
    decode_recommended: Setting | None = None
    decode_drift_s: float | None = None

    @property
    def label(self) -> str:
        return level_label(self.n_cpu_moe)

    @property
    def measurements(self) -> int:
        """llama-bench configurations this search needed (reused from the store included)."""
        return len(self.trials)

    @property
    def reused(self) -> int:
        return sum(1 for t in self.trials if t.measurement.reused)

    def trial(self, setting: Setting) -> Trial:
        return next(t for t in self.trials if t.setting == setting)

    @property
    def defaults(self) -> Trial:
        return self.trial(DEFAULTS)

    @property
    def best(self) -> Trial:
        return self.trial(self.recommended)

    @property
    def gain(self) -> float:
        """Defaults' time per turn over the recommendation's (2.0: twice as fast)."""
        d, b = self.defaults.estimate, self.best.estimate
        assert d is not None and b is not None
        return d.turn_s / b.turn_s


def _second(t: Trial, second: Workload | None) -> Estimate | None:
    """A trial's score on the second kind of turn: the decode part of the workload's turn (``second`` None), or the
    expected turn over ``second`` (cached agentic turns) from the same tests. Its ``turn_s`` and spread decide."""
    e = t.estimate
    if e is None:
        return None
    if second is None:
        return Estimate(e.decode_s, 0.0, e.decode_s, e.decode_samples_s, e.decode_samples_s)
    return estimate(t.measurement, second)


def _try_knob(
    knobs: Sequence[Knob], knob: Knob, effective: Mapping[str, str], run: Callable[[Setting, str | None], Trial]
) -> tuple[Knob, tuple[str, ...], list[tuple[str, Estimate]], list[str]]:
    """Each candidate of ``knob`` alone on top of the defaults (``run``: one trial), but those llama.cpp already
    runs by default here (``effective``: the defaults' record fields): (knob, skipped, measured, failed)."""
    in_effect = effective.get(knob.record_field) if knob.record_field else None
    values = [v for v in dict.fromkeys(knob.candidates) if v != knob.default]
    skipped = tuple(v for v in values if v == in_effect)
    measured: list[tuple[str, Estimate]] = []
    failed: list[str] = []
    for value in (v for v in values if v not in skipped):
        e = run(normalize(knobs, {knob.name: value}), knob.name).estimate
        if e is None:
            failed.append(value)
        else:
            measured.append((value, e))
    return knob, skipped, measured, failed


def _effect(
    trials: Mapping[Setting, Trial],
    setting: Setting,
    value: str,
    base: Trial,
    defaults_again: Trial | None,
    floor: float,
    decode_floor: float,
    second: Workload | None,
) -> Effect:
    """The value against the defaults: one process each, or with the value measured again (and the defaults
    rechecked), the means of the two processes each, the noise widened by the value's own difference."""
    b, b2 = base.estimate, _second(base, second)
    assert b is not None and b2 is not None
    firsts = [trials[setting]]
    if again(setting) in trials and trials[again(setting)].estimate is not None:
        firsts.append(trials[again(setting)])
    bases = [base] + ([defaults_again] if defaults_again is not None and defaults_again.estimate else [])
    one, one2 = firsts[0].estimate, _second(firsts[0], second)
    assert one is not None and one2 is not None
    if len(firsts) == 1:
        return Effect(
            value,
            one.turn_s - b.turn_s,
            noise_between(one, b, floor),
            one2.turn_s - b2.turn_s,
            noise_between(one2, b2, decode_floor),
        )
    ests = [t.estimate for t in firsts]
    ests2 = [_second(t, second) for t in firsts]
    bs = [t.estimate for t in bases]
    bs2 = [_second(t, second) for t in bases]
    mean = lambda xs: sum(x.turn_s for x in xs) / len(xs)  # type: ignore[union-attr]  # noqa: E731
    spread = lambda xs: max(x.turn_s for x in xs) - min(x.turn_s for x in xs)  # type: ignore[union-attr]  # noqa: E731
    return Effect(
        value,
        mean(ests) - mean(bs),
        max(noise_between(one, b, floor), spread(ests)),
        mean(ests2) - mean(bs2),
        max(noise_between(one2, b2, decode_floor), spread(ests2)),
        processes=len(firsts),
    )


def _marginal(e: Effect, decode: bool) -> bool:
    """A gain beyond the noise but within :data:`CLEAR_MARGIN` of it: worth a second process before deciding."""
    change, noise = (e.decode_change_s, e.decode_noise_s) if decode else (e.change_s, e.noise_s)
    return change < 0 and -change > noise and -change < CLEAR_MARGIN * noise


def _decode_choice(
    trials: Mapping[Setting, Trial],
    allowed: set[Setting],
    recommended: Setting,
    decode_floor: float,
    second: Workload | None,
) -> Setting | None:
    """The second kind of turn's own setting among ``allowed`` (the decode winners, alone and together), where it
    beats the recommendation on that kind of turn beyond the noise; else None."""
    scored = {
        t.setting: e2
        for t in trials.values()
        if t.setting in allowed and not is_again(t.setting) and (e2 := _second(t, second))
    }
    fastest = min(scored, key=lambda s: scored[s].turn_s)
    chosen = scored[recommended]
    beyond = scored[fastest].turn_s - chosen.turn_s < -noise_between(scored[fastest], chosen, decode_floor)
    return fastest if fastest != recommended and beyond else None


def coordinate_search(
    knobs: Sequence[Knob],
    measure: Callable[[Setting], Measurement],
    workload: Workload,
    n_cpu_moe: int | None = None,
    recheck: bool = True,
    second: Workload | None = None,
) -> Search:
    """The search of the module docstring; ``measure`` runs one configuration. With ``recheck`` the
    defaults are measured again after every knob (:data:`RECHECK`) and the drift between the two
    widens the noise band of every decision. Beside the workload's best setting, the second kind of turn's
    (:attr:`Search.decode_recommended`): decode-heavy turns (the decode part of a turn), or with ``second`` the
    cached agentic turns it describes, scored from the same tests."""
    trials: dict[Setting, Trial] = {}

    def run(setting: Setting, varied: str | None) -> Trial:
        if setting not in trials:
            m = measure(setting)
            trials[setting] = Trial(
                setting, setting_label(knobs, setting), varied, m, estimate(m, workload) if m.ok else None
            )
        return trials[setting]

    base = run(DEFAULTS, None)
    if base.estimate is None:
        raise XoverError(
            f"llama.cpp's defaults could not be measured at {level_label(n_cpu_moe)} "
            f"({base.measurement.failure}): fix that first, e.g. with a larger --ncmoe"
        )
    b = base.estimate
    effective = dict(base.measurement.effective)
    tried = [_try_knob(knobs, knob, effective, run) for knob in knobs]
    b2 = _second(base, second)
    assert b2 is not None
    drift = decode_drift = None
    if recheck:
        again_trial = run(RECHECK, None)
        b_again, b_again2 = again_trial.estimate, _second(again_trial, second)
        drift = abs(b_again.turn_s - b.turn_s) if b_again is not None else None
        decode_drift = abs(b_again2.turn_s - b2.turn_s) if b_again2 is not None else None
    floor, decode_floor = drift or 0.0, decode_drift or 0.0
    defaults_again = trials.get(RECHECK) if recheck else None

    def effect(knob: Knob, value: str) -> Effect:
        setting = normalize(knobs, {knob.name: value})
        return _effect(trials, setting, value, base, defaults_again, floor, decode_floor, second)

    verdicts: list[KnobVerdict] = []
    kept: dict[str, str] = {}
    decode_kept: dict[str, str] = {}
    for knob, skipped, measured, failed in tried:
        effects = [effect(knob, value) for value, _ in measured]
        if recheck and effects:
            leaders = (min(effects, key=lambda x: x.change_s), min(effects, key=lambda x: x.decode_change_s))
            retried = [
                run(again(normalize(knobs, {knob.name: lead.value})), knob.name)
                for lead, on_decode in zip(leaders, (False, True), strict=True)
                if _marginal(lead, on_decode)
            ]
            if retried:
                effects = [effect(knob, value) for value, _ in measured]
        best = min(effects, key=lambda x: x.change_s) if effects else None
        if best is not None and best.change_s < 0 and not best.within_noise:
            kept[knob.name] = best.value
        best_decode = min(effects, key=lambda x: x.decode_change_s) if effects else None
        if best_decode is not None and best_decode.decode_change_s < 0 and not best_decode.decode_within_noise:
            decode_kept[knob.name] = best_decode.value
        verdicts.append(KnobVerdict(knob.name, kept.get(knob.name), tuple(effects), skipped, tuple(failed)))
    combination = normalize(knobs, kept)
    run(combination, None)  # already measured unless two or more knobs were kept
    # The recommendation is chosen among settings made of kept values only: a single trial that beat the defaults
    # on one process and not on its second is no candidate.
    allowed = {DEFAULTS, combination, *(normalize(knobs, {k: v}) for k, v in kept.items())}
    measured_trials = [t for t in trials.values() if t.estimate is not None and t.setting in allowed]
    best_trial = min(measured_trials, key=lambda t: t.estimate.turn_s)  # type: ignore[union-attr]
    assert best_trial.estimate is not None
    e = best_trial.estimate
    recommended = DEFAULTS if within_noise(e, b, floor) else best_trial.setting
    decode_recommended = None
    if decode_kept:
        decode_combination = normalize(knobs, decode_kept)
        run(decode_combination, None)  # the decode winners together
        allowed_decode = {
            DEFAULTS,
            recommended,
            decode_combination,
            *(normalize(knobs, {k: v}) for k, v in decode_kept.items()),
        }
        decode_recommended = _decode_choice(trials, allowed_decode, recommended, decode_floor, second)
    return Search(
        n_cpu_moe,
        tuple(trials.values()),
        tuple(verdicts),
        combination,
        recommended,
        drift,
        decode_recommended,
        decode_drift,
    )


SEARCH_SHARE = 0.5  # the share of a study's budget its search may take (issue 46: at most half of a study)


@dataclasses.dataclass(frozen=True)
class DepthPlan:
    """The llama-bench depths a search measures at, and those it leaves out with what each would have cost."""

    depths: tuple[int, ...]
    left_out: tuple[tuple[int, float], ...] = ()  # (depth, seconds it would add to the search)
    processes: int = 0  # the llama-bench processes the costs were planned over

    def describe(self) -> str:
        """What was left out and why, in a line; empty where nothing was."""
        if not self.left_out:
            return ""
        what = ", ".join(f"d{d:,} (about {s / 60:.1f} min more)" for d, s in self.left_out)
        return (
            f"left out {what} over its {self.processes} llama-bench processes, past its share of the study's budget: "
            f"the scores rest on rates at depths {', '.join(f'{d:,}' for d in self.depths)}"
        )


def depth_cost_s(depth: int, prefill_tps: float, processes: int) -> float:
    """What measuring at ``depth`` adds to a search of ``processes`` llama-bench processes: each prefills the depth
    once for its pp test and once for its tg test (llama-bench caches it across repetitions, untimed but not free),
    at ``prefill_tps`` (the defaults' prefill rate, measured)."""
    return processes * 2 * depth / prefill_tps


def plan_depths(
    cheap: Sequence[int],
    wanted: Sequence[int],
    *,
    prefill_tps: float,
    per_process_s: float,
    processes: int,
    allowance_s: float | None,
) -> DepthPlan:
    """The depths a search measures at: ``cheap`` always (depth 0 and the shortest length), then each of ``wanted``
    from the shallowest while the whole search (``processes`` of ``per_process_s`` each, measured at the cheap
    depths, and the depths kept) stays within ``allowance_s``; the rest left out with their cost. No allowance (a
    study without a budget): every depth."""
    kept = sorted(set(cheap))
    extra = [d for d in sorted(set(wanted)) if d not in kept]
    if allowance_s is None:
        return DepthPlan(tuple(sorted({*kept, *extra})), processes=processes)
    total = processes * per_process_s
    left: list[tuple[int, float]] = []
    for d in extra:
        cost = depth_cost_s(d, prefill_tps, processes)
        if not left and total + cost <= allowance_s:
            kept.append(d)
            total += cost
        else:
            left.append((d, cost))
    return DepthPlan(tuple(sorted(kept)), tuple(left), processes)
