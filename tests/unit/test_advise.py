"""xover advise, pure parts: the TTFT integral, the coordinate search against a fake with a planted
optimum (and its measurement count), the noise rule, the theory's expectations, the crossover
revisited, the stored record and its renderers."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from fakes.known import defaults_and_t1
from xover.analysis import advise
from xover.analysis.advise import DEFAULTS, Advice, Measurement, RateSamples, ServerPoint, Setting, Turn, Workload
from xover.analysis.theory import model_terms
from xover.domain.presets import PRESETS
from xover.domain.profiles import builtin
from xover.domain.shapes import tensor_table
from xover.errors import XoverError
from xover.report.advise import advise_section_html, advise_section_markdown

KNOBS = advise.default_knobs(cpu_count=2)  # threads candidates 1 and 2
DEPTHS = (0, 10_240, 20_480, 30_720, 40_960)
AGENTIC = advise.agentic_workload(200)


def _samples(value: float, reps: int, jitter: float) -> tuple[float, ...]:
    return tuple(value * (1 + jitter * (i - (reps - 1) / 2)) for i in range(reps))


def fake(
    pp_factor: Callable[[dict[str, str]], float],
    tg_factor: Callable[[dict[str, str]], float] = lambda s: 1.0,
    calls: list[Setting] | None = None,
    reps: int = 3,
    jitter: float = 0.002,
    pp0: float = 3000.0,
    tg0: float = 60.0,
    fail: Callable[[dict[str, str]], bool] = lambda s: False,
) -> Callable[[Setting], Measurement]:
    """A machine whose prefill slows linearly with depth and whose knobs scale prefill and decode."""

    def measure(setting: Setting) -> Measurement:
        if calls is not None:
            calls.append(setting)
        s = dict(setting)
        if fail(s):
            return Measurement(failure="out of memory")
        pp = tuple(RateSamples(d, 4096, _samples(pp0 * pp_factor(s) / (1 + d / 20_000), reps, jitter)) for d in DEPTHS)
        tg = tuple(RateSamples(d, 64, _samples(tg0 * tg_factor(s) / (1 + d / 80_000), reps, jitter)) for d in DEPTHS)
        return Measurement(pp, tg, effective=(("n_threads", "2"), ("backends", "CUDA")), peak_rss_bytes=1 << 30)

    return measure


def planted(s: dict[str, str]) -> float:
    """The planted optimum: pinned weights (2x) and a 2048-token ubatch (1.5x); everything else hurts or
    does nothing."""
    f = 2.0 if s.get("load-mode") == "none" else 1.0
    f *= {"1024": 1.3, "2048": 1.5, "4096": 1.4}.get(s.get("ubatch-size", ""), 1.0)
    f *= 0.4 if s.get("no-op-offload") == "1" else 1.0
    f *= 0.5 if s.get("GGML_OP_OFFLOAD_MIN_BATCH") == "1024" else 1.0
    return f


# ---- the objective --------------------------------------------------------------------------------


def test_ttft_integrates_prefill_time_over_depth() -> None:
    # constant speed: L / tps
    assert advise.ttft_s([(0, 512, 1000.0)], 4096) == pytest.approx(4.096)
    # s = 1 ms/token at x = 250 (d0 + 500/2), 2 ms at 1250 (d1000 + 250): flat before, linear between,
    # the slope continued after: 0.25 + 1.5 + (2 + 2.75) / 2 * 0.75 = 3.53125 s
    assert advise.ttft_s([(0, 500, 1000.0), (1000, 500, 500.0)], 2000) == pytest.approx(3.53125)
    # a falling last segment (noise) is not extended downwards
    assert advise.ttft_s([(0, 500, 500.0), (1000, 500, 1000.0)], 2250) == pytest.approx(0.5 + 1.5 + 1.0)
    # decode: time per token linear in depth, flat beyond the ends
    assert advise.decode_s_per_token([(0, 100.0), (1000, 50.0)], 500) == pytest.approx(0.015)
    assert advise.decode_s_per_token([(0, 100.0), (1000, 50.0)], 0) == pytest.approx(0.01)


def test_estimate_is_the_workload_average_with_a_spread_from_repetitions() -> None:
    w = Workload("two", (Turn(1000, 10), Turn(3000, 10, weight=3.0)))
    m = Measurement(
        prefill=(RateSamples(0, 500, (900.0, 1000.0, 1100.0)),), decode=(RateSamples(0, 10, (10.0, 10.0, 10.0)),)
    )
    e = advise.estimate(m, w)
    assert e.ttft_s == pytest.approx((1.0 + 3 * 3.0) / 4)
    assert e.turn_s == pytest.approx(e.ttft_s + 1.0)
    assert len(e.turn_samples_s) == 3
    assert e.spread_s == pytest.approx(2.5 / 0.9 - 2.5 / 1.1)


def test_noise_rule_compares_a_difference_with_both_spreads_added() -> None:
    a = advise.Estimate(10.0, 9.0, 1.0, (9.8, 10.2))
    assert advise.within_noise(a, advise.Estimate(10.3, 9.3, 1.0, (10.0, 10.5)))  # 0.3 <= 0.4 + 0.5
    assert advise.within_noise(a, advise.Estimate(10.5, 9.5, 1.0, (10.45, 10.55)))  # 0.5 <= 0.4 + 0.1
    assert not advise.within_noise(a, advise.Estimate(10.6, 9.6, 1.0, (10.55, 10.65)))  # 0.6 > 0.4 + 0.1
    assert advise.within_noise(a, advise.Estimate(10.6, 9.6, 1.0, (10.55, 10.65)), drift_s=0.7)  # the drift, larger


# ---- the search, against a fake with a planted optimum ---------------------------------------------


def test_coordinate_search_finds_the_planted_optimum_in_eleven_measurements() -> None:
    calls: list[Setting] = []
    search = advise.coordinate_search(KNOBS, fake(planted, calls=calls), AGENTIC, n_cpu_moe=18)

    # 1 defaults + lm(1) + ub(3) + b(1) + nopo(1) + min batch(1) + threads(1: "2" is what the defaults ran)
    # + the defaults again + the two kept knobs together
    assert len(calls) == search.measurements == 11
    assert calls[0] == DEFAULTS and calls[-2] == advise.RECHECK and search.drift_s == 0.0
    assert len(set(calls)) == len(calls)  # nothing measured twice
    assert (("ubatch-size", "4096"), ("batch-size", "4096")) in calls  # a ubatch above -b raises -b with it
    assert search.recommended == search.combination == (("load-mode", "none"), ("ubatch-size", "2048"))
    assert calls[-1] == search.recommended
    by_knob = {v.knob: v for v in search.verdicts}
    assert by_knob["load-mode"].kept == "none" and by_knob["ubatch-size"].kept == "2048"
    assert by_knob["threads"].skipped == ("2",) and [e.value for e in by_knob["threads"].effects] == ["1"]
    assert by_knob["batch-size"].no_effect and by_knob["batch-size"].kept is None  # exactly no effect
    assert not by_knob["no-op-offload"].no_effect and by_knob["no-op-offload"].kept is None  # slower: an effect
    # prefill 3x faster: most of a turn is prefill at these lengths
    assert 2.0 < search.gain < 3.0
    assert advise.setting_label(KNOBS, search.recommended) == "lm=none ub=2048"


def test_a_screened_knob_measures_its_values_in_one_call_and_decides_as_before() -> None:
    """Issue 68's screening: -ub's three values come through ``screen`` in one call (one llama-bench process), the
    other knobs one process each; the search keeps what it keeps without screening, from the same measurements."""
    calls: list[Setting] = []
    screens: list[list[Setting]] = []
    measure = fake(planted, calls=calls)

    def screen(settings: Sequence[Setting]) -> list[Measurement]:
        screens.append(list(settings))
        return [measure(s) for s in settings]

    search = advise.coordinate_search(
        KNOBS, measure, AGENTIC, n_cpu_moe=18, screen=screen, screened=frozenset({"ubatch-size"})
    )
    plain = advise.coordinate_search(KNOBS, fake(planted), AGENTIC, n_cpu_moe=18)
    assert [[dict(s)["ubatch-size"] for s in sc] for sc in screens] == [["1024", "2048", "4096"]]
    assert search.recommended == plain.recommended and len(calls) == plain.measurements
    assert {v.knob: v.kept for v in search.verdicts} == {v.knob: v.kept for v in plain.verdicts}


def _own_threads(calls: list[Setting]) -> Callable[[Setting], Measurement]:
    """A configuration that runs ``-t 1`` itself: two threads prefill twice as fast, a 2048-token ubatch 1.5x, a
    1024-token one decodes 1.3x faster; the record says the threads in effect."""

    def factor(s: dict[str, str]) -> float:
        return (2.0 if s.get("threads") == "2" else 1.0) * (1.5 if s.get("ubatch-size") == "2048" else 1.0)

    def decode(s: dict[str, str]) -> float:  # a 1024-token ubatch decodes faster here (a decode variant); -t not
        return 1.3 if s.get("ubatch-size") == "1024" else 1.0

    inner = fake(factor, decode, calls=calls)

    def measure(setting: Setting) -> Measurement:
        m = inner(setting)
        threads = dict(setting).get("threads", "1")
        return dataclasses.replace(m, effective=(("n_threads", threads), ("backends", "CUDA")))

    return measure


def test_the_knobs_a_configuration_sets_are_searched_first_and_the_rest_on_top_of_their_winner() -> None:
    """Issue 46 item 8: a ``-t 1`` configuration searches -t first; two threads win, so every other knob is measured
    at -t 2 (the commands a configuration without -t runs, which the caller may share) and compared with -t 2."""
    calls: list[Setting] = []
    search = advise.coordinate_search(KNOBS, _own_threads(calls), AGENTIC, first=("threads",))
    t2 = (("threads", "2"),)
    assert search.origin == t2 and search.first == ("threads",)
    assert calls[:3] == [DEFAULTS, t2, advise.RECHECK]  # the own knob, then the defaults again
    later = [dict(advise.first_of(s)) for s in calls[3:]]
    assert later and all(s.get("threads") == "2" for s in later), later  # everything after on top of -t 2
    assert dict(search.recommended) == {"threads": "2", "ubatch-size": "2048"}
    assert search.decode_recommended is not None and dict(search.decode_recommended) == {
        "threads": "2",
        "ubatch-size": "1024",
    }
    ub = next(v for v in search.verdicts if v.knob == "ubatch-size")
    assert ub.kept == "2048" and search.base_of("ubatch-size") == t2 and search.base_of("threads") == DEFAULTS
    # its gain is against -t 2 (1.5x prefill), not against the -t 1 defaults (3x prefill)
    best = next(e for e in ub.effects if e.value == "2048")
    d2, both = search.trial(t2).estimate, search.trial((("ubatch-size", "2048"), *t2)).estimate
    assert d2 is not None and both is not None and best.change_s == pytest.approx(both.turn_s - d2.turn_s)
    # without it, the same winner, each knob from the -t 1 defaults
    plain = advise.coordinate_search(KNOBS, _own_threads([]), AGENTIC)
    assert plain.origin == DEFAULTS and dict(plain.recommended) == dict(search.recommended)


def test_an_own_knob_that_does_not_win_leaves_the_search_at_the_defaults() -> None:
    calls: list[Setting] = []
    measure = fake(lambda s: 1.5 if s.get("ubatch-size") == "2048" else 1.0, calls=calls)
    search = advise.coordinate_search(KNOBS, measure, AGENTIC, first=("threads",))
    assert search.origin == DEFAULTS and dict(search.recommended) == {"ubatch-size": "2048"}
    # the defaults again after the other knobs too: a third process, not the one measured after -t
    third = advise.again(DEFAULTS, 2)
    assert calls.count(advise.RECHECK) == 1 and third in calls and calls.index(third) > calls.index(advise.RECHECK) + 1
    assert advise.setting_label(KNOBS, third) == "defaults (again 2)"
    assert advise.apply_setting(advise.llama_config(KNOBS, DEFAULTS, None, "x"), KNOBS, third, "x").env == (
        (advise.RECHECK_ENV, "2"),
    )
    assert all("threads" not in dict(s) for s in calls if dict(advise.first_of(s)).get("ubatch-size"))


def _noisy_own_threads(t2_again: float, t2_third: float = 1.37) -> Callable[[Setting], Measurement]:
    """A ``-t 1`` configuration on a noisy machine (a benchmark run on 2 cores): the defaults' recheck 1.17x their
    first process, ``-t 2`` 1.37x in its first process, ``t2_again`` in its second and ``t2_third`` in its third
    (the recheck after the other knobs); the other knobs act not at all. The record says the threads in effect."""
    t2 = (("threads", "2"),)

    def speed(setting: Setting) -> float:
        if setting == advise.again(t2):
            return t2_again
        if setting == advise.again(t2, 2):
            return t2_third
        if dict(advise.first_of(setting)).get("threads") == "2":
            return 1.37
        return 1.17 if setting == advise.RECHECK else 1.0

    inner = fake(lambda s: 1.0, jitter=0.001)

    def measure(setting: Setting) -> Measurement:
        m = inner(advise.first_of(setting))
        f = speed(setting)
        scale = lambda rs: tuple(RateSamples(r.depth, r.tokens, tuple(x * f for x in r.samples_tps)) for r in rs)  # noqa: E731
        threads = dict(advise.first_of(setting)).get("threads", "1")
        return dataclasses.replace(
            m, prefill=scale(m.prefill), decode=scale(m.decode), effective=(("n_threads", threads), ("backends", "CPU"))
        )

    return measure


def test_an_own_knob_whose_two_processes_each_beat_the_defaults_moves_though_the_spreads_cover_its_gain() -> None:
    """A benchmark run of the second shape (issue 46 item 8): ``t=1``'s defaults at 0.62 and 0.53 s a turn, ``-t 2``
    at 0.46 and 0.32 s. The spreads added (0.09 + 0.14 s) covered the means' 0.19 s, so ``-t 1`` stayed, and its
    search ran 16 processes of its own (79 % of the study) to recommend nothing. Each of ``-t 2``'s processes beat
    each of the defaults': as the configuration's own knob it moves, and the rest is searched on top of it."""
    t2 = (("threads", "2"),)
    search = advise.coordinate_search(KNOBS, _noisy_own_threads(1.95), AGENTIC, first=("threads",))
    (threads,) = [v for v in search.verdicts if v.knob == "threads"]
    (effect,) = threads.effects
    assert effect.processes == 2 and effect.within_noise and effect.separated  # the stricter rule would keep -t 1
    assert threads.kept == "2" and search.origin == t2 and search.recommended == t2
    # not the configuration's own knob: the same processes keep the defaults
    plain = advise.coordinate_search(KNOBS, _noisy_own_threads(1.95), AGENTIC)
    (threads,) = [v for v in plain.verdicts if v.knob == "threads"]
    assert threads.effects[0].separated and threads.kept is None and plain.recommended == DEFAULTS
    # its second process no faster than the defaults' recheck: not separated, the own knob stays
    mixed = advise.coordinate_search(KNOBS, _noisy_own_threads(1.1), AGENTIC, first=("threads",))
    (threads,) = [v for v in mixed.verdicts if v.knob == "threads"]
    assert threads.effects[0].processes == 2 and not threads.effects[0].separated
    assert threads.kept is None and mixed.origin == DEFAULTS and mixed.recommended == DEFAULTS
    # a noisy recheck after the other knobs widens the final band past -t 2's first process: the recommendation
    # stays at the moved origin the other knobs were searched on, not back at -t 1
    drifting = advise.coordinate_search(KNOBS, _noisy_own_threads(1.95, 0.8), AGENTIC, first=("threads",))
    assert drifting.drift_s is not None and drifting.origin == t2 and drifting.recommended == t2


def test_the_report_says_an_own_knob_moved_within_the_noise_and_never_calls_it_no_effect() -> None:
    """A value kept within the noise (each of its processes beat each of the defaults') is no "no effect" knob, and
    the report says on what evidence it moved, not that it won beyond the noise."""
    from xover.domain.artifacts import TuneRecord
    from xover.measure import tune
    from xover.report.blocks import blocks_markdown
    from xover.report.tune import _record_blocks, knob_rows
    from xover.results.read_model import _read_search

    search = advise.coordinate_search(KNOBS, _noisy_own_threads(1.95), AGENTIC, first=("threads",))
    (threads,) = [v for v in search.verdicts if v.knob == "threads"]
    assert threads.kept == "2" and not threads.no_effect
    (row,) = [r for r in knob_rows(search, 200) if r.knob == "threads" and r.value == "2"]
    assert row.status.startswith("kept, within noise: each process faster than each of the defaults'"), row.status
    spec = defaults_and_t1()
    body = tune._body(spec.configs[1], KNOBS, search, spec, Path("m.gguf"), "CPU", 512, tune.Confirmed(search.origin))
    text = blocks_markdown(_record_blocks(TuneRecord.from_body(body, _read_search), 200))
    assert "t=2 won each of its two processes against each of the defaults'" in text, text
    (no_effect,) = [line for line in text.splitlines() if line.startswith("No effect on this hardware")]
    assert "won beyond the noise" not in text and "threads" not in no_effect, text


def test_a_single_kept_knob_needs_no_combination_measurement() -> None:
    calls: list[Setting] = []

    def only_lm(s: dict[str, str]) -> float:
        return 2.0 if s.get("load-mode") == "none" else 1.0

    search = advise.coordinate_search(KNOBS, fake(only_lm, calls=calls), AGENTIC)
    assert len(calls) == 10 and search.recommended == (("load-mode", "none"),)


def test_effects_within_noise_keep_the_defaults_and_are_reported_as_no_effect() -> None:
    # every knob moves prefill by 0.1 %, well inside a +-1 % spread between repetitions
    search = advise.coordinate_search(KNOBS, fake(lambda s: 1.001 if s else 1.0, jitter=0.01), AGENTIC)
    assert search.recommended == DEFAULTS and search.combination == DEFAULTS
    assert all(v.no_effect and v.kept is None for v in search.verdicts)
    assert search.measurements == 10 and search.gain == 1.0


def test_drift_between_measurements_widens_the_noise_band() -> None:
    """Load grows while the search runs (each measurement 1 % slower than the one before): a knob
    really worth 8 % measures as a smaller gain, still beyond the spreads within one llama-bench process. The
    defaults measured again at the end show the drift, and the gain is then within noise."""

    def drifting(recheck: bool) -> advise.Search:
        count = [0]
        inner = fake(lambda s: 1.08 if s.get("ubatch-size") == "2048" else 1.0)

        def measure(setting: Setting) -> Measurement:
            m = inner(setting)
            slow = 1 - 0.01 * count[0]
            count[0] += 1
            scale = lambda rs: tuple(RateSamples(r.depth, r.tokens, tuple(x * slow for x in r.samples_tps)) for r in rs)  # noqa: E731
            return dataclasses.replace(m, prefill=scale(m.prefill), decode=scale(m.decode))

        return advise.coordinate_search(KNOBS, measure, AGENTIC, n_cpu_moe=18, recheck=recheck)

    blind = drifting(recheck=False)
    assert blind.drift_s is None and blind.recommended == (("ubatch-size", "2048"),)  # the old rule is fooled
    seen = drifting(recheck=True)
    assert seen.drift_s is not None and seen.drift_s > 0.05 * seen.defaults.estimate.turn_s  # type: ignore[union-attr]
    assert seen.recommended == DEFAULTS
    ub = next(v for v in seen.verdicts if v.knob == "ubatch-size")
    assert ub.kept is None and all(e.within_noise for e in ub.effects)
    assert seen.trial(advise.RECHECK).label == "defaults (again)"
    config = advise.llama_config(KNOBS, advise.RECHECK, 18, "x")
    assert (
        config.env == ((advise.RECHECK_ENV, "1"),) and config.key != advise.llama_config(KNOBS, DEFAULTS, 18, "x").key
    )


def _lucky_once(lucky: Setting, factor: float) -> Callable[[Setting], Measurement]:
    """A machine where no knob acts, whose process for ``lucky`` lands on a quiet moment (``factor`` times
    faster, the repetitions tight); a second process of the same setting shows the truth. Each call is one
    llama-bench process."""
    inner = fake(lambda s: 1.0, jitter=0.001)

    def measure(setting: Setting) -> Measurement:
        m = inner(advise.first_of(setting))
        if setting != lucky:
            return m
        scale = lambda rs: tuple(RateSamples(r.depth, r.tokens, tuple(x * factor for x in r.samples_tps)) for r in rs)  # noqa: E731
        return dataclasses.replace(m, prefill=scale(m.prefill), decode=scale(m.decode))

    return measure


def test_a_marginal_winner_is_measured_again_in_a_fresh_process_and_dropped_when_the_rerun_disagrees() -> None:
    """The failure seen in CI: a knob that cannot act measured 1.7 times its noise band faster on one process.
    A gain under CLEAR_MARGIN times the noise is measured again; the two processes' mean and their difference
    decide, and the knob is not kept."""
    min_batch = (("GGML_OP_OFFLOAD_MIN_BATCH", "1024"),)
    calls: list[Setting] = []
    machine = _lucky_once(min_batch, 1.01)

    def measure(setting: Setting) -> Measurement:
        calls.append(setting)
        return machine(setting)

    search = advise.coordinate_search(KNOBS, measure, AGENTIC, n_cpu_moe=18)
    verdict = next(v for v in search.verdicts if v.knob == "GGML_OP_OFFLOAD_MIN_BATCH")
    (effect,) = verdict.effects
    assert effect.processes == 2 and effect.within_noise and verdict.kept is None
    assert search.recommended == DEFAULTS
    # the rerun comes after the defaults' recheck, and only the marginal winner is measured twice
    assert calls.index(advise.again(min_batch)) > calls.index(advise.RECHECK)
    assert sum(1 for c in calls if advise.is_again(c)) == 2
    assert search.trial(advise.again(min_batch)).label == "GGML_OP_OFFLOAD_MIN_BATCH=1024 (again)"
    # the second process runs as its own configuration (the store keeps it apart), with the same llama.cpp flags
    first, second = (advise.llama_config(KNOBS, s, 18, "x") for s in (min_batch, advise.again(min_batch)))
    assert second.key != first.key and second.env == ((advise.RECHECK_ENV, "1"),)
    assert second.bench_argv() == first.bench_argv() and second.settings == first.settings


def test_the_next_leader_is_measured_again_too_when_the_first_ones_second_process_demotes_it() -> None:
    """A search over a 2-core machine kept a value on one process: its knob's leader, lucky once, was measured again
    and demoted, which left another value, lucky by a little less, leading on its one process. No ubatch acts here:
    each leader in turn gets its second process, and neither is kept."""
    ub1024, ub2048 = (("ubatch-size", "1024"),), (("ubatch-size", "2048"),)
    lucky = {ub2048: 1.012, ub1024: 1.009}  # each about 2 and 1.5 times its one-process noise band faster
    inner = fake(lambda s: 1.0, jitter=0.001)
    calls: list[Setting] = []

    def measure(setting: Setting) -> Measurement:
        calls.append(setting)
        m, f = inner(advise.first_of(setting)), lucky.get(setting, 1.0)
        scale = lambda rs: tuple(RateSamples(r.depth, r.tokens, tuple(x * f for x in r.samples_tps)) for r in rs)  # noqa: E731
        return dataclasses.replace(m, prefill=scale(m.prefill), decode=scale(m.decode))

    search = advise.coordinate_search(KNOBS, measure, AGENTIC, n_cpu_moe=18)
    verdict = next(v for v in search.verdicts if v.knob == "ubatch-size")
    effects = {e.value: e for e in verdict.effects}
    assert effects["1024"].processes == 2 and effects["2048"].processes == 2
    assert calls.index(advise.again(ub2048)) < calls.index(advise.again(ub1024))  # the first leader first
    assert all(e.within_noise for e in effects.values()) and verdict.kept is None
    assert search.recommended == DEFAULTS


def test_two_quiet_processes_of_a_value_that_cannot_act_are_weighed_against_the_defaults_own_spread() -> None:
    """The failure seen in a fresh clone's suite: ``-b 4096`` (no effect on one sequence) measured faster on both its
    processes, their mean 1.3 times the defaults' drift ahead. The defaults' two processes differ by that drift, the
    value's two by a third of it: the spreads between each side's processes, added, cover the difference."""
    min_batch = (("GGML_OP_OFFLOAD_MIN_BATCH", "1024"),)
    # rates: the defaults' recheck 3 % faster than their first process, the value's two processes 4.7 % and 5.8 %
    speed = {DEFAULTS: 1.0, advise.RECHECK: 1.03, min_batch: 1.047, advise.again(min_batch): 1.058}
    inner = fake(lambda s: 1.0, jitter=0.001)

    def measure(setting: Setting) -> Measurement:
        m = inner(advise.first_of(setting))
        f = speed.get(setting, 1.0)
        scale = lambda rs: tuple(RateSamples(r.depth, r.tokens, tuple(x * f for x in r.samples_tps)) for r in rs)  # noqa: E731
        return dataclasses.replace(m, prefill=scale(m.prefill), decode=scale(m.decode))

    search = advise.coordinate_search(KNOBS, measure, AGENTIC, n_cpu_moe=18)
    verdict = next(v for v in search.verdicts if v.knob == "GGML_OP_OFFLOAD_MIN_BATCH")
    (effect,) = verdict.effects
    assert search.drift_s is not None and effect.processes == 2
    value_spread = search.trial(min_batch).estimate.turn_s - search.trial(advise.again(min_batch)).estimate.turn_s  # type: ignore[union-attr]
    # the means differ by more than the drift and more than the value's own spread (the former rule kept it) ...
    assert -effect.change_s > search.drift_s and -effect.change_s > value_spread > 0
    # ... but not by more than the two spreads added
    assert effect.noise_s == pytest.approx(search.drift_s + value_spread)
    # likewise on the decode part of the turn (the same processes, decode as much faster)
    value_decode_spread = abs(
        search.trial(min_batch).estimate.decode_s - search.trial(advise.again(min_batch)).estimate.decode_s
    )  # type: ignore[union-attr]  # noqa: E501
    assert search.decode_drift_s is not None
    assert effect.decode_noise_s == pytest.approx(search.decode_drift_s + value_decode_spread)
    assert effect.decode_within_noise and verdict.kept is None
    assert effect.within_noise and verdict.kept is None and search.recommended == DEFAULTS


def test_a_marginal_winner_that_reproduces_is_kept_on_two_processes_and_a_clear_one_on_one() -> None:
    calls: list[Setting] = []
    # ub=2048 1.5 % faster every time: beyond the tight spreads, under three times them
    search = advise.coordinate_search(
        KNOBS, fake(lambda s: 1.015 if s.get("ubatch-size") == "2048" else 1.0, calls=calls, jitter=0.001), AGENTIC
    )
    ub = next(v for v in search.verdicts if v.knob == "ubatch-size")
    best = next(e for e in ub.effects if e.value == "2048")
    assert ub.kept == "2048" and best.processes == 2 and not best.within_noise
    assert search.recommended == (("ubatch-size", "2048"),)
    # a gain far beyond the noise needs no second process (the planted optimum's count stays eleven, above)
    calls.clear()
    advise.coordinate_search(KNOBS, fake(planted, calls=calls), AGENTIC)
    assert not any(advise.is_again(c) for c in calls if c != advise.RECHECK)


def test_failed_candidates_are_recorded_and_never_recommended() -> None:
    search = advise.coordinate_search(
        KNOBS, fake(planted, fail=lambda s: s.get("ubatch-size") in ("2048", "4096")), AGENTIC
    )
    ub = next(v for v in search.verdicts if v.knob == "ubatch-size")
    assert ub.failed == ("2048", "4096") and ub.kept == "1024"
    assert search.recommended == (("load-mode", "none"), ("ubatch-size", "1024"))
    failed = [t for t in search.trials if t.estimate is not None or t.measurement.failure]
    assert len(failed) == search.measurements


def test_defaults_that_cannot_run_say_what_to_change() -> None:
    with pytest.raises(XoverError, match="defaults could not be measured at ncmoe=4 .*out of memory.*--ncmoe"):
        advise.coordinate_search(KNOBS, fake(planted, fail=lambda s: True), AGENTIC, n_cpu_moe=4)


# ---- configurations -------------------------------------------------------------------------------


def test_settings_become_llama_bench_and_llama_server_configurations() -> None:
    setting = advise.normalize(
        KNOBS,
        {
            "threads": "8",
            "GGML_OP_OFFLOAD_MIN_BATCH": "1024",
            "no-op-offload": "1",
            "ubatch-size": "4096",
            "load-mode": "none",
            "batch-size": "2048",
        },
    )
    assert setting == (
        ("load-mode", "none"),
        ("ubatch-size", "4096"),
        ("batch-size", "4096"),
        ("no-op-offload", "1"),
        ("GGML_OP_OFFLOAD_MIN_BATCH", "1024"),
        ("threads", "8"),
    )
    assert advise.normalize(KNOBS, {"ubatch-size": "512", "threads": "auto"}) == DEFAULTS  # llama.cpp's defaults
    config = advise.llama_config(KNOBS, setting, 18, "x")
    assert config.bench_argv() == ("-ncmoe", "18", "-lm", "none", "-ub", "4096", "-b", "4096", "-nopo", "1", "-t", "8")
    assert config.environment() == (("GGML_OP_OFFLOAD_MIN_BATCH", "1024"),)
    assert advise.server_command(config, "m.gguf") == (
        "GGML_OP_OFFLOAD_MIN_BATCH=1024 llama-server -m m.gguf -ncmoe 18 -lm none -ub 4096 -b 4096 --no-op-offload -t 8"
    )
    assert advise.llama_config(KNOBS, DEFAULTS, None, "d").bench_argv() == ()
    with pytest.raises(XoverError, match="unknown knob 'ub'"):
        advise.with_candidates(KNOBS, "ub", ["1"])


# ---- workloads ------------------------------------------------------------------------------------


def test_workload_files_lengths_and_representative_points() -> None:
    w = advise.parse_workload("# turns of a session\n12k, 300\n20000\n\n30k 100 2\n", 200, "w.txt")
    assert [(t.length, t.response, t.weight) for t in w.turns] == [
        (12288, 300, 1.0),
        (20000, 200, 1.0),
        (30720, 100, 2.0),
    ]
    assert w.depths() == (0, 12288, 20000, 30720)
    for bad, message in (
        ("x", "not a token count"),
        ("1,2,3,4", "PROMPT_TOKENS"),
        ("1,2,w", "weight"),
        ("#", "no turns"),
    ):
        with pytest.raises(XoverError, match=message):
            advise.parse_workload(bad, 200, "w.txt")
    many = Workload("many", tuple(Turn(L, 10) for L in range(1000, 9000, 1000)))
    assert many.representative() == (2000, 4000, 6000, 8000)  # weighted quartiles, ending at the longest
    assert AGENTIC.scaled(1 / 4).lengths == (2560, 5120, 7680, 10240)
    assert "uniform over 10K, 20K, 30K, 40K tokens, 200-token responses" in AGENTIC.describe()


# ---- theory ---------------------------------------------------------------------------------------


def test_theory_expects_pinned_copies_and_no_effect_on_cpu_only_builds() -> None:
    terms = model_terms(tensor_table(PRESETS["qwen3-30b-a3b"]))
    search = advise.coordinate_search(KNOBS, fake(planted), AGENTIC, n_cpu_moe=18)
    gpu = {e.setting: e for e in advise.expectations(terms, builtin("h200"), KNOBS, search, AGENTIC, gpu_build=True)}
    lm, nopo = gpu[(("load-mode", "none"),)], gpu[(("no-op-offload", "1"),)]
    assert (
        lm.change is not None
        and lm.change < 0.8
        and "pinned memory at 55.5 GB/s" in lm.note
        and "pageable at 7.3" in lm.note
    )
    assert nopo.change is not None and nopo.change != pytest.approx(1.0) and "computed on the CPU" in nopo.note
    assert gpu[(("ubatch-size", "2048"),)].change < 1.0  # type: ignore[operator]
    assert gpu[(("batch-size", "4096"),)].change == pytest.approx(1.0)
    assert gpu[(("threads", "1"),)].change is None and "not modelled" in gpu[(("threads", "1"),)].note
    assert "stay on the CPU" in gpu[(("GGML_OP_OFFLOAD_MIN_BATCH", "1024"),)].note
    # the same hardware with a CPU-only llama.cpp build: GPU knobs expect nothing
    cpu = {e.setting: e for e in advise.expectations(terms, builtin("h200"), KNOBS, search, AGENTIC, gpu_build=False)}
    for setting in ((("load-mode", "none"),), (("no-op-offload", "1"),), (("GGML_OP_OFFLOAD_MIN_BATCH", "1024"),)):
        assert cpu[setting].change == pytest.approx(1.0) and "CPU-only build" in cpu[setting].note


# ---- the crossover, revisited ---------------------------------------------------------------------


def _flat(pp: float, tg: float) -> Measurement:
    """Speeds that do not depend on depth: TTFT(L) = L / pp exactly."""
    depths = (0, 4096, 8192, 16384)
    return Measurement(
        tuple(RateSamples(d, 512, _samples(pp, 3, 1e-4)) for d in depths),
        tuple(RateSamples(d, 64, _samples(tg, 3, 1e-4)) for d in depths),
    )


def test_crossover_revisited_moves_with_the_recommended_settings() -> None:
    # A: all experts on the GPU (fast prefill, slow decode); B: experts in host memory. With R = 200:
    # defaults  L/2000 + 10 = L/1000 + 5  -> 10,000 tokens
    # knobs     L/4000 + 10 = L/1500 + 5  -> 12,000 tokens
    lengths = (2000, 4000, 8000, 12000, 16000)
    (pair,) = advise.revisit_crossovers(
        [("ncmoe=0", _flat(2000, 20), _flat(4000, 20)), ("ncmoe=18", _flat(1000, 40), _flat(1500, 40))],
        lengths,
        200,
        n_boot=0,
    )
    assert (pair.a, pair.b) == ("ncmoe=0", "ncmoe=18")
    assert [c.length for c in pair.at_defaults.interpolated] == [pytest.approx(10_000, rel=1e-3)]
    assert [c.length for c in pair.with_knobs.interpolated] == [pytest.approx(12_000, rel=1e-3)]
    assert pair.at_defaults.faster_at(0) == "ncmoe=18" and pair.at_defaults.faster_at(len(lengths) - 1) == "ncmoe=0"


def test_server_confirmation_averages_over_the_workload() -> None:
    w = Workload("w", (Turn(1000, 100), Turn(2000, 100)))
    points = [ServerPoint(1000, 0.5, 50.0), ServerPoint(2000, 1.5, 25.0)]
    assert advise.server_turn_s(points, w) == pytest.approx(((0.5 + 2.0) + (1.5 + 4.0)) / 2)
    c = advise.confirmation(18, points, [ServerPoint(1000, 0.25, 50.0), ServerPoint(2000, 0.75, 25.0)], w, 2)
    assert c.gain == pytest.approx(4.0 / 3.5)


# ---- the stored record and its renderers ----------------------------------------------------------


def _advice() -> Advice:
    terms = model_terms(tensor_table(PRESETS["qwen3-30b-a3b"]))
    searches = tuple(
        advise.coordinate_search(KNOBS, fake(planted, pp0=pp0, tg0=tg0), AGENTIC, n)
        for n, pp0, tg0 in ((0, 4000.0, 30.0), (18, 3000.0, 60.0))
    )
    lengths = AGENTIC.representative()
    return Advice(
        model="models/<qwen>.gguf",
        backend="CUDA",
        hardware="h200",
        workload=AGENTIC,
        workload_note="",
        chunk=4096,
        n_gen=64,
        repetitions=3,
        knobs=KNOBS,
        searches=searches,
        expectations=tuple(
            e for s in searches for e in advise.expectations(terms, builtin("h200"), KNOBS, s, AGENTIC, True)
        ),
        crossovers=advise.revisit_crossovers(
            [(s.label, s.defaults.measurement, s.best.measurement) for s in searches], lengths, 200, n_boot=20
        ),
        confirmation=advise.confirmation(
            18,
            [ServerPoint(L, L / 2000, 50.0) for L in lengths],
            [ServerPoint(L, L / 6000, 50.0) for L in lengths],
            AGENTIC,
            2,
        ),
    )


def test_the_advice_round_trips_through_its_stored_form() -> None:
    advice = _advice()
    stored = json.loads(json.dumps(advice.to_dict()))
    assert stored["schema"] == advise.SCHEMA
    assert advise.advice_from_dict(stored) == advice
    with pytest.raises(XoverError, match="rerun xover advise"):
        advise.advice_from_dict({"schema": "other"})


def test_renderers_show_the_recommendation_the_command_and_the_crossovers() -> None:
    advice = _advice()
    assert advice.best.n_cpu_moe == 18 and advice.measurements == 22
    md = advise_section_markdown(advice)
    assert "Recommendation: ncmoe=18 lm=none ub=2048" in md
    assert "llama-server -m models/<qwen>.gguf -ncmoe 18 -lm none -ub 2048" in md
    assert "Confirmed through llama-server" in md and "The crossover, revisited" in md
    assert (
        "defaults measured again after the knobs:" in md
        and "(drift 0.0 ms, 0.0%)" in md
        and "| defaults (again) |" in md
    )
    assert "| ncmoe=0 vs ncmoe=18 |" in md
    assert "batch-size: no effect on this hardware" in md
    page = advise_section_html(advice)
    assert page.startswith('<section class="advise">') and "models/&lt;qwen&gt;.gguf" in page and "<qwen>" not in page
    assert page.count("<table>") == 4  # the confirmation, two levels, the crossovers


def test_a_flash_attention_value_auto_ran_as_is_not_searched_again() -> None:
    """llama-bench reports -fa auto as -1 in every record; where llama.cpp's log said what auto ran as (the store's
    reading puts it in the record's terms), that value is the defaults' own and is not measured again."""

    def searched(reported: str) -> advise.KnobVerdict:
        inner = fake(lambda s: 1.0)

        def measure(setting: Setting) -> Measurement:
            m = inner(setting)
            fa = dict(setting).get("flash-attn")
            flash = {"on": "1", "off": "0"}.get(fa, reported) if fa else reported
            return dataclasses.replace(m, effective=(*m.effective, ("flash_attn", flash)))

        search = advise.coordinate_search((advise.FLASH_ATTN,), measure, AGENTIC)
        (verdict,) = search.verdicts
        return verdict

    ran_on, unknown, ran_off = searched("1"), searched("-1"), searched("0")
    assert ran_on.skipped == ("on",) and [e.value for e in ran_on.effects] == ["off"]
    assert unknown.skipped == () and [e.value for e in unknown.effects] == ["on", "off"]
    assert ran_off.skipped == ("off",) and [e.value for e in ran_off.effects] == ["on"]
    assert advise.FLASH_ATTN.in_effect({"flash_attn": "1"}) == "on"
    assert advise.FLASH_ATTN.in_effect({"flash_attn": "-1"}) == "auto"
    assert advise.FLASH_ATTN.in_effect({"n_threads": "2"}) is None


def test_the_store_reading_puts_what_auto_ran_as_in_the_record_terms(tmp_path: Path) -> None:
    from xover.domain.config import LlamaConfig
    from xover.domain.records import BenchResult, Provenance
    from xover.measure import bench as benchrun
    from xover.measure.advise import measurement_from_store
    from xover.results.store import Store

    sweep = benchrun.BenchTests(model=Path("m.gguf"), depths=(0,), n_prompt=512, n_gen=16, repetitions=2)
    prov = Provenance(None, None, None, None, None, None, None, "h", "Linux", "0", None)
    auto, off = LlamaConfig("auto"), LlamaConfig("off", (("flash-attn", "off"),))
    with Store(tmp_path) as store:
        run = store.begin_run("bench", ["test"], prov)
        for config, fa in ((auto, -1), (off, 0)):
            store.put_config(config)
            record = {"n_threads": 2, "flash_attn": fa, "backends": "CPU"}
            for n_prompt, n_gen in ((512, 0), (0, 16)):
                store.add_bench_result(
                    run, "mk", BenchResult(config.key, n_prompt, n_gen, 0, (1, 1), (9.0, 9.0), 9.0, 0.0, record)
                )
        unresolved = measurement_from_store(store, auto, "mk", sweep, None, False)
        other_model = {"config_key": auto.key, "model_key": "other", "fields": {"flash_attn": "1"}}
        store.add_artifact(run, benchrun.RESOLVED_ARTIFACT, other_model)
        another_models = measurement_from_store(store, auto, "mk", sweep, None, False)
        for config in (auto, off):  # a log line of -fa off's process is never read over its 0
            body = {"config_key": config.key, "model_key": "mk", "fields": {"flash_attn": "1"}}
            store.add_artifact(run, benchrun.RESOLVED_ARTIFACT, body)
        resolved = measurement_from_store(store, auto, "mk", sweep, None, False)
        explicit = measurement_from_store(store, off, "mk", sweep, None, False)
    assert dict(unresolved.effective)["flash_attn"] == "-1"
    assert dict(another_models.effective)["flash_attn"] == "-1"  # another model's heads, another answer
    assert dict(resolved.effective)["flash_attn"] == "1"
    assert dict(explicit.effective)["flash_attn"] == "0"


# ---- reading measurements back from the store -----------------------------------------------------


def test_measurements_are_read_back_from_the_store(tmp_path: Path) -> None:
    from xover.domain.records import BenchResult, Provenance
    from xover.llamacpp import memory
    from xover.measure import bench as benchrun
    from xover.measure.advise import is_gpu_build, measurement_from_store
    from xover.results.store import Store

    config = advise.llama_config(KNOBS, (("load-mode", "none"),), 18, "ncmoe=18 lm=none")
    sweep = benchrun.BenchTests(model=Path("m.gguf"), depths=(0, 1024), n_prompt=512, n_gen=16, repetitions=2)
    record = {"n_threads": 16, "load_mode": "none", "no_op_offload": 0, "backends": "CUDA", "model_type": "x"}

    def result(n_prompt: int, n_gen: int, depth: int, tps: float) -> BenchResult:
        return BenchResult(config.key, n_prompt, n_gen, depth, (1, 1), (tps, tps * 1.1), tps, 0.0, record)

    prov = Provenance(None, None, None, None, None, None, None, "h", "Linux", "0", None)
    with Store(tmp_path) as store:
        run = store.begin_run("bench", ["test"], prov)
        store.put_config(config)
        for r in (result(512, 0, 0, 5000.0), result(0, 16, 0, 90.0), result(512, 0, 1024, 4000.0)):
            store.add_bench_result(run, "mk", r)
        assert (
            measurement_from_store(store, config, "mk", sweep, None, False).failure
            == "llama-bench left tests unmeasured"
        )
        store.add_bench_result(run, "mk", result(0, 16, 1024, 80.0))
        store.add_bench_result(run, "other-model", result(512, 0, 1024, 1.0))
        store.add_artifact(
            run,
            memory.ARTIFACT,
            {
                "config_key": config.key,
                "source": "llama-bench",
                **memory.MemoryUse(5 << 30, (("CUDA0", "model", 9 << 30),)).to_dict(),
            },
        )
        m = measurement_from_store(store, config, "mk", sweep, None, True)
        failed = measurement_from_store(store, config, "mk", sweep, "llama-bench exited with code 1", False)
    assert m.ok and m.reused and m.repetitions == 2
    assert [(r.depth, r.tokens, r.samples_tps) for r in m.prefill] == [
        (0, 512, (5000.0, 5500.0)),
        (1024, 512, (4000.0, 4400.0)),
    ]
    assert [r.depth for r in m.decode] == [0, 1024]
    assert dict(m.effective) == {"n_threads": "16", "load_mode": "none", "no_op_offload": "0", "backends": "CUDA"}
    assert (m.peak_rss_bytes, m.device_bytes) == (5 << 30, 9 << 30)
    assert failed.failure == "llama-bench exited with code 1" and not failed.ok
    assert (
        is_gpu_build("CUDA") and is_gpu_build("CPU,Vulkan") and not is_gpu_build("CPU") and not is_gpu_build("BLAS,CPU")
    )


def test_a_round_reads_only_its_own_process(tmp_path: Path) -> None:
    """A resumed confirmation reads each round's own llama-bench process: neither a later round's record (the latest
    stored) nor the search's (outside rounds) stands in for it, and the search never reads a round's."""
    from xover.domain.records import BenchResult, Provenance
    from xover.measure import bench as benchrun
    from xover.measure.advise import measurement_from_store
    from xover.results.store import Store

    config = advise.llama_config(KNOBS, (), 18, "ncmoe=18")
    sweep = benchrun.BenchTests(model=Path("m.gguf"), depths=(0,), n_prompt=0, n_gen=16, repetitions=2)
    prov = Provenance(None, None, None, None, None, None, None, "h", "Linux", "0", None)
    with Store(tmp_path) as store:
        run = store.begin_run("bench", ["test"], prov)
        store.put_config(config)
        for n, tps in ((None, 10.0), (1, 11.0), (2, 12.0), (3, 13.0)):
            r = BenchResult(config.key, 0, 16, 0, (1, 1), (tps, tps), tps, 0.0, {"backends": "CUDA"}, round=n)
            store.add_bench_result(run, "mk", r)
        read = {
            n: measurement_from_store(store, config, "mk", dataclasses.replace(sweep, round=n), None, True)
            for n in (None, 1, 2, 3, 4)
        }
    assert {n: m.decode[0].samples_tps[0] for n, m in read.items() if m.failure is None} == {
        None: 10.0,
        1: 11.0,
        2: 12.0,
        3: 13.0,
    }
    assert read[4].failure == "llama-bench left tests unmeasured"


def test_doubts_name_kept_values_the_theory_rules_out_and_combinations_that_do_not_add_up() -> None:
    def interacting(s: dict[str, str]) -> float:
        """nopo=1 "helps" on a CPU build (drift), ub=2048 helps, together they do not."""
        if s.get("no-op-offload") == "1" and s.get("ubatch-size") == "2048":
            return 1.0
        return {"1": 1.3}.get(s.get("no-op-offload", ""), 1.0) * {"2048": 1.5}.get(s.get("ubatch-size", ""), 1.0)

    search = advise.coordinate_search(KNOBS, fake(interacting), AGENTIC, n_cpu_moe=0)
    assert search.recommended == (("ubatch-size", "2048"),)  # the fastest measured, not the combination
    terms = model_terms(tensor_table(PRESETS["tiny-moe"]))
    advice = dataclasses.replace(
        _advice(),
        searches=(search,),
        crossovers=(),
        confirmation=None,
        expectations=advise.expectations(terms, builtin("cpu"), KNOBS, search, AGENTIC, False),
    )
    doubts = advice.doubts(search)
    assert len(doubts) == 2
    assert doubts[0].startswith("no-op-offload=1 was kept, but the theory expects no effect here")
    assert "measured slower than ub=2048 alone" in doubts[1]
    assert "doubt: no-op-offload=1 was kept" in advise_section_markdown(advice)


def test_a_confirmation_slower_than_the_defaults_is_reported_as_not_confirmed() -> None:
    advice = _advice()
    lengths = AGENTIC.representative()
    slower = advise.confirmation(
        18,
        [ServerPoint(L, L / 6000, 50.0) for L in lengths],
        [ServerPoint(L, L / 2000, 50.0) for L in lengths],
        AGENTIC,
        2,
    )
    md = advise_section_markdown(dataclasses.replace(advice, confirmation=slower))
    assert "NOT confirmed through llama-server" in md and "Keep the defaults" in md
    assert "Confirmed through" not in md


# ---- decode's own best setting (issue 31) ---------------------------------------------------------


def test_a_knob_that_trades_prefill_for_decode_gives_a_setting_for_decode_heavy_turns() -> None:
    """Threads = 1 halves prefill and decodes 1.5x faster (a machine where one thread streams the experts and more
    only contend); pinned weights double prefill. The whole turn (agentic lengths) wants lm=none; decode wants t=1:
    both sides stay in the search, each knob with its prefill and its decode change."""

    def pp(s: dict[str, str]) -> float:
        return (2.0 if s.get("load-mode") == "none" else 1.0) * (0.5 if s.get("threads") == "1" else 1.0)

    def tg(s: dict[str, str]) -> float:
        return 1.5 if s.get("threads") == "1" else 1.0

    search = advise.coordinate_search(KNOBS, fake(pp, tg), AGENTIC)
    assert search.recommended == (("load-mode", "none"),)
    assert search.decode_recommended == (("threads", "1"),)
    threads = next(v for v in search.verdicts if v.knob == "threads").effects[0]
    assert threads.change_s > threads.noise_s  # slower per agentic turn
    assert threads.decode_change_s < -threads.decode_noise_s  # faster decode
    # a knob that moves nothing in decode leaves no setting for decode
    assert advise.coordinate_search(KNOBS, fake(planted), AGENTIC).decode_recommended is None


def test_which_knobs_can_act_here_and_why_the_others_are_skipped() -> None:
    from xover.domain.shapes import TensorInfo

    def experts(layer: int, t: str, rows: int) -> list[TensorInfo]:
        return [TensorInfo(f"blk.{layer}.ffn_{p}_exps.weight", (256, rows, 8), t, 1) for p in ("gate", "up")]

    tensors = [
        *experts(0, "MXFP4", 2880),
        *experts(1, "MXFP4", 2880),
        TensorInfo("blk.0.attn_q.weight", (64, 64), "Q8_0", 1),
    ]
    avx2 = frozenset({"avx2", "fma"})
    assert advise.cpu_experts(tensors, 1, (), gpu_build=True) == (("MXFP4", 2880),) * 2
    assert advise.cpu_experts(tensors, 0, ("blk\\.1\\.ffn_.*=CPU",), gpu_build=True) == (("MXFP4", 2880),) * 2
    assert len(advise.cpu_experts(tensors, 0, (), gpu_build=False)) == 4  # a CPU-only build keeps every one
    assert advise.cpu_experts(tensors, 0, (), gpu_build=True) == ()
    gpu = advise.Context(True, avx2, advise.cpu_experts(tensors, 2, (), True))
    keep, skipped = advise.split(["load-mode", "no-host", "repack", "threads"], gpu)
    assert keep == ("load-mode", "no-host", "threads")
    assert skipped == (("repack", skipped[0][1]),) and "--no-host" in skipped[0][1]
    # no kernel for this type on this CPU: --no-host would repack nothing
    q6 = advise.Context(True, avx2, (("Q6_K", 768),))
    assert "no repacked kernel" in str(advise.skip_reason("no-host", q6))
    assert advise.skip_reason("no-host", advise.Context(True, frozenset(), (("Q6_K", 768),))) is None  # flags unknown
    assert (
        advise.skip_reason("no-host", advise.Context(True, avx2, ()))
        == "no experts stay on the CPU in this configuration"
    )
    # a CPU-only build: the GPU-only knobs go, --no-repack stays where something repacks
    cpu = advise.Context(False, avx2, (("Q4_K", 256), ("Q6_K", 256)))
    keep, skipped = advise.split(["load-mode", "no-op-offload", "no-host", "repack", "threads"], cpu)
    assert keep == ("repack", "threads")
    assert {n: w for n, w in skipped}["no-host"] == "a CPU-only build copies no weights to a GPU"
    assert advise.repacks("Q4_K", 256, avx2) and not advise.repacks("Q4_K", 260, avx2)
    assert not advise.repacks("Q4_K", 256, frozenset({"sse4_2"})) and advise.repacks("Q2_K", 8, frozenset({"avx512f"}))
    assert advise.repacks("Q6_K", 8, frozenset({"asimd", "asimddp"}))


def test_a_cached_turn_prefills_only_its_new_tokens_at_its_depth_and_decodes_past_both() -> None:
    """Known answer: prefill at 1,000 t/s at depth 0 and 500 t/s at 8K (linear in seconds per token between), decode
    at 100 t/s at 0 and 50 at 8K. A cached turn of 1K new tokens on 4K cached prefills from 4K to 5K and decodes at
    5K; the same 1K tokens cold prefill from 0."""
    m = Measurement(
        prefill=(RateSamples(0, 0, (1000.0, 1000.0)), RateSamples(8192, 0, (500.0, 500.0))),
        decode=(RateSamples(0, 16, (100.0, 100.0)), RateSamples(8192, 16, (50.0, 50.0))),
    )

    def spt(depth: float) -> float:  # seconds per token, linear between the two tests
        return 1 / 1000 + (1 / 500 - 1 / 1000) * depth / 8192

    cached = advise.estimate(m, advise.cached_workload([1024], 4096, 100))
    assert cached.ttft_s == pytest.approx(1024 * (spt(4096) + spt(5120)) / 2)
    assert cached.decode_s == pytest.approx(100 * (1 / 100 + (1 / 50 - 1 / 100) * 5120 / 8192))
    cold = advise.estimate(m, advise.uniform_workload([1024], 100))
    assert cold.ttft_s == pytest.approx(1024 * (spt(0) + spt(1024)) / 2) and cold.ttft_s < cached.ttft_s
    assert advise.cached_workload([2048, 512], 4096, 100).describe().startswith("cached turns on 4K: ")


def test_the_search_table_scores_each_value_per_cached_turn_too() -> None:
    """A knob that halves prefill and doubles decode (a repacked placement, say) loses the cold agentic turn and
    wins the cached one that adds 512 tokens to a 16K context: the table shows both from the same tests."""
    from xover.report.tune import knob_table

    knobs = [k for k in KNOBS if k.name == "load-mode"]

    def trade(s: dict[str, str]) -> float:
        return 0.5 if s.get("load-mode") == "none" else 1.0

    search = advise.coordinate_search(knobs, fake(trade, lambda s: 1 / trade(s)), AGENTIC)
    turns = advise.cached_workload([512], 16384, 200)
    header, rows = knob_table(search, 200, turns)
    assert header[5] == "per cached turn (cached turns on 16K) vs defaults"
    row = next(r for r in rows if r[1] == "none")
    cold, cached = float(row[4].split()[0]), float(row[5].split()[0])
    assert cold > 0 > cached  # slower per cold turn, faster per cached turn
    m = {t.label: t for t in search.trials}
    want = (
        advise.estimate(m["lm=none"].measurement, turns).turn_s
        - advise.estimate(m["defaults"].measurement, turns).turn_s
    )
    assert cached == pytest.approx(want, rel=1e-2)
    assert len(knob_table(search, 200)[0]) == len(header) - 1  # no cached turns, no column


def test_the_second_kind_of_turn_is_decode_or_the_studys_cached_turns() -> None:
    """A knob that halves prefill and doubles decode: decode alone always wants it; cached turns want it when they
    add 512 tokens to a 16K context, not when they add 16K (their prefill then outweighs the faster answer). The
    cold agentic turn never does."""
    knobs = [k for k in KNOBS if k.name == "load-mode"]

    def trade(s: dict[str, str]) -> float:
        return 0.5 if s.get("load-mode") == "none" else 1.0

    def search(second: advise.Workload | None) -> advise.Search:
        return advise.coordinate_search(knobs, fake(trade, lambda s: 1 / trade(s)), AGENTIC, second=second)

    pinned = (("load-mode", "none"),)
    assert search(None).recommended == DEFAULTS and search(None).decode_recommended == pinned
    small = search(advise.cached_workload([512], 16384, 200))
    assert small.recommended == DEFAULTS and small.decode_recommended == pinned
    effect = next(v for v in small.verdicts if v.knob == "load-mode").effects[0]
    assert effect.change_s > 0 > effect.decode_change_s and not effect.decode_within_noise
    assert search(advise.cached_workload([16384], 16384, 200)).decode_recommended is None
