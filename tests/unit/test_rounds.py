"""The process as the unit of evidence (xover.analysis.rounds): known answers of the round statistics."""

from __future__ import annotations

import math
import statistics

import pytest

from xover.analysis.rounds import RatioInterval, drifted, order, paired_ratio, summarize_rounds, t975


def test_student_t_quantiles() -> None:
    assert t975(1) == 12.706 and t975(2) == 4.303 and t975(9) == 2.262
    assert t975(21) == 2.086  # between tabulated values: the larger quantile (a wider interval)
    assert t975(1000) == 1.96
    with pytest.raises(ValueError):
        t975(0)


def test_rounds_alternate_so_linear_drift_falls_on_both() -> None:
    assert [order(["a", "b"], r) for r in range(4)] == [["a", "b"], ["b", "a"], ["a", "b"], ["b", "a"]]
    assert order(["a", "b", "c"], 1) == ["c", "b", "a"]
    shuffled = [order(["a", "b", "c", "d"], r, seed=7) for r in range(3)]
    assert shuffled == [order(["a", "b", "c", "d"], r, seed=7) for r in range(3)]  # seeded: the same again
    assert all(sorted(o) == ["a", "b", "c", "d"] for o in shuffled)


def test_round_summary_is_the_median_of_round_medians_and_their_spread() -> None:
    s = summarize_rounds({1: [1.0, 3.0, 2.0], 2: [2.5], 3: [1.5, 1.5], 4: []})
    assert s is not None and s.rounds == (1, 2, 3) and s.medians == (2.0, 2.5, 1.5)
    assert s.median == 2.0 and (s.low, s.high) == (1.5, 2.5) and s.spread() == pytest.approx(0.5)
    assert summarize_rounds({}) is None


def test_the_paired_interval_by_hand() -> None:
    a = {1: 1.0, 2: 1.1, 3: 0.9}
    b = {1: 1.2, 2: 1.3, 3: 1.1, 4: 5.0}  # round 4 has no partner: left out
    r = paired_ratio(a, b)
    logs = [math.log(1.0 / 1.2), math.log(1.1 / 1.3), math.log(0.9 / 1.1)]
    half = 4.303 * statistics.stdev(logs) / math.sqrt(3)
    assert r is not None and r.n == 3
    assert r.ratio == pytest.approx(math.exp(statistics.fmean(logs)))
    assert (r.low, r.high) == (
        pytest.approx(math.exp(statistics.fmean(logs) - half)),
        pytest.approx(math.exp(statistics.fmean(logs) + half)),
    )
    assert r.sign == -1 and r.describe("A", "B").startswith("A faster than B: 0.83x")


def test_a_difference_within_the_noise_between_rounds_names_no_winner() -> None:
    r = paired_ratio({1: 1.0, 2: 1.3, 3: 0.95}, {1: 1.1, 2: 1.0, 3: 1.05})
    assert r is not None and r.low < 1 < r.high and r.sign == 0
    assert r.describe("A", "B").startswith("A and B indistinguishable here")
    assert paired_ratio({1: 1.0}, {1: 2.0}) is None  # one round: no spread between rounds to judge by
    two = paired_ratio({1: 1.0, 2: 1.01}, {1: 2.0, 2: 2.0})  # a 2x difference, but 2 rounds decide nothing
    assert two is not None and two.high < 1 and not two.decided and two.sign == 0


def test_identical_ratios_in_three_rounds_decide() -> None:
    r = paired_ratio({1: 0.85, 2: 0.85, 3: 0.85}, {1: 1.0, 2: 1.0, 3: 1.0})
    assert r == RatioInterval(pytest.approx(0.85), pytest.approx(0.85), pytest.approx(0.85), 3)
    assert r is not None and r.sign == -1


def test_drift_beyond_the_rounds_spread() -> None:
    s = summarize_rounds({1: [1.0], 2: [1.2], 3: [1.1]})
    assert s is not None
    assert drifted(s, 1.15) is None
    assert drifted(s, 1.5) == pytest.approx(0.25) and drifted(s, 0.8) == pytest.approx(-0.2)
