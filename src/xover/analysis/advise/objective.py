"""advise's objective: a configuration's llama-bench measurement, its expected time per turn over a
workload (TTFT from the prefill integral, decode interpolated in depth) and the noise rule. Pure."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence

from xover.analysis.advise.workload import Workload
from xover.errors import XoverError


@dataclasses.dataclass(frozen=True)
class RateSamples:
    """One llama-bench test: ``tokens`` new tokens at ``depth``, every repetition's tokens/s."""

    depth: int
    tokens: int
    samples_tps: tuple[float, ...]

    @property
    def median_tps(self) -> float:
        xs = sorted(self.samples_tps)
        mid = len(xs) // 2
        return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2


@dataclasses.dataclass(frozen=True)
class Measurement:
    """What one configuration measured (or why it could not be)."""

    prefill: tuple[RateSamples, ...] = ()  # pp{P} @ dN, one per depth
    decode: tuple[RateSamples, ...] = ()  # tg{T} @ dN
    effective: tuple[tuple[str, str], ...] = ()  # llama-bench record field -> value in effect (n_threads...)
    peak_rss_bytes: int | None = None
    device_bytes: int | None = None  # accelerator buffers llama.cpp logged
    failure: str | None = None
    reused: bool = False  # found in the store, not measured by this run

    @property
    def ok(self) -> bool:
        return self.failure is None and bool(self.prefill) and bool(self.decode)

    @property
    def repetitions(self) -> int:
        return min(len(r.samples_tps) for r in (*self.prefill, *self.decode)) if self.ok else 0


def curve_at(points: Sequence[tuple[float, float]], x: float) -> float:
    """The piecewise-linear curve through ``points`` (sorted by x) at ``x``: constant before the first
    point, the last segment's slope after the last (flat when that slope is negative)."""
    if len(points) == 1 or x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    (x0, y0), (x1, y1) = points[-2], points[-1]
    return y1 + max(0.0, (y1 - y0) / (x1 - x0)) * (x - x1)


def _integral(points: Sequence[tuple[float, float]], hi: float) -> float:
    """Exact integral of :func:`curve_at` from 0 to ``hi``."""
    xs = sorted({0.0, hi, *(x for x, _ in points if 0.0 < x < hi)})
    return sum((b - a) * (curve_at(points, a) + curve_at(points, b)) / 2 for a, b in itertools.pairwise(xs))


def ttft_s(prefill: Sequence[tuple[int, int, float]], length: int, cached: int = 0) -> float:
    """TTFT of a ``length``-token prompt from ``pp`` tests given as (depth, tokens, tok/s): the integral of prefill
    time per token over depth, placed at the middle of each test's chunk; from ``cached`` on for a turn whose first
    ``cached`` tokens come from the prompt cache (0: a cold prompt)."""
    points = sorted((d + n / 2, 1.0 / tps) for d, n, tps in prefill)
    return _integral(points, float(cached + length)) - (_integral(points, float(cached)) if cached else 0.0)


def decode_s_per_token(decode: Sequence[tuple[int, float]], depth: int) -> float:
    """Seconds per decoded token at ``depth``, linear in depth between ``tg`` tests."""
    return curve_at(sorted((float(d), 1.0 / tps) for d, tps in decode), float(depth))


@dataclasses.dataclass(frozen=True)
class Estimate:
    """A configuration's expected cost per turn over the workload, from llama-bench tests."""

    turn_s: float  # from every test's median
    ttft_s: float  # its TTFT part
    decode_s: float  # its decode part
    turn_samples_s: tuple[float, ...]  # once per repetition
    decode_samples_s: tuple[float, ...] = ()  # its decode part, once per repetition

    @property
    def spread_s(self) -> float:
        return max(self.turn_samples_s) - min(self.turn_samples_s) if self.turn_samples_s else 0.0

    @property
    def decode_spread_s(self) -> float:
        return max(self.decode_samples_s) - min(self.decode_samples_s) if self.decode_samples_s else 0.0


def _decode_part(decode: Sequence[tuple[int, float]], workload: Workload) -> float:
    """The expected seconds a turn spends decoding its response, from ``tg`` tests given as (depth, tok/s)."""
    return workload.expected(lambda t: t.response * decode_s_per_token(decode, t.cached + t.length))


def _parts(
    prefill: Sequence[tuple[int, int, float]], decode: Sequence[tuple[int, float]], workload: Workload
) -> tuple[float, float]:
    return workload.expected(lambda t: ttft_s(prefill, t.length, t.cached)), _decode_part(decode, workload)


def estimate(m: Measurement, workload: Workload) -> Estimate:
    if not m.ok:
        raise XoverError(f"cannot estimate a configuration that was not measured ({m.failure or 'no tests'})")
    ttft, dec = _parts(
        [(r.depth, r.tokens, r.median_tps) for r in m.prefill], [(r.depth, r.median_tps) for r in m.decode], workload
    )
    per_rep, decode_rep = [], []
    for i in range(m.repetitions):
        a, b = _parts(
            [(r.depth, r.tokens, r.samples_tps[i]) for r in m.prefill],
            [(r.depth, r.samples_tps[i]) for r in m.decode],
            workload,
        )
        per_rep.append(a + b)
        decode_rep.append(b)
    return Estimate(
        turn_s=ttft + dec, ttft_s=ttft, decode_s=dec, turn_samples_s=tuple(per_rep), decode_samples_s=tuple(decode_rep)
    )


def decode_turn_s(m: Measurement, workload: Workload) -> float:
    """The decode part of the expected turn from a measurement's decode tests alone (a decode-only measurement,
    llama-bench ``-p 0``, has no prefill tests)."""
    if m.failure is not None or not m.decode:
        raise XoverError(f"cannot estimate decode from a configuration without decode tests ({m.failure or 'none'})")
    return _decode_part([(r.depth, r.median_tps) for r in m.decode], workload)


def noise_between(a: Estimate, b: Estimate, drift_s: float | None = None) -> float:
    """How far apart two configurations' expected times must be to count as different: both spreads added (each
    is the range of a few repetitions, which underestimates the variation; with three repetitions a knob that
    cannot act, measured against the defaults, came out faster than the larger spread alone), or the drift of the
    defaults measured twice, if larger."""
    return max(a.spread_s + b.spread_s, drift_s or 0.0)


def within_noise(a: Estimate, b: Estimate, drift_s: float | None = None) -> bool:
    """Whether two configurations' expected times differ by no more than :func:`noise_between`."""
    return abs(a.turn_s - b.turn_s) <= noise_between(a, b, drift_s)
