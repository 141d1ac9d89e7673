"""Known-answer tests of the prefill/decode trade-off on constructed numbers."""

import pytest

from xover.analysis.crossover import ConfigData
from xover.analysis.tradeoff import break_even_length, ratio, served_tradeoff, tradeoff

LENGTHS = (1000, 4000, 16000, 32000)


def test_ratio_is_b_over_a_with_the_range_the_samples_allow():
    r = ratio([100.0, 110.0, 90.0], [200.0, 210.0, 190.0])
    assert r.median == pytest.approx(2.0)
    assert r.lo == pytest.approx(190 / 110) and r.hi == pytest.approx(210 / 90)
    assert r.beyond_noise and r.direction == 1
    assert r.percent() == "+100% [+73..+133%]"
    slower = ratio([100.0, 101.0], [50.0, 51.0])
    assert slower.beyond_noise and slower.direction == -1
    overlap = ratio([100.0, 110.0], [105.0, 115.0])
    assert not overlap.beyond_noise and overlap.direction == 0
    with pytest.raises(ValueError):
        ratio([], [1.0])


def test_break_even_balances_the_prefill_gain_against_the_decode_loss():
    # A prefills 1000 t/s and decodes 100 t/s; B prefills 2000 t/s and decodes 50 t/s. With R = 200:
    # L (1/1000 - 1/2000) = 200 (1/50 - 1/100)  =>  L = 200 * 0.01 / 0.0005 = 4000 tokens.
    assert break_even_length(1000, 100, 2000, 50, 200) == pytest.approx(4000)
    assert 4000 / 1000 + 200 / 100 == pytest.approx(4000 / 2000 + 200 / 50)  # equal totals there
    # the mirror image: B decodes faster, A prefills faster; same length
    assert break_even_length(2000, 50, 1000, 100, 200) == pytest.approx(4000)
    # no trade-off: B faster at both, or slower at both, or equal prefill
    assert break_even_length(1000, 100, 2000, 120, 200) is None
    assert break_even_length(1000, 100, 900, 90, 200) is None
    assert break_even_length(1000, 100, 1000, 50, 200) is None


def test_tradeoff_from_samples_names_who_wins_each_side_of_the_break_even():
    t = tradeoff(
        "defaults",
        [990.0, 1000.0, 1010.0],
        [99.0, 100.0, 101.0],
        "ub=4096",
        [1980.0, 2000.0, 2020.0],
        [49.0, 50.0, 51.0],
        200,
    )
    assert t.break_even == pytest.approx(4000)
    assert t.is_tradeoff and t.beyond_noise
    assert t.long_winner == "ub=4096" and t.short_winner == "defaults"
    assert t.prefill.median == pytest.approx(2.0) and t.decode.median == pytest.approx(0.5)
    # faster at both: no break-even, whatever the noise
    both = tradeoff("a", [1000.0], [100.0], "b", [1500.0], [110.0], 200)
    assert both.break_even is None and not both.is_tradeoff and both.long_winner is None
    # a trade-off whose decode loss is within noise still has a break-even, but not beyond noise
    noisy = tradeoff("a", [1000.0, 1001.0], [95.0, 105.0], "b", [2000.0, 2001.0], [96.0, 99.0], 200)
    assert noisy.is_tradeoff and not noisy.beyond_noise and not noisy.decode.beyond_noise


def _config(label, prefill, decode, overhead=0.1, spread=0.0):
    ttft = {L: [overhead + L / prefill * (1 + spread * k) for k in (-1, 0, 1)] for L in LENGTHS}
    return ConfigData(label, ttft, {L: [decode] * 3 for L in LENGTHS})


def test_served_tradeoff_takes_the_break_even_from_the_measured_totals():
    # total_A = 0.1 + L/2000 + 2, total_B = 0.1 + L/4000 + 4: they cross at exactly 8000 tokens.
    a, b = _config("defaults", 2000.0, 100.0), _config("tuned", 4000.0, 50.0)
    t = served_tradeoff(a, b, 200)
    assert t.break_even == pytest.approx(8000)
    assert [p.length for p in t.points] == list(LENGTHS)
    first = t.points[0]
    assert first.tradeoff.prefill.median == pytest.approx((0.1 + 1000 / 2000) / (0.1 + 1000 / 4000))
    assert first.tradeoff.decode.median == pytest.approx(0.5)
    assert first.separated == -1 and t.points[-1].separated == 1  # defaults faster at 1K, tuned at 32K
    assert first.total_a_s == pytest.approx(0.1 + 0.5 + 2.0)
    # at each length's own rates the constant-rate break-even lies near the measured one
    assert all(1000 < x < 16000 for x in t.constant_rate_break_even())


def test_served_tradeoff_claims_no_break_even_within_noise():
    a = _config("defaults", 2000.0, 100.0, spread=0.3)
    b = _config("tuned", 2100.0, 98.0, spread=0.3)
    t = served_tradeoff(a, b, 200)
    assert set(p.separated for p in t.points) == {0}
    assert t.break_even is None
