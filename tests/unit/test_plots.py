"""The plots' axes: numbers a reader can read."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from xover.analysis.crossover import ConfigData  # noqa: E402
from xover.report.plots import _plain_log_y, round_ranges, total_time_plot  # noqa: E402


def _labels(lo: float, hi: float) -> tuple[list[str], list[str]]:
    fig, ax = plt.subplots()
    ax.set_yscale("log")
    ax.set_ylim(lo, hi)
    _plain_log_y(ax)
    major, minor = ax.yaxis.get_major_formatter(), ax.yaxis.get_minor_formatter()
    out = [major(v, 0) for v in (10.0, 100.0)], [minor(v, 0) for v in (20.0, 30.0, 40.0)]
    plt.close(fig)
    return out


def test_a_log_axis_within_one_decade_labels_its_minor_ticks() -> None:
    """Totals of 25-45 s have no power of ten on the axis: without minor labels it would carry no number."""
    assert _labels(25.0, 45.0)[1] == ["20", "30", "40"]


def test_a_log_axis_over_decades_labels_only_powers_of_ten() -> None:
    major, minor = _labels(0.5, 200.0)
    assert major == ["10", "100"] and minor == ["", "", ""]


def test_a_log_axis_within_two_decades_labels_twos_and_fives() -> None:
    assert _labels(25.0, 800.0)[1] == ["20", "", ""] and _labels(25.0, 800.0)[0] == ["10", "100"]


def test_the_total_time_plot_shows_the_rounds_range() -> None:
    """Each measured length's whiskers span the rounds' totals (their cold TTFT plus 200 tokens at their decode
    speed): the spread a reader weighs two configurations' markers against. One round, or none: no whisker."""
    rounds = {1024: {1: (0.40, 50.0), 2: (0.45, 40.0), 3: (0.38, 50.0)}, 4096: {1: (0.60, 50.0)}}
    config = ConfigData("tuned", {1024: [0.40, 0.45, 0.38], 4096: [0.60]}, {1024: [50.0], 4096: [50.0]}, rounds=rounds)
    (lo, hi), *rest = round_ranges(config, 200).values()
    assert not rest and round_ranges(config, 200).keys() == {1024}
    assert (lo, hi) == (0.38 + 200 / 50.0, 0.45 + 200 / 40.0)
    assert round_ranges(ConfigData("before rounds", {1024: [0.4, 0.5]}, {1024: [50.0]}), 200) == {}
    png = total_time_plot([config], [], 200, (10_000, 40_000))
    assert png.startswith(b"\x89PNG")
