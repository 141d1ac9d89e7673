"""Summary statistics of repeated samples. Pure: no I/O."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence


@dataclasses.dataclass(frozen=True)
class Summary:
    """n samples summarised; ``sd`` is the sample standard deviation (n-1), None below 2 samples."""

    n: int
    mean: float
    sd: float | None
    median: float
    minimum: float
    maximum: float
    q1: float
    q3: float

    @property
    def cv(self) -> float | None:
        """Coefficient of variation (sd / mean)."""
        if self.sd is None or self.mean == 0:
            return None
        return self.sd / self.mean


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default, 'linear') of already sorted values."""
    if not sorted_values:
        raise ValueError("quantile of no values")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"q must be in [0, 1], got {q}")
    pos = (len(sorted_values) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    frac = pos - lo
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac


def summarize(values: Sequence[float]) -> Summary:
    if not values:
        raise ValueError("summarize needs at least one value")
    xs = sorted(float(v) for v in values)
    n = len(xs)
    mean = math.fsum(xs) / n
    sd = math.sqrt(math.fsum((x - mean) ** 2 for x in xs) / (n - 1)) if n > 1 else None
    return Summary(
        n=n,
        mean=mean,
        sd=sd,
        median=quantile(xs, 0.5),
        minimum=xs[0],
        maximum=xs[-1],
        q1=quantile(xs, 0.25),
        q3=quantile(xs, 0.75),
    )


def summarize_present(values: Iterable[float | None]) -> Summary | None:
    """The summary of the values there are (None is a value missing); None when there is none."""
    present = [v for v in values if v is not None]
    return summarize(present) if present else None


def first_is_outlier(values: Sequence[float], factor: float = 3.0) -> bool:
    """True when the first sample lies more than ``factor`` MADs from the median of the rest.

    A slow first repetition usually means missing warm-up (page cache, lazy init): say so.
    """
    if len(values) < 4:
        return False
    rest = sorted(values[1:])
    med = quantile(rest, 0.5)
    mad = quantile(sorted(abs(v - med) for v in rest), 0.5)
    if mad == 0:
        return values[0] != med and abs(values[0] - med) > 0.05 * abs(med)
    return abs(values[0] - med) > factor * 1.4826 * mad
