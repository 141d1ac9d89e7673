"""Prefill against decode between two variants of one configuration (defaults vs tuned, or any pair).
Pure: no I/O.

A setting that speeds up prefill can slow down decode (a larger ubatch, weights kept off the GPU...).
The two are never folded into one score here: each ratio is reported with its own spread and noise
call, and only where they pull in opposite directions is there a prompt length where one outweighs the
other.

Ratios are ``B / A`` of speeds (tokens/s): above 1, B is faster. The spread of a ratio is the range
``min(B) / max(A) .. max(B) / min(A)``, the extreme ratios the samples allow; a ratio is *beyond noise*
when that range excludes 1, i.e. the two sample ranges do not overlap (the rule of
:func:`xover.analysis.crossover.separation`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from xover.analysis.crossover import ConfigData, PairResult, claimed_crossing, compare_pair


@dataclasses.dataclass(frozen=True)
class Ratio:
    """B's speed over A's: the ratio of medians, and the range the samples allow."""

    median: float
    lo: float  # min(B) / max(A)
    hi: float  # max(B) / min(A)

    @property
    def beyond_noise(self) -> bool:
        """The sample ranges do not overlap: B is faster (lo > 1) or slower (hi < 1) in every sample."""
        return self.lo > 1.0 or self.hi < 1.0

    @property
    def direction(self) -> int:
        """+1: B clearly faster; -1: B clearly slower; 0: within noise."""
        return 1 if self.lo > 1.0 else -1 if self.hi < 1.0 else 0

    def percent(self) -> str:
        """``+52% [+45..+60%]``: the median change and its range, in percent of A."""
        return f"{(self.median - 1) * 100:+.0f}% [{(self.lo - 1) * 100:+.0f}..{(self.hi - 1) * 100:+.0f}%]"


def _median(xs: Sequence[float]) -> float:
    return float(np.median(np.asarray(xs, dtype=float)))


def ratio(a: Sequence[float], b: Sequence[float]) -> Ratio:
    """B over A from raw samples of a speed (higher is better; tokens/s)."""
    if not a or not b:
        raise ValueError("a ratio needs at least one sample a side")
    if min(a) <= 0 or min(b) <= 0:
        raise ValueError("speeds must be positive")
    return Ratio(_median(b) / _median(a), min(b) / max(a), max(b) / min(a))


def break_even_length(
    prefill_a: float, decode_a: float, prefill_b: float, decode_b: float, response: int
) -> float | None:
    """The prompt length L where A and B take equally long per turn, with constant rates (tokens/s):

        L / p_a + R / d_a = L / p_b + R / d_b   =>   L (1/p_a - 1/p_b) = R (1/d_b - 1/d_a)

    Past L the side with the faster prefill wins; below it the side with the faster decode. None when
    one side is at least as fast at both (no trade-off: nothing to break even)."""
    dp = 1.0 / prefill_a - 1.0 / prefill_b  # > 0: B prefills faster
    dd = 1.0 / decode_b - 1.0 / decode_a  # > 0: B decodes slower
    if dp == 0 or dd == 0 or (dp > 0) != (dd > 0):
        return None
    return response * dd / dp


@dataclasses.dataclass(frozen=True)
class Tradeoff:
    """B against A: prefill and decode ratios kept apart, and their break-even prompt length."""

    a: str
    b: str
    response: int
    prefill: Ratio
    decode: Ratio
    break_even: float | None  # from the medians; None when one side wins (or loses) both

    @property
    def is_tradeoff(self) -> bool:
        return self.break_even is not None

    @property
    def beyond_noise(self) -> bool:
        """Both changes of the trade-off are beyond noise (else the break-even rests on a noisy median)."""
        return self.is_tradeoff and self.prefill.beyond_noise and self.decode.beyond_noise

    @property
    def long_winner(self) -> str | None:
        """Who wins prompts past the break-even: the faster prefill."""
        if not self.is_tradeoff:
            return None
        return self.b if self.prefill.median > 1 else self.a

    @property
    def short_winner(self) -> str | None:
        if not self.is_tradeoff:
            return None
        return self.a if self.prefill.median > 1 else self.b


def tradeoff(
    a: str,
    prefill_a: Sequence[float],
    decode_a: Sequence[float],
    b: str,
    prefill_b: Sequence[float],
    decode_b: Sequence[float],
    response: int,
) -> Tradeoff:
    """B against A from raw speed samples (tokens/s), and the break-even of :func:`break_even_length` at
    the median rates, for responses of ``response`` tokens.

    The break-even is a constant-rate model: prefill speed does fall with depth (attention), so it is a
    guide to where the balance tips, not a measured crossing (:func:`served_tradeoff` has that)."""
    p, d = ratio(prefill_a, prefill_b), ratio(decode_a, decode_b)
    be = break_even_length(_median(prefill_a), _median(decode_a), _median(prefill_b), _median(decode_b), response)
    return Tradeoff(a, b, response, p, d, be)


@dataclasses.dataclass(frozen=True)
class ServedPoint:
    """One measured prompt length through llama-server: B against A."""

    length: int
    tradeoff: Tradeoff  # prefill from cold TTFT (L / TTFT), decode from the server's own decode speed
    total_a_s: float  # median-based total time per turn (crossover.measured_totals)
    total_b_s: float
    separated: int  # crossover.separation: -1 A clearly faster per turn, +1 B, 0 within noise


@dataclasses.dataclass(frozen=True)
class ServedTradeoff:
    points: tuple[ServedPoint, ...]
    pair: PairResult  # the crossover comparison the points come from: names A, B and the response length
    break_even: float | None  # where the measured totals cross, only where the verdict claims a crossover

    @property
    def a(self) -> str:
        return self.pair.a

    @property
    def b(self) -> str:
        return self.pair.b

    @property
    def response(self) -> int:
        return self.pair.response

    def constant_rate_break_even(self) -> tuple[float, ...]:
        """The constant-rate break-even at each measured length's own rates (empty: no trade-off anywhere)."""
        return tuple(p.tradeoff.break_even for p in self.points if p.tradeoff.break_even is not None)


def _decode_samples(data: ConfigData, depth: int) -> list[float]:
    """Server decode samples at ``depth``; the nearest measured depth when that one has none."""
    if depth in data.decode_tps:
        return list(data.decode_tps[depth])
    nearest = min(data.decode_tps, key=lambda d: abs(d - depth))
    return list(data.decode_tps[nearest])


def served_tradeoff(a: ConfigData, b: ConfigData, response: int) -> ServedTradeoff:
    """B against A from what llama-server measured: at each shared prompt length, prefill speed from the
    cold TTFT samples (``L / TTFT``, so it includes HTTP and tokenization) and the decode speed the
    server reported, each ratio with its spread; the total time per turn; and the break-even where the
    measured totals cross (linear interpolation, :func:`xover.analysis.crossover.compare_pair`), named
    only when the crossover verdict claims it (:func:`xover.analysis.crossover.claimed_crossing`)."""
    pair = compare_pair(a, b, response, n_boot=0)
    points = []
    for i, length in enumerate(pair.lengths):
        t = tradeoff(
            a.label,
            [length / s for s in a.ttft_s[length]],
            _decode_samples(a, length),
            b.label,
            [length / s for s in b.ttft_s[length]],
            _decode_samples(b, length),
            response,
        )
        points.append(ServedPoint(length, t, pair.total_a[i], pair.total_b[i], pair.separated[i]))
    claim = claimed_crossing(pair)
    be = claim.length if claim is not None and not claim.fitted else None
    return ServedTradeoff(tuple(points), pair, be)
