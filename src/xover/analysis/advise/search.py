"""advise's coordinate search: one knob at a time from llama.cpp's defaults, over an injected
``measure(setting)``; the verdict per knob and the recommendation. Pure."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

from xover.analysis.advise.knobs import DEFAULTS, Knob, Setting, again, is_again, level_label, normalize, setting_label
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
    noise_s: float  # the two spreads added (or the drift of the defaults, if larger); on two processes each, at
    # least the differences between each side's two processes, added
    decode_change_s: float = 0.0  # the decode part of a turn minus the defaults' (a knob can trade one for the other)
    decode_noise_s: float = 0.0
    processes: int = 1  # llama-bench processes of this value: 2 when a marginal gain was measured again
    separated: bool = False  # on two processes, each of the value's faster than each of the defaults' (turn)

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
        """Every value measured is within noise of the defaults and none kept (nothing measured: unknown, False; an own
        knob's value can be kept within the noise, on two processes that each beat the defaults')."""
        return bool(self.effects) and self.kept is None and all(e.within_noise for e in self.effects)


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
    # The setting the knobs after the configuration's own were measured on top of: its own knobs' kept values
    # (``first`` of :func:`coordinate_search`), or the defaults.
    origin: Setting = DEFAULTS
    first: tuple[str, ...] = ()  # the knobs searched first: the configuration's own

    def base_of(self, knob: str) -> Setting:
        """The setting ``knob``'s values were measured against: the defaults for the configuration's own knobs (or
        where none moved), else :attr:`origin`."""
        return DEFAULTS if knob in self.first else self.origin

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
    knobs: Sequence[Knob],
    knob: Knob,
    effective: Mapping[str, str],
    run: Callable[[Setting, str | None], Trial],
    origin: Setting = DEFAULTS,
    screen: Callable[[Sequence[Setting], str], object] | None = None,
) -> tuple[Knob, tuple[str, ...], list[tuple[str, Estimate]], list[str]]:
    """Each candidate of ``knob`` alone on top of ``origin`` (the defaults, or the configuration's own knobs moved
    first; ``run``: one trial), but those llama.cpp already runs there (``effective``: the origin's record fields):
    (knob, skipped, measured, failed). ``screen``: the candidates are measured together first, in one process."""
    in_effect = knob.in_effect(effective)
    values = [v for v in dict.fromkeys(knob.candidates) if v != knob.default]
    skipped = tuple(v for v in values if v == in_effect)
    measured: list[tuple[str, Estimate]] = []
    failed: list[str] = []
    todo = [v for v in values if v not in skipped]
    if screen is not None and len(todo) > 1:
        screen([normalize(knobs, {**dict(origin), knob.name: v}) for v in todo], knob.name)
    for value in todo:
        e = run(normalize(knobs, {**dict(origin), knob.name: value}), knob.name).estimate
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
    rechecked), the means of the two processes each against the spreads between each side's processes added."""
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
    # each side's spread between its own processes, added (as noise_between adds the spreads within one process):
    # two processes of a value that cannot act, both landing on quiet moments, came out 1.3 times the drift of the
    # defaults faster on their means; its processes' own spread alone had not covered the defaults'
    return Effect(
        value,
        mean(ests) - mean(bs),
        max(noise_between(one, b, floor), spread(ests) + spread(bs)),
        mean(ests2) - mean(bs2),
        max(noise_between(one2, b2, decode_floor), spread(ests2) + spread(bs2)),
        processes=len(firsts),
        separated=len(bs) > 1 and max(x.turn_s for x in ests) < min(x.turn_s for x in bs),  # type: ignore[union-attr]
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


@dataclasses.dataclass
class _Pass:
    """What one pass over some knobs from one origin kept: values per knob for the turn and for the second kind of
    turn, and the setting each kept value was measured at."""

    verdicts: list[KnobVerdict] = dataclasses.field(default_factory=list)
    kept: dict[str, str] = dataclasses.field(default_factory=dict)
    decode_kept: dict[str, str] = dataclasses.field(default_factory=dict)
    singles: dict[str, Setting] = dataclasses.field(default_factory=dict)  # knob -> the trial of its kept value


def _pass(
    knobs: Sequence[Knob],
    over: Sequence[Knob],
    origin: Setting,
    run: Callable[[Setting, str | None], Trial],
    trials: dict[Setting, Trial],
    recheck: bool,
    second: Workload | None,
    own: bool = False,
    screen: Callable[[Sequence[Setting], str], object] | None = None,
    screened: frozenset[str] = frozenset(),
) -> tuple[_Pass, float | None, float | None]:
    """Each knob of ``over`` alone on top of ``origin`` (its trial is the base of every effect), the origin measured
    again after them (with ``recheck``), and a marginal leader measured again (and the next leader, where that
    demotes it): the values kept, and the drift of the origin between its two processes (turn, second kind of
    turn).

    ``own``: the configuration's own knobs (``-t 1``). There a leader whose two processes each beat each of the
    defaults' moves too, though the two sides' spreads added still cover its gain: a noisy machine (the defaults'
    two processes 15 % apart, ``-t 2``'s 30 %) would otherwise keep ``-t 1`` against a 1.5x gain and search every
    other knob on its own processes. Moving costs no more than a confirmation (the study's rounds, where the moved
    command is another configuration's); staying costs a search. Other knobs keep the stricter rule: a value that
    cannot act, on two quiet processes, separates from the defaults often enough to spend confirmations."""
    base = run(origin, None)
    b, b2 = base.estimate, _second(base, second)
    assert b is not None and b2 is not None
    # the origin again after this pass's knobs: a new process where an earlier pass already measured it again
    recheck_setting = again(origin, 2) if again(origin) in trials else again(origin)
    tried = [
        _try_knob(knobs, knob, dict(base.measurement.effective), run, origin, screen if knob.name in screened else None)
        for knob in over
    ]
    drift = decode_drift = None
    if recheck:
        again_trial = run(recheck_setting, None)
        b_again, b_again2 = again_trial.estimate, _second(again_trial, second)
        drift = abs(b_again.turn_s - b.turn_s) if b_again is not None else None
        decode_drift = abs(b_again2.turn_s - b2.turn_s) if b_again2 is not None else None
    floor, decode_floor = drift or 0.0, decode_drift or 0.0
    origin_again = trials.get(recheck_setting) if recheck else None

    def setting_of(knob: Knob, value: str) -> Setting:
        return normalize(knobs, {**dict(origin), knob.name: value})

    def effect(knob: Knob, value: str) -> Effect:
        return _effect(trials, setting_of(knob, value), value, base, origin_again, floor, decode_floor, second)

    out = _Pass()
    for knob, skipped, measured, failed in tried:
        effects = [effect(knob, value) for value, _ in measured]
        retried: set[str] = set()
        while recheck and effects:  # until each leader is clear or has had its second process (a leader that a
            # second process demotes can leave another value, measured once, leading by a little)
            leaders = (min(effects, key=lambda x: x.change_s), min(effects, key=lambda x: x.decode_change_s))
            retry = {
                lead.value
                for lead, on_decode in zip(leaders, (False, True), strict=True)
                if _marginal(lead, on_decode) and lead.value not in retried
            }
            if not retry:
                break
            for value in sorted(retry):
                run(again(setting_of(knob, value)), knob.name)
            retried |= retry
            effects = [effect(knob, value) for value, _ in measured]
        best = min(effects, key=lambda x: x.change_s) if effects else None
        if best is not None and best.change_s < 0 and (not best.within_noise or (own and best.separated)):
            out.kept[knob.name] = best.value
            out.singles[knob.name] = setting_of(knob, best.value)
        best_decode = min(effects, key=lambda x: x.decode_change_s) if effects else None
        if best_decode is not None and best_decode.decode_change_s < 0 and not best_decode.decode_within_noise:
            out.decode_kept[knob.name] = best_decode.value
            out.singles.setdefault(f"decode:{knob.name}", setting_of(knob, best_decode.value))
        out.verdicts.append(KnobVerdict(knob.name, out.kept.get(knob.name), tuple(effects), skipped, tuple(failed)))
    return out, drift, decode_drift


def coordinate_search(
    knobs: Sequence[Knob],
    measure: Callable[[Setting], Measurement],
    workload: Workload,
    n_cpu_moe: int | None = None,
    recheck: bool = True,
    second: Workload | None = None,
    first: Sequence[str] = (),
    screen: Callable[[Sequence[Setting]], Sequence[Measurement]] | None = None,
    screened: frozenset[str] = frozenset(),
) -> Search:
    """The search of the module docstring; ``measure`` runs one configuration. With ``recheck`` the
    defaults are measured again after every knob (:data:`RECHECK`) and the drift between the two
    widens the noise band of every decision. Beside the workload's best setting, the second kind of turn's
    (:attr:`Search.decode_recommended`): decode-heavy turns (the decode part of a turn), or with ``second`` the
    cached agentic turns it describes, scored from the same tests.

    ``first``: the knobs the configuration itself sets (``-t 1``). They are searched first, from the
    configuration's defaults; where one of their values wins beyond the noise, the other knobs are searched on top
    of it (:attr:`Search.origin`), so that a configuration that differs from another of the study only in such a
    knob runs, once that knob has moved, the same llama-bench commands the other one ran (the caller's ``measure``
    may share those processes)."""
    trials: dict[Setting, Trial] = {}

    def run(setting: Setting, varied: str | None) -> Trial:
        if setting not in trials:
            m = measure(setting)
            trials[setting] = Trial(
                setting, setting_label(knobs, setting), varied, m, estimate(m, workload) if m.ok else None
            )
        return trials[setting]

    def run_together(settings: Sequence[Setting], varied: str) -> None:
        """``settings`` not yet measured, in one process (``screen``): their trials, as ``run`` makes them."""
        assert screen is not None
        new = [s for s in settings if s not in trials]
        for setting, m in zip(new, screen(new) if len(new) > 1 else [measure(s) for s in new], strict=True):
            trials[setting] = Trial(
                setting, setting_label(knobs, setting), varied, m, estimate(m, workload) if m.ok else None
            )

    together = run_together if screen is not None and screened else None
    base = run(DEFAULTS, None)
    if base.estimate is None:
        raise XoverError(
            f"llama.cpp's defaults could not be measured at {level_label(n_cpu_moe)} "
            f"({base.measurement.failure}): fix that first, e.g. with a larger --ncmoe"
        )
    b = base.estimate
    own = [k for k in knobs if k.name in first]
    passes: list[tuple[_Pass, float | None, float | None]] = []
    origin = DEFAULTS
    if own:
        passes.append(_pass(knobs, own, DEFAULTS, run, trials, recheck, second, True, together, screened))
        origin = normalize(knobs, passes[0][0].kept)
        if run(origin, None).estimate is None:  # the moved knobs together could not be measured: stay
            origin = DEFAULTS
    rest = [k for k in knobs if k not in own]
    if rest or not own:
        passes.append(_pass(knobs, rest, origin, run, trials, recheck, second, False, together, screened))
    drifts = [d for _, d, _ in passes if d is not None]
    decode_drifts = [d for _, _, d in passes if d is not None]
    drift = max(drifts) if drifts else None
    decode_drift = max(decode_drifts) if decode_drifts else None
    floor = drift or 0.0
    verdicts = [v for p, _, _ in passes for v in p.verdicts]
    kept = {k: v for p, _, _ in passes for k, v in p.kept.items()}
    decode_kept = {k: v for p, _, _ in passes for k, v in p.decode_kept.items()}
    singles = {k: v for p, _, _ in passes for k, v in p.singles.items()}
    combination = normalize(knobs, {**dict(origin), **kept})
    run(combination, None)  # already measured unless two or more knobs were kept
    # The recommendation is chosen among settings made of kept values only: a single trial that beat the defaults
    # on one process and not on its second is no candidate.
    allowed = {DEFAULTS, origin, combination, *(singles[k] for k in kept)}
    measured_trials = [t for t in trials.values() if t.estimate is not None and t.setting in allowed]
    best_trial = min(measured_trials, key=lambda t: t.estimate.turn_s)  # type: ignore[union-attr]
    assert best_trial.estimate is not None
    e = best_trial.estimate
    # within the noise of the defaults: the origin (the defaults, or own knobs that moved on their own evidence)
    recommended = origin if within_noise(e, b, floor) else best_trial.setting
    decode_recommended = None
    if decode_kept:
        decode_combination = normalize(knobs, {**dict(origin), **decode_kept})
        run(decode_combination, None)  # the decode winners together
        allowed_decode = {DEFAULTS, recommended, decode_combination, *(singles[f"decode:{k}"] for k in decode_kept)}
        decode_recommended = _decode_choice(trials, allowed_decode, recommended, decode_drift or 0.0, second)
    return Search(
        n_cpu_moe,
        tuple(trials.values()),
        tuple(verdicts),
        combination,
        recommended,
        drift,
        decode_recommended,
        decode_drift,
        origin,
        tuple(k.name for k in own),
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
    once (untimed; its tg test at that depth restores the state llama-bench kept from the pp test, as repetitions
    do), counted at half ``prefill_tps`` (the defaults' prefill rate, measured shallow): attention slows a deep
    prefill, as :func:`~xover.analysis.advise.workload.measurement_seconds` counts it."""
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
