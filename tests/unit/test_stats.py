import math

import pytest

from xover.analysis.stats import first_is_outlier, quantile, summarize


def test_summary_known_values():
    s = summarize([2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0])
    assert s.n == 8
    assert s.mean == 5.0
    # sample variance: sum of squared deviations 32 / 7
    assert s.sd == pytest.approx(math.sqrt(32 / 7))
    assert s.median == 4.5
    assert (s.minimum, s.maximum) == (2.0, 9.0)
    assert s.q1 == 4.0 and s.q3 == pytest.approx(5.5)


def test_single_sample_has_no_sd():
    s = summarize([3.0])
    assert s.sd is None and s.cv is None and s.median == 3.0


def test_quantile_matches_linear_interpolation():
    xs = [1.0, 2.0, 3.0, 4.0]
    assert quantile(xs, 0.0) == 1.0
    assert quantile(xs, 1.0) == 4.0
    assert quantile(xs, 0.5) == 2.5
    assert quantile(xs, 1 / 3) == pytest.approx(2.0)
    with pytest.raises(ValueError):
        quantile([], 0.5)


def test_first_outlier_detection():
    assert first_is_outlier([50.0, 100.0, 101.0, 99.0, 100.5])
    assert not first_is_outlier([100.2, 100.0, 101.0, 99.0, 100.5])
    assert not first_is_outlier([50.0, 100.0, 101.0])  # too few to judge
