"""The process is the unit of evidence: comparisons over rounds of fresh processes. Pure: no I/O.

A **round** starts each configuration's process afresh (a llama-server, or a llama-bench run) and measures it; the
order alternates between rounds (forward, then reversed: ABBA for two configurations), so slow drift of the machine
falls on every configuration alike. Samples inside one process show that process's spread, not the drift between
processes (load, frequency, memory placement, a neighbour on a shared machine): a configuration is summarised by the
median of its **round medians**, and its spread is the spread **between** rounds.

Two configurations are compared on the rounds both were measured in: per round the ratio of their round medians
(A's time over B's), and a **Student-t interval of the mean log-ratio** over those rounds (the paired design: each
round's ratio cancels what the machine did to both in that round). With n rounds the interval is
``exp(mean ± t(0.975, n-1) · sd / √n)``. A is **faster** only when the whole interval lies below 1, slower only when
it lies above; otherwise the pair is **indistinguishable here (n rounds)**, which is an honest answer. A t interval
rather than a paired bootstrap or a rank test: with the 3 rounds a quiet machine needs, a bootstrap of 3 pairs has 10
distinct resamples and calls a winner whenever all three ratios agree (a one-in-four chance for two identical
configurations), and an exact signed-rank test cannot reach 5 % at all; the t interval is exact for normal
log-ratios and widens with their spread, so a noisy machine ends with "indistinguishable" instead of a winner.
"""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
from collections.abc import Mapping, Sequence
from typing import TypeVar

T = TypeVar("T")

CONFIDENCE = 0.95
MIN_ROUNDS = 3  # rounds a comparison needs before it can name a winner
MOST_ROUNDS = 50  # how far :func:`rounds_to_settle` looks

# Student's t, two-sided 95 % (the 0.975 quantile), by degrees of freedom; 1.96 beyond the table.
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
         11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093,
         20: 2.086, 22: 2.074, 24: 2.064, 26: 2.056, 28: 2.048, 30: 2.042, 40: 2.021, 60: 2.000, 120: 1.980}  # fmt: skip


def t975(df: int) -> float:
    """The 0.975 quantile of Student's t with ``df`` degrees of freedom (the largest tabulated df not above it)."""
    if df < 1:
        raise ValueError("a t interval needs at least 2 rounds")
    return _T975[max(k for k in _T975 if k <= df)] if df <= 120 else 1.96


def possessive(name: str) -> str:
    """``the defaults'``, ``t=2's``: the possessive of a configuration's or setting's name."""
    return f"{name}'" if name.endswith("s") else f"{name}'s"


def order(configs: Sequence[str], round_index: int, seed: int | None = None) -> list[str]:
    """The order of one round: forward in even rounds (0, 2, ...), reversed in odd ones (ABBA...), so linear drift
    falls on every configuration alike over two rounds; with ``seed``, a shuffle seeded per round instead."""
    names = list(configs)
    if seed is not None:
        random.Random(seed * 1_000_003 + round_index).shuffle(names)
        return names
    return names if round_index % 2 == 0 else names[::-1]


def rotated(items: Sequence[T], index: int) -> list[T]:
    """``items`` begun at position ``index`` (modulo their number): over as many rounds (or repetitions) as there
    are items, each comes first once. The prompt lengths inside one server go in this order: the first prompt a
    server measures pays what its warm-up did not catch, and no length should always be the one that pays it."""
    items = list(items)
    if not items:
        return items
    k = index % len(items)
    return items[k:] + items[:k]


@dataclasses.dataclass(frozen=True)
class RoundSummary:
    """One configuration at one length over its rounds: each round's median (in round order), the median of those,
    and the spread between rounds (smallest and largest round median)."""

    rounds: tuple[int, ...]  # round numbers, in order
    medians: tuple[float, ...]  # the round medians, one per round
    median: float  # the median of the round medians
    low: float  # the smallest round median
    high: float  # the largest

    @classmethod
    def of(cls, by_round: Mapping[int, float]) -> RoundSummary:
        """Round number -> that round's median."""
        rounds = tuple(sorted(by_round))
        medians = tuple(by_round[r] for r in rounds)
        return cls(rounds, medians, statistics.median(medians), min(medians), max(medians))

    @property
    def n(self) -> int:
        return len(self.medians)

    def spread(self) -> float:
        """The spread between rounds, relative to their median: (largest - smallest) / median."""
        return (self.high - self.low) / self.median if self.median else math.nan


def summarize_rounds(samples_by_round: Mapping[int, Sequence[float]]) -> RoundSummary | None:
    """Round number -> that round's samples, as a :class:`RoundSummary` (None without samples)."""
    medians = {r: statistics.median(xs) for r, xs in samples_by_round.items() if xs}
    return RoundSummary.of(medians) if medians else None


@dataclasses.dataclass(frozen=True)
class RatioInterval:
    """A's time over B's over the rounds both were measured in: the geometric mean of the paired round ratios and
    its 95 % t interval. ``n`` < :data:`MIN_ROUNDS` leaves the pair undecided whatever the numbers."""

    ratio: float
    low: float
    high: float
    n: int

    def inverted(self) -> RatioInterval:
        """B's time over A's."""
        return RatioInterval(1 / self.ratio, 1 / self.high, 1 / self.low, self.n)

    @property
    def decided(self) -> bool:
        return self.n >= MIN_ROUNDS and (self.high < 1.0 or self.low > 1.0)

    @property
    def sign(self) -> int:
        """-1: A faster (the interval below 1), +1: B faster, 0: indistinguishable here."""
        if not self.decided:
            return 0
        return -1 if self.high < 1.0 else 1

    def describe(self, a: str, b: str) -> str:
        """``A faster than B: A takes 0.86x B's time (0.81-0.92, 3 rounds)``, ``B faster than A: A takes 1.2x ...``
        or ``A and B indistinguishable here (A takes ...)``."""
        whose = possessive(b)
        span = f"{a} takes {self.ratio:.2f}x {whose} time ({self.low:.2f}-{self.high:.2f}, {self.n} rounds)"
        if self.sign < 0:
            return f"{a} faster than {b}: {span}"
        if self.sign > 0:
            return f"{b} faster than {a}: {span}"
        return f"{a} and {b} indistinguishable here ({span})"


def too_few(interval: RatioInterval | None) -> bool:
    """A comparison in rounds that shares fewer than :data:`MIN_ROUNDS` rounds (None: fewer than 2): "not yet
    compared", whatever its numbers, never "indistinguishable"."""
    return interval is None or interval.n < MIN_ROUNDS


def paired_ratio(a: Mapping[int, float], b: Mapping[int, float]) -> RatioInterval | None:
    """A's round values over B's (round number -> value, e.g. the round's median total time per turn), paired by
    round: the t interval of their mean log-ratio, as a ratio. None with fewer than 2 shared rounds."""
    shared = sorted(set(a) & set(b))
    logs = [math.log(a[r] / b[r]) for r in shared if a[r] > 0 and b[r] > 0]
    n = len(logs)
    if n < 2:
        return None
    mean = statistics.fmean(logs)
    half = t975(n - 1) * statistics.stdev(logs) / math.sqrt(n)
    return RatioInterval(math.exp(mean), math.exp(mean - half), math.exp(mean + half), n)


def can_still_fall_below_one(a: Mapping[int, float], b: Mapping[int, float], most: int) -> bool:
    """Whether rounds still to come (``most`` in all, counting the shared rounds measured) could put the interval of
    :func:`paired_ratio` (A's over B's) wholly below 1, whatever they measure. False: no result of those rounds can
    call A faster, so measuring them cannot change a decision that only keeps A when it is faster.

    With n log-ratios measured (mean x̄, squared deviations Q) and k = m - n more, the interval's upper end over m
    rounds is lowest, for a given sum of the new ones, when they are equal (that spreads them least); as a function
    of their distance d from x̄ it is ``x̄ + (k/m) d + c √(Q + (n k/m) d²)`` with ``c = t(m-1) / √(m (m-1))``, which is
    convex in d. Where ``c √(n k/m)`` exceeds ``k/m`` its minimum is at ``d = -(k/m) √(Q / (b (c² b - (k/m)²)))``,
    b = n k/m; else it falls without bound (enough new rounds far enough below could always do it)."""
    shared = sorted(set(a) & set(b))
    logs = [math.log(a[r] / b[r]) for r in shared if a[r] > 0 and b[r] > 0]
    n = len(logs)
    if n == 0:
        return most >= MIN_ROUNDS
    mean = statistics.fmean(logs)
    q = sum((x - mean) ** 2 for x in logs)
    for m in range(max(n + 1, MIN_ROUNDS), most + 1):
        k = m - n
        slope, b_ = k / m, n * k / m
        c = t975(m - 1) / math.sqrt(m * (m - 1))
        if c * math.sqrt(b_) <= slope:
            return True
        d = -slope * math.sqrt(q / (b_ * (c * c * b_ - slope * slope)))
        if mean + slope * d + c * math.sqrt(q + b_ * d * d) < 0:
            return True
    return False


def paired_difference(a: Mapping[int, float], b: Mapping[int, float]) -> tuple[float, float, float, int] | None:
    """A's round values less B's (e.g. seconds waited over a recording), paired by round: the mean difference, its
    95 % t interval and the rounds. None with fewer than 2 shared rounds."""
    diffs = [a[r] - b[r] for r in sorted(set(a) & set(b))]
    n = len(diffs)
    if n < 2:
        return None
    mean = statistics.fmean(diffs)
    half = t975(n - 1) * statistics.stdev(diffs) / math.sqrt(n)
    return mean, mean - half, mean + half, n


def rounds_to_settle(r: RatioInterval, most: int = MOST_ROUNDS) -> int | None:
    """The fewest rounds (more than ``r.n``, at least :data:`MIN_ROUNDS`) whose 95 % interval would exclude 1 if the
    observed mean log-ratio and the spread between rounds held; None where no number up to ``most`` would (the
    difference is small against the spread: probably as fast as each other) or where ``r`` shows no spread."""
    mean = math.log(r.ratio)
    half = math.log(r.high) - mean
    if r.n < 2 or half <= 0 or mean == 0:
        return None
    sd = half * math.sqrt(r.n) / t975(r.n - 1)
    for n in range(max(r.n + 1, MIN_ROUNDS), most + 1):
        if t975(n - 1) * sd / math.sqrt(n) < abs(mean):
            return n
    return None


def drifted(first: RoundSummary, again: float) -> float | None:
    """How far a configuration measured again at the end of a stage lies outside the spread of its rounds, as a
    fraction of the nearest edge (positive: slower than every round, negative: faster); None when it lies within."""
    if again > first.high:
        return again / first.high - 1.0
    if again < first.low:
        return again / first.low - 1.0
    return None
