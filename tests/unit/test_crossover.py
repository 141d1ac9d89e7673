"""Known-answer tests of the crossover maths on constructed data."""

import dataclasses

import numpy as np
import pytest

from xover.analysis.crossover import (
    ConfigData,
    compare_pair,
    fastest,
    fit_cost_model,
    interpolate_crossings,
    measured_totals,
    model_crossings,
    verdict,
)

LENGTHS = (1000, 4000, 16000, 32000)


def make(label, ttft, decode_tps, noise=0.0, reps=5, seed=0, depths=LENGTHS):
    rng = np.random.default_rng(seed)
    t = {L: [ttft(L) * (1 + noise * rng.standard_normal()) for _ in range(reps)] for L in LENGTHS}
    d = {D: [decode_tps(D) * (1 + noise * rng.standard_normal()) for _ in range(reps)] for D in depths}
    return ConfigData(label, t, d)


def test_total_time_formula():
    a = make("A", lambda L: 0.1 + L / 2000, lambda d: 100.0)
    totals = measured_totals(a, 200)
    assert totals[4000] == pytest.approx(0.1 + 2.0 + 2.0)


def test_crossing_inside_range():
    # A prefills at 2000 t/s, decodes at 100 t/s; B prefills at 4000 t/s, decodes at 50 t/s.
    # D(L) = L/2000 + 2 - (L/4000 + 4) = L/4000 - 2 -> crossing at exactly 8000 tokens.
    a = make("A", lambda L: 0.1 + L / 2000, lambda d: 100.0)
    b = make("B", lambda L: 0.1 + L / 4000, lambda d: 50.0)
    r = compare_pair(a, b, 200, n_boot=0)
    (ic,) = r.interpolated
    assert ic.kind == "cross" and ic.length == pytest.approx(8000) and not ic.extrapolated
    (fc,) = r.fitted
    assert fc.length == pytest.approx(8000, rel=1e-6) and not fc.extrapolated
    assert r.faster_at(0) == "A" and r.faster_at(3) == "B"
    assert "A is faster below ~8,000 tokens and B above (200-token responses)" in verdict(r)  # totals need R
    assert "inside the agentic band" not in verdict(r)  # 8K < 10K: the band lies above it
    assert "lies above it, so B wins agentic turns" in verdict(r)


def test_crossing_interval_from_noisy_samples_covers_truth():
    a = make("A", lambda L: 0.1 + L / 2000, lambda d: 100.0, noise=0.02, seed=1)
    b = make("B", lambda L: 0.1 + L / 4000, lambda d: 50.0, noise=0.02, seed=2)
    r = compare_pair(a, b, 200, n_boot=300, seed=3)
    assert r.ci is not None
    lo, hi = r.ci
    assert lo < 8000 < hi
    assert hi - lo < 4000
    assert r.ci_no_crossing_fraction == 0.0


def test_crossing_outside_range_is_marked_extrapolated():
    # B decodes at 95 t/s: D(L) = L/4000 - 200*(1/95 - 1/100) -> crossing at ~421 tokens, below 1K.
    a = make("A", lambda L: 0.1 + L / 2000, lambda d: 100.0)
    b = make("B", lambda L: 0.1 + L / 4000, lambda d: 95.0)
    r = compare_pair(a, b, 200, n_boot=0)
    assert r.interpolated == ()
    (fc,) = r.fitted
    assert fc.length == pytest.approx(4000 * 200 * (1 / 95 - 1 / 100), rel=1e-6)
    assert fc.extrapolated
    v = verdict(r)
    assert v.startswith("A vs B: B is faster at every measured length")
    assert "(extrapolated)" in v


def test_fitted_crossing_past_the_data_before_the_band_is_not_a_band_verdict():
    # Measured at 512-4K only; A decodes faster, B prefills faster: the fit crosses at 8,000 tokens (extrapolated),
    # so the measured winner A must not be named the agentic band's winner.
    short = (512, 1024, 2048, 4096)
    a = ConfigData("A", {L: [0.1 + L / 2000] * 3 for L in short}, {D: [100.0] * 3 for D in short})
    b = ConfigData("B", {L: [0.1 + L / 4000] * 3 for L in short}, {D: [50.0] * 3 for D in short})
    r = compare_pair(a, b, 200, n_boot=0)
    v = verdict(r)
    assert v.startswith("A vs B: A is faster at every measured length (512-4K tokens")
    assert "crossover at ~8,000 tokens (extrapolated), past which B would be faster" in v
    assert "the whole agentic band (10,000-40,000 tokens) lies beyond" in v
    assert "best served by" not in v
    # A crossing past the band's end leaves the measured winner the band's winner.
    v_far = verdict(r, band=(1_000, 6_000))
    assert "part of the agentic band (1,000-6,000 tokens)" not in v_far and "best served by A" in v_far


def test_no_crossing():
    a = make("A", lambda L: 0.1 + L / 2000, lambda d: 100.0)
    b = make("B", lambda L: 0.2 + L / 1000, lambda d: 50.0)  # worse at both
    r = compare_pair(a, b, 200, n_boot=0)
    assert r.interpolated == () and r.fitted == ()
    assert verdict(r).startswith("A vs B: A is faster at every measured length (1,000-32,000 tokens")


def test_curves_that_touch():
    # Same decode; B's TTFT = A's + k (L - 16000)^2: equal at 16000, B slower everywhere else.
    k = 1e-9
    a = make("A", lambda L: 0.1 + L / 2000, lambda d: 100.0)
    b = make("B", lambda L: 0.1 + L / 2000 + k * (L - 16000) ** 2, lambda d: 100.0)
    r = compare_pair(a, b, 200, n_boot=0)
    (ic,) = r.interpolated
    assert ic.kind == "touch" and ic.length == 16000
    assert [c.kind for c in r.fitted] == ["touch"]
    assert r.fitted[0].length == pytest.approx(16000, rel=1e-4)


def test_interpolation_exact_zero_between_opposite_signs_is_a_cross():
    (c,) = interpolate_crossings([1, 2, 3], [-1.0, 0.0, 1.0])
    assert c.kind == "cross" and c.length == 2


def test_fit_recovers_quadratic_and_decode_slope():
    # TTFT = 0.05 + 2e-4 L + 3e-9 L^2; decode s/token = 0.01 + 1e-7 d
    a = make("A", lambda L: 0.05 + 2e-4 * L + 3e-9 * L * L, lambda d: 1 / (0.01 + 1e-7 * d))
    m = fit_cost_model(a)
    assert (m.a, m.b, m.c) == pytest.approx((0.05, 2e-4, 3e-9), rel=1e-6)
    assert (m.p, m.q) == pytest.approx((0.01, 1e-7), rel=1e-6)
    # attention share at 32K: 3e-9*32000^2 / TTFT(32000)
    t = 0.05 + 2e-4 * 32000 + 3e-9 * 32000**2
    assert m.quadratic_share(32000) == pytest.approx(3e-9 * 32000**2 / t)
    # the decode of R tokens happens at depths L..L+R-1
    assert m.decode_s(1000, 3) == pytest.approx(sum(0.01 + 1e-7 * d for d in (1000, 1001, 1002)))


def test_model_crossings_of_identical_models_is_empty():
    m = fit_cost_model(make("A", lambda L: 0.1 + L / 2000, lambda d: 100.0))
    assert model_crossings(m, m, 200, 1000, 32000) == []


def test_token_formatting_follows_llama_cpp_usage():
    from xover.domain.units import format_tokens

    assert format_tokens(32768) == "32K" and format_tokens(1024) == "1K"
    assert format_tokens(8000) == "8,000" and format_tokens(911.4) == "911"


def test_verdict_calls_overlapping_samples_noise_not_a_crossover():
    # Equal underlying speed, 3 noisy samples a side: the medians cross by chance, the ranges overlap.
    a = make("A", lambda L: 0.1 + L / 2000, lambda d: 100.0, noise=0.05, reps=3, seed=11)
    b = make("B", lambda L: 0.1 + L / 2000, lambda d: 100.0, noise=0.05, reps=3, seed=111)
    r = compare_pair(a, b, 200, n_boot=0)
    assert any(c.kind == "cross" for c in r.interpolated)  # the medians do cross
    assert set(r.separated) == {0}
    v = verdict(r)
    assert v.startswith("A vs B: within noise of each other at every measured length") and "faster below" not in v


def test_verdict_ignores_a_noisy_length_and_names_a_single_crossover():
    # A wins short prompts clearly, B long ones; at 16K the samples overlap.
    base = {
        1000: ([1.0, 1.1, 1.05], [2.0, 2.1, 2.05]),
        4000: ([2.0, 2.1, 2.05], [3.0, 3.1, 3.05]),
        16000: ([5.0, 6.0, 5.5], [5.2, 5.9, 5.4]),
        32000: ([12.0, 12.5, 12.2], [8.0, 8.2, 8.1]),
    }
    a = ConfigData("A", {L: v[0] for L, v in base.items()}, {L: [100.0] for L in base})
    b = ConfigData("B", {L: v[1] for L, v in base.items()}, {L: [100.0] for L in base})
    r = compare_pair(a, b, 200, n_boot=0)
    assert r.separated == (-1, -1, 0, 1)
    v = verdict(r)
    assert v.startswith("A vs B: A is faster below ~") and "and B above" in v and "within noise at 16K" not in v
    assert "within noise at 16,000" in v


def test_verdict_refuses_a_winner_when_the_order_flips_twice():
    t = {1000: ([1.0], [2.0]), 4000: ([3.0], [2.0]), 16000: ([5.0], [6.0])}
    a = ConfigData("A", {L: v[0] for L, v in t.items()}, {L: [100.0] for L in t})
    b = ConfigData("B", {L: v[1] for L, v in t.items()}, {L: [100.0] for L in t})
    v = verdict(compare_pair(a, b, 200, n_boot=0))
    assert "no consistent winner" in v and "A at 1,000, B at 4,000, A at 16,000" in v


def test_fastest_line_ranks_three_or_more():
    a = make("A", lambda L: 0.1 + L / 2000, lambda d: 100.0)
    b = make("B", lambda L: 0.1 + L / 4000, lambda d: 50.0)
    c = make("C", lambda L: 1.0 + L / 1000, lambda d: 10.0)
    assert fastest([a, b], 200) is None
    line = fastest([a, b, c], 200)
    assert line is not None
    assert "1,000 A (2.60 s; next B, 1.67x)" in line and "32,000 B (12.10 s; next A, 1.50x)" in line


def test_claimed_crossing_follows_the_verdict_and_ignores_noise():
    from xover.analysis.crossover import claimed_crossing, claims_crossover, relation, swapped

    # equal speeds, noisy samples: the medians cross but the verdict calls it noise; nothing is claimed
    a = make("A", lambda L: 0.1 + L / 2000, lambda d: 100.0, noise=0.05, reps=3, seed=11)
    b = make("B", lambda L: 0.1 + L / 2000, lambda d: 100.0, noise=0.05, reps=3, seed=111)
    noisy = compare_pair(a, b, 200, n_boot=0)
    assert any(c.kind == "cross" for c in noisy.interpolated) and not claims_crossover(noisy)
    assert relation(noisy) == "within noise"
    # a real crossover at 8000 tokens: claimed, measured
    a = make("A", lambda L: 0.1 + L / 2000, lambda d: 100.0)
    b = make("B", lambda L: 0.1 + L / 4000, lambda d: 50.0)
    real = compare_pair(a, b, 200, n_boot=0)
    claim = claimed_crossing(real)
    assert claim is not None and not claim.fitted and claim.length == pytest.approx(8000)
    assert "~8,000" in verdict(real)
    assert relation(real) == "faster below ~8,000, slower above"
    assert relation(swapped(real)) == "slower below ~8,000, faster above"
    # one side faster everywhere: no crossing
    c = make("C", lambda L: 1.0 + L / 1000, lambda d: 10.0)
    one = compare_pair(a, c, 200, n_boot=0)
    assert not claims_crossover(one) and relation(one) == "faster" and relation(swapped(one)) == "slower"


def test_a_winner_measured_below_the_band_is_not_extrapolated_silently():
    short = (512, 1024, 2048, 4096)
    a = ConfigData("A", {L: [0.1 + L / 2000] * 3 for L in short}, {D: [100.0] * 3 for D in short})
    b = ConfigData("B", {L: [0.2 + L / 1000] * 3 for L in short}, {D: [50.0] * 3 for D in short})  # worse at both
    v = verdict(compare_pair(a, b, 200, n_boot=0))
    assert v.startswith("A vs B: A is faster at every measured length (512-4K tokens")
    assert v.endswith(
        "the agentic band (10,000-40,000 tokens) lies beyond the longest measured prompt (4K), so A wins "
        "there only if the order holds: measure up to 40,000 tokens to know."
    )
    assert "best served by" not in v


def test_a_side_placed_for_a_short_context_never_wins_the_band():
    """fit@8k under a budget holds 8K prompts and no more: faster where both run, it still cannot serve the
    agentic band, and the verdict says who can, and where neither can."""
    short = (1024, 4096, 8192)
    a = ConfigData("fit@8k", {L: [0.1 + L / 1000] * 3 for L in short}, {D: [100.0] * 3 for D in short}, max_prompt=8192)
    b = ConfigData("fit@32k", {L: [0.2 + L / 800] * 3 for L in short}, {D: [60.0] * 3 for D in short}, max_prompt=32768)
    v = verdict(compare_pair(a, b, 200, n_boot=0))
    assert "fit@8k is faster at every length both hold" in v
    assert "fit@8k's placement holds none of it and fit@32k's it up to 32K" in v
    assert "so agentic turns need fit@32k" in v and "turns past 32K tokens need a placement for a longer context" in v
    # with no limit on the other side, it serves the whole band
    c = ConfigData("all", b.ttft_s, b.decode_tps)
    v = verdict(compare_pair(a, c, 200, n_boot=0))
    assert "all's all of it, so agentic turns need all." in v
    # a limit inside the band: the other serves the rest
    d = ConfigData("fit@16k", a.ttft_s, a.decode_tps, max_prompt=16384)
    v = verdict(compare_pair(d, c, 200, n_boot=0))
    assert "fit@16k's placement holds it up to 16K and all's all of it, so turns past 16K tokens need all." in v
    # no limits: the old verdict, unchanged
    assert "placement" not in verdict(compare_pair(ConfigData("x", a.ttft_s, a.decode_tps), c, 200, n_boot=0))
    # fit@32k measured past what fit@8k's placement holds: the band sentence says it, not "no measurement"
    longer = (*short, 16384, 32768)
    e = ConfigData(
        "fit@32k", {L: [0.2 + L / 800] * 3 for L in longer}, {D: [60.0] * 3 for D in longer}, max_prompt=32768
    )
    v = verdict(compare_pair(a, e, 200, n_boot=0))
    assert "only fit@32k was measured" not in v and "fit@8k's placement holds none of it" in v


def test_a_fitted_crossing_inside_the_measured_span_is_not_claimed_when_one_side_wins_everywhere():
    """A faster at every measured length (256-4K): a fitted crossing at 754 tokens contradicts the measurements
    around it and is not named; one past the data (6,000, within twice the longest) still is, as extrapolated."""
    from xover.analysis.crossover import Crossing, PairResult, claimed_crossing

    def pair(at: float) -> PairResult:
        return PairResult(
            "A", "B", 64, (256, 1024, 4096), (1.0, 2.0, 5.0), (2.0, 3.0, 6.0), (),
            (Crossing(at, "cross", at > 4096),), None, None, (-1, -1, -1),
        )  # fmt: skip

    assert claimed_crossing(pair(754)) is None
    assert "crossover" not in verdict(pair(754))
    claim = claimed_crossing(pair(6000))
    assert claim is not None and claim.length == 6000 and claim.fitted and claim.extrapolated


def test_lengths_one_side_was_too_slow_for_are_told_after_the_shared_ones():
    # Defaults prefill at 70 t/s and were skipped past 4K (max-ttft): their estimate at 16K is 4x the 4K TTFT.
    # The tuned side, at 2,500 t/s, was measured through 32K. Decode at 7 t/s on both.
    slow = ConfigData(
        "defaults",
        {L: [L / 70 * f for f in (0.99, 1.0, 1.01)] for L in (1024, 4096)},
        {L: [7.0] * 3 for L in (1024, 4096)},
        too_slow=((16384, 16384 / 70), (32768, 32768 / 70)),
    )
    fast = ConfigData(
        "tuned",
        {L: [L / 2500 * f for f in (0.99, 1.0, 1.01)] for L in (1024, 4096, 16384, 32768)},
        {L: [7.0] * 3 for L in (1024, 4096, 16384, 32768)},
    )
    r = compare_pair(slow, fast, 200, n_boot=0)
    assert r.lengths == (1024, 4096)
    assert [L for L, _ in r.only_b] == [16384, 32768] and r.only_a == ()
    told = verdict(r)
    assert "tuned is faster at every measured length (1K-4K tokens, 200-token responses)" in told
    assert "past 4K only tuned was measured (16K 35.1 s, 32K 41.7 s a turn)" in told
    assert "defaults was too slow to measure there, and its estimated cold TTFT alone (16K about 234 s, 32K " in told
    assert told.endswith("is more than 2x tuned's whole turn, so tuned is faster there.")
    assert "measure up to 40K tokens to know" not in told  # the band is answered by the measured side
    # an estimate that does not clear the measured turn by 2x names no winner there
    close = dataclasses.replace(slow, too_slow=((16384, 50.0), (32768, 60.0)))
    told = verdict(compare_pair(close, fast, 200, n_boot=0))
    assert "defaults was too slow to measure there (estimated cold TTFT 16K about 50 s, 32K about 60 s)." in told
    # no estimate at all (a failed point, say): the missing side is named
    bare = dataclasses.replace(slow, too_slow=())
    assert "; defaults has no measurement there." in verdict(compare_pair(bare, fast, 200, n_boot=0))
    # read from the other side, the same lengths
    assert "past 4K only tuned was measured" in verdict(compare_pair(fast, slow, 200, n_boot=0))


def test_a_pair_read_from_b_s_side_exchanges_every_field_of_each_side() -> None:
    from xover.analysis.crossover import PairResult, swapped

    pair = PairResult(
        a="A",
        b="B",
        response=200,
        lengths=(1024, 4096),
        total_a=(1.0, 2.0),
        total_b=(1.5, 1.8),
        interpolated=(),
        fitted=(),
        ci=None,
        ci_no_crossing_fraction=None,
        separated=(-1, 1),
        max_prompt_a=8192,
        max_prompt_b=None,
        only_a=(),
        only_b=((16384, 3.0),),
        too_slow_a=((16384, 90.0),),
        too_slow_b=(),
    )
    other = swapped(pair)
    for f in dataclasses.fields(PairResult):
        if f.name.endswith("_a"):
            assert getattr(other, f.name) == getattr(pair, f.name[:-2] + "_b"), f.name
            assert getattr(other, f.name[:-2] + "_b") == getattr(pair, f.name), f.name
    assert (other.a, other.b, other.separated) == ("B", "A", (1, -1))
    assert swapped(other) == pair


def test_a_configuration_measured_at_one_length_scales_through_the_origin():
    """One length (the others over max-ttft): TTFT grows with the prompt as the max-ttft estimate scales it, so the
    line drawn for it and a crossing with it are not those of a prompt that costs nothing more."""
    one = ConfigData("slow prefill", {1024: [27.0, 28.0, 29.0]}, {0: [22.0, 22.0]})
    m = fit_cost_model(one)
    assert (m.a, m.b, m.c) == pytest.approx((0.0, 28.0 / 1024, 0.0))
    assert m.total(4096, 200) == pytest.approx(4 * 28.0 + 200 / 22.0)
    fast = fit_cost_model(ConfigData("fast prefill", {L: [L / 2000] for L in (1024, 4096)}, {0: [7.0]}))
    # 28/1024 L + 200/22 = L/2000 + 200/7 at L = (200/7 - 200/22) / (28/1024 - 1/2000)
    (c,) = model_crossings(m, fast, 200, 1024, 4096)
    assert c.length == pytest.approx((200 / 7 - 200 / 22) / (28 / 1024 - 1 / 2000)) and c.extrapolated


def test_one_shared_length_within_noise_tells_the_fitted_crossing_below_it_as_a_prediction():
    """The H200 gpt-oss decode study's shape: the variant tuned for decode (prefill at 36 t/s, decode at 22.7) was
    measured at 1K only, the other (prefill at 2,500 t/s, decode at 7) through 16K; at 1K the two are within noise.
    Their fitted totals cross below 1K: told as a prediction to measure, never claimed, and the band is left to the
    lengths only one side measured (not "either serves agentic turns")."""
    from xover.analysis.crossover import claimed_crossing
    from xover.domain.units import format_tokens

    decode = ConfigData(
        "for decode",
        {1024: [1024 / 36 * f for f in (0.7, 1.0, 1.3)]},
        {0: [22.7] * 3},
        too_slow=((4096, 4096 / 36), (16384, 16384 / 36)),
    )
    turn = ConfigData(
        "for the turn", {L: [L / 2500 * f for f in (0.9, 1.0, 1.1)] for L in (1024, 4096, 16384)}, {0: [7.0] * 3}
    )
    r = compare_pair(turn, decode, 200, n_boot=0)
    assert r.lengths == (1024,) and r.separated == (0,)
    # 1024/36/1024 L + 200/22.7 = L/2500 + 200/7 where the through-the-origin line meets the pinned one
    x = (200 / 7 - 200 / 22.7) / (1 / 36 - 1 / 2500)
    (c,) = [c for c in r.fitted if c.kind == "cross"]
    assert c.length == pytest.approx(x, rel=1e-3) and claimed_crossing(r) is None
    told = verdict(r)
    assert "within noise of each other at every measured length (1K tokens, 200-token responses" in told
    assert f"their fitted totals cross at about {format_tokens(x)} tokens, below the shortest length measured: " in told
    assert "below it for decode is expected faster (extrapolated; measure shorter prompts to settle it)" in told
    assert "either serves agentic turns" not in told and "past 1K only for the turn was measured" in told


def test_which_to_run_names_each_kind_of_works_winner_and_the_ties_the_rounds_cannot_part() -> None:
    """Known answer: three rounds each (TTFT s, decode 100 t/s; 100-token responses add 1 s a turn). Cold: A wins
    1K and 2K clearly, A and B are within noise at 4K (B's rounds straddle A's), only B holds 8K. Cached turns on a
    16K context: B wins at every turn size."""
    from xover.analysis.cached import work_line

    def cfg(label: str, ttft: dict[int, tuple[float, float, float]]) -> ConfigData:
        rounds = {n: {r + 1: (t, 100.0) for r, t in enumerate(ts)} for n, ts in ttft.items()}
        return ConfigData(label, {n: list(ts) for n, ts in ttft.items()}, {n: [100.0] for n in ttft}, rounds=rounds)

    cold_a = cfg("A", {1024: (0.50, 0.51, 0.52), 2048: (1.00, 1.02, 1.01), 4096: (2.0, 2.6, 1.5)})
    cold_b = cfg(
        "B", {1024: (0.90, 0.92, 0.91), 2048: (1.80, 1.83, 1.81), 4096: (2.3, 1.6, 2.4), 8192: (4.0, 4.1, 4.2)}
    )
    cached_a = cfg("A", {512: (0.9, 0.92, 0.91), 2048: (3.0, 3.1, 3.05)})
    cached_b = cfg("B", {512: (0.3, 0.31, 0.32), 2048: (0.8, 0.82, 0.81)})
    line = work_line([cold_a, cold_b], [cached_a, cached_b], 100, 16384)
    assert line == (
        "Which to run for which kind of work (100-token responses): cold prompts: 1K-2K A, 4K A or B "
        "(indistinguishable here), 8K B (the only one placed for it); cached turns on a 16K-token context: 512-2K "
        "new tokens B."
    )
    assert work_line([cold_a, cold_b], [cached_b], 100, 16384) is None  # one configuration: nothing to choose


def test_the_fastest_is_told_with_every_configuration_the_rounds_cannot_part_from_it() -> None:
    """Known answer, three rounds each, decode 100 t/s (100-token responses add 1 s a turn). At 1K A leads (1.50 s a
    turn); B (1.80 s) is slower in every round by the same margin, so the paired interval calls it; C (2.00 s) swings
    round to round (1.40-2.60 s), so its interval against A holds 1. Comparing A with the next by median alone
    would name A the winner; C is within the noise of A, and B, between them by median, is named as slower. At 2K
    A leads clearly (B and C are both steady and slower)."""
    from xover.analysis.cached import work_line
    from xover.analysis.crossover import Winner, winners

    def cfg(label: str, ttft: dict[int, tuple[float, float, float]]) -> ConfigData:
        rounds = {n: {r + 1: (t, 100.0) for r, t in enumerate(ts)} for n, ts in ttft.items()}
        return ConfigData(label, {n: list(ts) for n, ts in ttft.items()}, {n: [100.0] for n in ttft}, rounds=rounds)

    a = cfg("A", {1024: (0.50, 0.40, 0.60), 2048: (1.00, 1.01, 1.02)})
    b = cfg("B", {1024: (0.80, 0.70, 0.90), 2048: (2.00, 2.02, 2.01)})
    c = cfg("C", {1024: (1.00, 1.60, 0.40), 2048: (3.00, 3.05, 3.02)})
    line = fastest([a, b, c], 100)
    assert line == (
        "Fastest total time per turn (100-token responses): 1K A and C indistinguishable here (1.50 s against 2.00 s,"
        " 3 rounds; B, at 1.80 s, is slower than A); 2K A (2.01 s; next B, 1.50x)."
    )
    assert winners([a, b, c], 100) == {1024: Winner("A", ("C",)), 2048: Winner("A")}
    assert work_line([a, b, c], [a, b, c], 100, 16384) == (
        "Which to run for which kind of work (100-token responses): cold prompts: 1K A or C (indistinguishable here),"
        " 2K A; cached turns on a 16K-token context: 1K new tokens A or C (indistinguishable here), 2K new tokens A."
    )
    # three that the rounds cannot part: all named, in the order of their medians, the totals listed alike
    d = cfg("D", {1024: (0.70, 0.30, 0.90), 2048: (1.5, 0.5, 1.2)})
    three = fastest([a, c, d], 100)
    assert three is not None and "1K A, D and C indistinguishable here (1.50, 1.70 and 2.00 s, 3 rounds)" in three
    assert winners([a, c, d], 100)[1024] == Winner("A", ("C", "D"))
    # a mixed store: a configuration measured before rounds (one process) is compared with the fastest by its
    # ranges (crossover.separation's rule before rounds), the same comparison for the lead line and "which to run":
    # X (1.65-1.75 s a turn) lies above A's range (1.40-1.60 s), so both call it slower; Y (1.45-1.62 s) overlaps it,
    # so both tell it beside A (on the old code the lead line left X and Y out, which to run named Y a winner)
    x = ConfigData("X", {1024: [0.70, 0.65, 0.75], 2048: [3.5, 3.6, 3.7]}, {1024: [100.0], 2048: [100.0]})
    assert fastest([a, b, c, x], 100) == (
        "Fastest total time per turn (100-token responses): 1K A and C indistinguishable here (1.50 s against 2.00 s,"
        " 3 rounds; X, at 1.70 s, is slower than A; B, at 1.80 s, is slower than A); 2K A (2.01 s; next B, 1.50x)."
    )
    assert winners([a, b, c, x], 100) == {1024: Winner("A", ("C",)), 2048: Winner("A")}
    y = ConfigData("Y", {1024: [0.45, 0.55, 0.62], 2048: [3.5, 3.6, 3.7]}, {1024: [100.0], 2048: [100.0]})
    mixed = fastest([a, b, c, y], 100)
    assert mixed is not None and mixed.startswith(
        "Fastest total time per turn (100-token responses): 1K A, Y and C indistinguishable here (1.50, 1.55 and "
        "2.00 s, 3 rounds; Y measured in one process: overlapping ranges; B, at 1.80 s, is slower than A); 2K A"
    )
    assert winners([a, b, c, y], 100)[1024] == Winner("A", ("C", "Y"))
    assert work_line([a, b, c, y], [a, b], 100, 16384).startswith(  # type: ignore[union-attr]
        "Which to run for which kind of work (100-token responses): cold prompts: 1K A, C or Y (indistinguishable here)"
    )
    # the study adds rounds for every configuration the lead line names beside the fastest, and for no other
    from xover.analysis.crossover import open_questions

    assert open_questions([a, b, c], [], 100) == {"A": {1024}, "C": {1024}}
    assert open_questions([a, c, d], [], 100) == {"A": {1024, 2048}, "C": {1024}, "D": {1024, 2048}}
    # on the mixed store, rounds for the pairs measured in rounds only: one process opens no question
    assert open_questions([a, b, c, y], [], 100) == {"A": {1024}, "C": {1024}}


def test_a_configuration_with_too_few_rounds_is_not_yet_compared_never_indistinguishable() -> None:
    """Seen on gpt-oss-20b (studies/h200-backends, on-h100): a lease ran out inside round 3, so ``vk-cpu6 tuned`` had
    2 rounds beside 3 for the rest. Its turns took 8.9 s against 0.9 s for the fastest, in both rounds, yet the lead
    line named it "indistinguishable" from the fastest and "which to run" offered it, because no verdict needs fewer
    than 3 rounds. Known answer (decode 100 t/s, 100-token responses add 1 s a turn): A and B tie over 3 rounds, C is
    10x slower over 2: C is "not yet compared", apart from the tie, and stays an open question."""
    from xover.analysis.cached import cached_verdict, work_line
    from xover.analysis.crossover import Winner, open_questions, relation, too_few_rounds, winners

    def cfg(label: str, ttft: dict[int, tuple[float, ...]]) -> ConfigData:
        rounds = {n: {r + 1: (t, 100.0) for r, t in enumerate(ts)} for n, ts in ttft.items()}
        return ConfigData(label, {n: list(ts) for n, ts in ttft.items()}, {n: [100.0] for n in ttft}, rounds=rounds)

    a = cfg("A", {1024: (0.50, 0.40, 0.60)})
    b = cfg("B", {1024: (0.55, 0.45, 0.52)})
    c = cfg("C", {1024: (9.0, 7.0)})
    line = fastest([a, b, c], 100)
    assert line == (
        "Fastest total time per turn (100-token responses): 1K A and B indistinguishable here (1.50 s against 1.52 s,"
        " 3 rounds; not yet compared with A (2 rounds shared, 3 needed): C at 9.00 s)."
    ), line
    assert winners([a, b, c], 100) == {1024: Winner("A", ("B",), unsettled=("C",))}
    assert "1K A or B (indistinguishable here; C: too few rounds to compare)" in (
        work_line([a, b, c], [a, b], 100, 16384) or ""
    )
    assert "C" in open_questions([a, b, c], (), 100)
    told = verdict(compare_pair(a, c, 100, n_boot=0))
    assert told.startswith("A vs C: not yet compared (") and "2 rounds of fresh servers, fewer than the 3" in told
    assert "indistinguishable" not in told and "either serves" not in told, told
    assert "not yet compared" in cached_verdict(compare_pair(a, c, 100, n_boot=0), 16384)
    assert relation(compare_pair(a, c, 100, n_boot=0)) == "not yet compared"
    assert relation(compare_pair(a, b, 100, n_boot=0)) == "indistinguishable"
    assert too_few_rounds(a, c, 1024, 100) and not too_few_rounds(a, b, 1024, 100)
    # the same C in 3 rounds is told as slower, not as unsettled
    c3 = cfg("C", {1024: (9.0, 7.0, 8.0)})
    assert winners([a, b, c3], 100) == {1024: Winner("A", ("B",))}
    # with no tie, the next by median is the next the rounds compared, not one they could not
    d = cfg("D", {1024: (3.0, 2.9, 3.1)})
    assert fastest([a, c, d], 100) == (
        "Fastest total time per turn (100-token responses): 1K A (1.50 s; next D, 2.67x; not yet compared with A "
        "(2 rounds shared, 3 needed): C at 9.00 s)."
    ), fastest([a, c, d], 100)


def test_a_tuned_pair_with_too_few_shared_rounds_earns_rounds_until_compared() -> None:
    """Seen on gpt-oss-20b (studies/h200-backends, on-h100, lease 7): the report told ``vk-cpu6`` against ``vk-cpu6
    tuned`` at 32K as "not yet compared" (2 shared rounds: rounds 1 and 3 of one side were another session's, or
    the other side's), yet no later round measured both, since the pair was none of the verdicts' headline pairs.
    Known answer: B in rounds 1-4, T in rounds 2 and 4-8, so they share rounds 2 and 4. As a pair the report only
    tells, it opens both at 32K until they share 3 rounds, and no further: once compared, "indistinguishable" is an
    answer, not a question."""
    from xover.analysis.crossover import open_questions

    def cfg(label: str, by_round: dict[int, float]) -> ConfigData:
        rounds = {32768: {r: (t, 30.0) for r, t in by_round.items()}}
        return ConfigData(label, {32768: list(by_round.values())}, {32768: [30.0]}, rounds=rounds)

    b = cfg("B", {1: 48.5, 2: 31.3, 3: 30.7, 4: 31.7})
    t = cfg("T", {2: 11.6, 4: 11.2, 5: 10.6, 6: 10.5, 7: 10.7, 8: 11.3})
    assert open_questions([b, t], [], 200) == {}  # today's rule: not a headline pair, never measured again
    assert open_questions([b, t], [], 200, compared=[("B", "T")]) == {"B": {32768}, "T": {32768}}
    # a third shared round (B's round 9 beside T's): compared, and T's 3x lead is no open question
    b9, t9 = cfg("B", {**dict.fromkeys((1, 3), 40.0), 2: 31.3, 4: 31.7, 9: 31.0}), cfg("T", {2: 11.6, 4: 11.2, 9: 11.0})
    assert open_questions([b9, t9], [], 200, compared=[("B", "T")]) == {}
    # nor is a tie over 3 shared rounds: "indistinguishable here" is the answer, not a reason for more rounds
    u = cfg("U", {2: 31.0, 4: 32.0, 9: 30.8})
    assert open_questions([b9, u], [], 200, compared=[("B", "U")]) == {}
    # while the same tie as a headline pair stays open
    assert open_questions([b9, u], [("B", "U")], 200) == {"B": {32768}, "U": {32768}}


def test_lengths_with_too_few_rounds_are_told_apart_from_the_ties() -> None:
    """From the review of the first version: a pair with 3 rounds at 1K and 2 at 16K (twice as slow there) was
    "indistinguishable here at every measured length ... either serves"; a configuration sharing no round with the
    fastest was said to share 1; and a fastest compared with nobody yet was named fastest outright."""
    from xover.analysis.cached import cached_verdict
    from xover.analysis.crossover import relation

    def cfg(label: str, ttft: dict[int, dict[int, float]]) -> ConfigData:
        rounds = {n: {r: (t, 100.0) for r, t in by_round.items()} for n, by_round in ttft.items()}
        return ConfigData(
            label, {n: list(v.values()) for n, v in ttft.items()}, {n: [100.0] for n in ttft}, rounds=rounds
        )

    a = cfg("A", {1024: {1: 0.50, 2: 0.40, 3: 0.60}, 16384: {1: 4.0, 2: 4.2, 3: 4.1}})
    b = cfg("B", {1024: {1: 0.55, 2: 0.45, 3: 0.52}, 16384: {1: 9.0, 2: 8.0}})
    pair = compare_pair(a, b, 100, n_boot=0)
    assert pair.short_at == {1} and not pair.too_few_rounds
    told = verdict(pair)
    assert told.startswith("A vs B: indistinguishable here at 1K and not yet compared at 16K ("), told
    assert "either serves" not in told
    assert relation(pair) == "indistinguishable (not yet compared at 16K)"
    assert "indistinguishable here at 1K and not yet compared at 16K new tokens" in cached_verdict(pair, 16384)
    # a clear winner elsewhere: the short length is named apart from the ties
    c = cfg("C", {1024: {1: 2.0, 2: 2.1, 3: 2.05}, 4096: {1: 0.5, 2: 0.45, 3: 0.55}, 16384: {1: 9.0, 2: 8.0}})
    a4 = cfg(
        "A",
        {
            **{n: dict(v) for n, v in {1024: {1: 0.50, 2: 0.40, 3: 0.60}}.items()},
            4096: {1: 0.52, 2: 0.43, 3: 0.5},
            16384: {1: 4.0, 2: 4.2, 3: 4.1},
        },
    )
    told = verdict(compare_pair(a4, c, 100, n_boot=0))
    assert "A is faster at every length where they differ" in told, told
    assert "indistinguishable here at 4K; not yet compared at 16K" in told, told
    assert relation(compare_pair(a4, c, 100, n_boot=0)) == "faster (indistinguishable at 4K, not yet compared at 16K)"
    # no shared round: 0, not 1; and a fastest compared with none is said to lead by median
    d = cfg("D", {1024: {4: 0.30, 5: 0.32, 6: 0.31}})
    e = cfg("E", {1024: {1: 0.50, 2: 0.40, 3: 0.60}})
    f = cfg("F", {1024: {1: 0.70, 2: 0.60, 3: 0.80}})
    line = fastest([d, e, f], 100)
    assert line == (
        "Fastest total time per turn (100-token responses): 1K D leads by median (1.31 s; not yet compared with D "
        "(0 rounds shared, 3 needed): E at 1.50 s, F at 1.70 s)."
    ), line
