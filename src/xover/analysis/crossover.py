"""Total time per turn and where two configurations' curves cross. Pure: no I/O.

For a prompt of L tokens and a response of R tokens::

    total(L) = TTFT(L) + R / decode_tok_s(L)

Two ways to find the crossover of two configurations A and B (``D(L) = total_A(L) - total_B(L)``):

* **interpolation** between measured lengths: a sign change of D between neighbours, located by
  linear interpolation of D in L;
* a **fitted cost model** per configuration, ``TTFT(L) = a + b L + c L^2`` and decode time per
  token linear in depth ``t(d) = p + q d`` (least squares on the raw samples). The R response
  tokens are decoded at depths L .. L+R-1, so their time is ``R p + q (R L + R(R-1)/2)``, and D(L)
  is a quadratic whose positive roots are the crossovers. A bootstrap over the raw samples gives
  a confidence interval.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np

from xover.analysis.rounds import MIN_ROUNDS, RatioInterval, paired_ratio, too_few
from xover.domain.units import format_tokens

# Measurements of one configuration: raw TTFT samples (seconds) per prompt length, and raw decode
# speeds (tokens/s) per context depth.
Samples = Mapping[int, Sequence[float]]


@dataclasses.dataclass(frozen=True)
class ConfigData:
    label: str
    ttft_s: Samples  # prompt length -> TTFT samples in seconds
    decode_tps: Samples  # depth -> decode speed samples in tokens/s
    # The longest prompt this configuration's placement holds (a fit@8k level under a VRAM budget holds
    # 8K and no more: longer prompts do not load); None: no limit known.
    max_prompt: int | None = None
    # Prompt lengths not measured because the configuration was too slow for them (a study's max-ttft), each
    # with its estimated cold TTFT in seconds, scaled linearly from a shorter measured length.
    too_slow: tuple[tuple[int, float], ...] = ()
    # Measured in rounds of fresh server processes: prompt length -> round -> that round's median cold TTFT (s) and
    # median decode speed (tokens/s). Empty for a store measured before rounds (one process per configuration).
    rounds: Mapping[int, Mapping[int, tuple[float, float]]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class CostModel:
    """TTFT(L) = a + b L + c L^2 (seconds); decode seconds/token t(d) = p + q d."""

    a: float
    b: float
    c: float
    p: float
    q: float

    def ttft(self, length: float) -> float:
        return self.a + self.b * length + self.c * length * length

    def decode_s(self, length: float, response: int) -> float:
        """Seconds to decode ``response`` tokens after a prompt of ``length`` tokens."""
        return response * self.p + self.q * (response * length + response * (response - 1) / 2)

    def total(self, length: float, response: int) -> float:
        return self.ttft(length) + self.decode_s(length, response)

    def quadratic_share(self, length: float) -> float:
        """Fraction of TTFT(L) carried by the L^2 term: how much of the cost is attention."""
        t = self.ttft(length)
        return self.c * length * length / t if t > 0 else math.nan


@dataclasses.dataclass(frozen=True)
class Crossing:
    length: float
    kind: str  # "cross" (sign change) or "touch" (equal at a point, no sign change)
    extrapolated: bool  # outside the measured lengths


@dataclasses.dataclass(frozen=True)
class PairResult:
    a: str
    b: str
    response: int  # answer tokens a turn's total counts
    lengths: tuple[int, ...]
    total_a: tuple[float, ...]  # median-based totals at the measured lengths (s)
    total_b: tuple[float, ...]
    interpolated: tuple[Crossing, ...]
    fitted: tuple[Crossing, ...]
    ci: tuple[float, float] | None  # bootstrap 95% interval of the first fitted crossing
    ci_no_crossing_fraction: float | None  # share of bootstrap replicates with no crossing in (0, max_len]
    separated: tuple[int, ...] = ()  # per length: -1 A clearly faster, +1 B clearly faster, 0 within noise
    max_prompt_a: int | None = None  # ConfigData.max_prompt of each side
    max_prompt_b: int | None = None
    # Lengths past the shared ones that only one side measured, with its median total there (s), and the
    # other side's too-slow estimates (ConfigData.too_slow): what the band can still be answered from.
    only_a: tuple[tuple[int, float], ...] = ()
    only_b: tuple[tuple[int, float], ...] = ()
    too_slow_a: tuple[tuple[int, float], ...] = ()
    too_slow_b: tuple[tuple[int, float], ...] = ()
    # Per length, A's total time per turn over B's over the rounds both were measured in, with its 95 % interval
    # (xover.analysis.rounds); empty when either side was measured before rounds (the within-process rule decides).
    intervals: tuple[RatioInterval | None, ...] = ()
    # Per length, the rounds the two share (with ``intervals``; an interval needs 2)
    shared: tuple[int, ...] = ()

    @property
    def in_rounds(self) -> bool:
        """Whether the pair is judged over rounds of fresh processes (else by the spread inside one process)."""
        return bool(self.intervals)

    @property
    def short_at(self) -> frozenset[int]:
        """The length indices judged over rounds where the two share fewer than
        :data:`~xover.analysis.rounds.MIN_ROUNDS` rounds: "not yet compared" there, not "indistinguishable"."""
        return frozenset(i for i, r in enumerate(self.intervals) if too_few(r))

    @property
    def too_few_rounds(self) -> bool:
        """Judged over rounds, but at no length over the :data:`~xover.analysis.rounds.MIN_ROUNDS` a verdict needs:
        "not yet compared", never "indistinguishable" (two rounds cannot part even a 10x gap)."""
        return self.in_rounds and len(self.short_at) == len(self.intervals)

    def rounds_told(self) -> str:
        """``3 rounds`` or ``3-5 rounds``: how many rounds the pair's comparisons rest on."""
        ns = sorted(set(self.shared) if self.shared else {i.n for i in self.intervals if i is not None})
        if not ns:
            return "no shared rounds"
        if len(ns) > 1:
            return f"{ns[0]}-{ns[-1]} rounds"
        return f"{ns[0]} round" + ("s" if ns[0] != 1 else "")

    def faster_at(self, length_index: int) -> str:
        return self.a if self.total_a[length_index] < self.total_b[length_index] else self.b


def _median(xs: Sequence[float]) -> float:
    return float(np.median(np.asarray(xs, dtype=float)))


def _decode_tps_at(data: ConfigData, depth: int) -> float:
    """Decode speed at a depth: measured there, else linearly interpolated in time/token."""
    if depth in data.decode_tps:
        return _median(data.decode_tps[depth])
    depths = sorted(data.decode_tps)
    if not depths:
        raise ValueError(f"{data.label}: no decode measurements")
    spt = [1.0 / _median(data.decode_tps[d]) for d in depths]
    return 1.0 / float(np.interp(depth, depths, spt))


def round_totals(data: ConfigData, length: int, response: int) -> dict[int, float]:
    """Round -> total(L) from that round's medians: its cold TTFT and ``response`` tokens at its decode speed."""
    return {r: ttft + response / decode for r, (ttft, decode) in data.rounds.get(length, {}).items() if decode > 0}


def measured_totals(data: ConfigData, response: int) -> dict[int, float]:
    """total(L) at each measured prompt length (seconds): the median of its round totals where it was measured in
    rounds of fresh processes, else from the medians of its samples."""
    out = {}
    for L, samples in sorted(data.ttft_s.items()):
        by_round = round_totals(data, L, response)
        out[L] = _median(list(by_round.values())) if by_round else _median(samples) + response / _decode_tps_at(data, L)
    return out


def round_interval(a: ConfigData, b: ConfigData, length: int, response: int) -> RatioInterval | None:
    """A's total time per turn over B's at ``length``, paired by round (:func:`xover.analysis.rounds.paired_ratio`);
    None where they share fewer than two rounds."""
    return paired_ratio(round_totals(a, length, response), round_totals(b, length, response))


def too_few_rounds(a: ConfigData, b: ConfigData, length: int, response: int) -> bool:
    """Both measured ``length`` in rounds, but share fewer than :data:`~xover.analysis.rounds.MIN_ROUNDS` of them:
    :func:`separation` says 0, and that is "not yet compared", not "within noise"."""
    if not (a.rounds.get(length) and b.rounds.get(length)):
        return False
    return too_few(round_interval(a, b, length, response))


def separation(a: ConfigData, b: ConfigData, length: int, response: int) -> int:
    """-1 when A is clearly faster at ``length``, +1 when B is, 0 when the difference is within the noise.

    Measured in rounds of fresh processes (both sides): by the rounds rule (:mod:`xover.analysis.rounds`): the 95 %
    interval of A's total over B's, paired by round, lies below or above 1. Measured before rounds (one process per
    configuration): every sample of A's total beats every sample of B's, or the reverse; otherwise the ranges
    overlap. Totals per sample: its TTFT plus the median decode time.

    With 3 samples a side, ranges that do not overlap happen by chance with probability 0.1 when the two
    are equal (2 of the 20 ways to order six samples), so a difference called here is a real one
    far more often than not; a smaller one is reported as noise rather than as a winner. That is the within-process
    rule: it cannot see the drift between processes, which is why rounds replace it."""
    if a.rounds.get(length) and b.rounds.get(length):
        r = round_interval(a, b, length, response)
        return 0 if r is None else r.sign

    def span(d: ConfigData) -> tuple[float, float]:
        dec = response / _decode_tps_at(d, length)
        xs = [t + dec for t in d.ttft_s[length]]
        return min(xs), max(xs)

    (a_lo, a_hi), (b_lo, b_hi) = span(a), span(b)
    if a_hi < b_lo:
        return -1
    if b_hi < a_lo:
        return 1
    return 0


def interpolate_crossings(lengths: Sequence[float], diff: Sequence[float]) -> list[Crossing]:
    """Where ``diff`` (A - B at each length) changes sign, by linear interpolation; zeros are touches."""
    out: list[Crossing] = []
    for i, (x, d) in enumerate(zip(lengths, diff)):
        if d == 0:
            before = diff[i - 1] if i > 0 else None
            after = diff[i + 1] if i + 1 < len(diff) else None
            crosses = before is not None and after is not None and before * after < 0
            out.append(Crossing(float(x), "cross" if crosses else "touch", False))
    for (x0, d0), (x1, d1) in zip(zip(lengths, diff), zip(lengths[1:], diff[1:])):
        if d0 * d1 < 0:
            out.append(Crossing(x0 + (x1 - x0) * d0 / (d0 - d1), "cross", False))
    return sorted(out, key=lambda c: c.length)


def fit_cost_model(data: ConfigData) -> CostModel:
    """Least squares on the raw samples: TTFT quadratic in L, decode s/token linear in depth.

    With fewer than three distinct lengths the quadratic term is dropped (c = 0); with one length TTFT is scaled
    through the origin (a = 0, as the study's max-ttft estimate scales it: prefill's time grows with the prompt, and a
    constant would draw a configuration measured once as if its prompts cost nothing more); with one decode depth
    the slope q is 0.
    """
    xs, ys = [], []
    for L, samples in data.ttft_s.items():
        for s in samples:
            xs.append(float(L))
            ys.append(float(s))
    if not xs:
        raise ValueError(f"{data.label}: no TTFT samples")
    x = np.asarray(xs)
    y = np.asarray(ys)
    scale = max(x.max(), 1.0)  # fit in units of the longest length for conditioning
    u = x / scale
    if len(set(xs)) >= 3:
        design = np.column_stack([np.ones_like(u), u, u * u])
        (a, b, c), *_ = np.linalg.lstsq(design, y, rcond=None)
    elif len(set(xs)) == 2:
        design = np.column_stack([np.ones_like(u), u])
        (a, b), *_ = np.linalg.lstsq(design, y, rcond=None)
        c = 0.0
    else:
        a, b, c = 0.0, float(y.mean()), 0.0  # u = 1 at the one length
    ds, ts = [], []
    for d, samples in data.decode_tps.items():
        for tps in samples:
            ds.append(float(d))
            ts.append(1.0 / float(tps))
    if not ds:
        raise ValueError(f"{data.label}: no decode samples")
    if len(set(ds)) >= 2:
        design = np.column_stack([np.ones(len(ds)), np.asarray(ds)])
        (p, q), *_ = np.linalg.lstsq(design, np.asarray(ts), rcond=None)
    else:
        p, q = float(np.mean(ts)), 0.0
    return CostModel(a=float(a), b=float(b) / scale, c=float(c) / scale**2, p=float(p), q=float(q))


def model_crossings(ma: CostModel, mb: CostModel, response: int, lo: float, hi: float) -> list[Crossing]:
    """Positive roots of total_A(L) - total_B(L) (a quadratic in L), marked extrapolated outside [lo, hi]."""
    R = response
    c2 = ma.c - mb.c
    c1 = (ma.b - mb.b) + R * (ma.q - mb.q)
    c0 = (ma.a - mb.a) + R * (ma.p - mb.p) + (ma.q - mb.q) * R * (R - 1) / 2
    roots: list[tuple[float, str]] = []
    scale = max(abs(c0), abs(c1) * hi, abs(c2) * hi * hi, 1e-300)
    if abs(c2) * hi * hi <= 1e-12 * scale:
        if abs(c1) * hi > 1e-12 * scale:
            roots.append((-c0 / c1, "cross"))
    else:
        disc = c1 * c1 - 4 * c2 * c0
        if abs(disc) <= 1e-12 * (c1 * c1 + abs(4 * c2 * c0)):
            roots.append((-c1 / (2 * c2), "touch"))
        elif disc > 0:
            sq = math.sqrt(disc)
            # numerically stable quadratic roots
            qv = -0.5 * (c1 + math.copysign(sq, c1))
            roots.extend([(qv / c2, "cross"), (c0 / qv if qv != 0 else -c1 / c2, "cross")])
    out = [Crossing(r, kind, not (lo <= r <= hi)) for r, kind in roots if r > 0]
    return sorted(out, key=lambda c: c.length)


def _resample(samples: Samples, rng: np.random.Generator) -> dict[int, list[float]]:
    return {k: list(rng.choice(np.asarray(v, dtype=float), size=len(v), replace=True)) for k, v in samples.items()}


def bootstrap_crossing(
    a: ConfigData, b: ConfigData, response: int, lo: float, hi: float, n_boot: int = 1000, seed: int = 0
) -> tuple[tuple[float, float] | None, float]:
    """95% percentile interval of the first fitted crossing in (0, hi*4], and the share of
    replicates with no crossing there. Resamples raw samples within each (config, length)."""
    rng = np.random.default_rng(seed)
    found: list[float] = []
    none = 0
    for _ in range(n_boot):
        ra = ConfigData(a.label, _resample(a.ttft_s, rng), _resample(a.decode_tps, rng))
        rb = ConfigData(b.label, _resample(b.ttft_s, rng), _resample(b.decode_tps, rng))
        xs = [
            c.length
            for c in model_crossings(fit_cost_model(ra), fit_cost_model(rb), response, lo, hi)
            if c.kind == "cross" and c.length <= hi * 4
        ]
        if xs:
            found.append(xs[0])
        else:
            none += 1
    if len(found) < max(20, n_boot // 10):
        return None, none / n_boot
    lo_ci, hi_ci = np.percentile(found, [2.5, 97.5])
    return (float(lo_ci), float(hi_ci)), none / n_boot


def compare_pair(a: ConfigData, b: ConfigData, response: int, n_boot: int = 1000, seed: int = 0) -> PairResult:
    ta, tb = measured_totals(a, response), measured_totals(b, response)
    lengths = tuple(sorted(set(ta) & set(tb)))
    if not lengths:
        raise ValueError(f"{a.label} and {b.label} share no measured prompt length")
    da = [ta[L] for L in lengths]
    db = [tb[L] for L in lengths]
    interp = interpolate_crossings(lengths, [x - y for x, y in zip(da, db)])
    lo, hi = float(lengths[0]), float(lengths[-1])
    fitted = tuple(model_crossings(fit_cost_model(a), fit_cost_model(b), response, lo, hi))
    ci, none_frac = (None, None)
    if n_boot > 0:
        ci, none_frac = bootstrap_crossing(a, b, response, lo, hi, n_boot=n_boot, seed=seed)
    sep = tuple(separation(a, b, L, response) for L in lengths)
    intervals = (
        tuple(round_interval(a, b, L, response) for L in lengths)
        if all(a.rounds.get(L) and b.rounds.get(L) for L in lengths)
        else ()
    )
    only_a = tuple((L, t) for L, t in ta.items() if L > lengths[-1] and L not in tb)
    only_b = tuple((L, t) for L, t in tb.items() if L > lengths[-1] and L not in ta)
    return PairResult(
        a.label,
        b.label,
        response,
        lengths,
        tuple(da),
        tuple(db),
        tuple(interp),
        fitted,
        ci,
        none_frac,
        sep,
        a.max_prompt,
        b.max_prompt,
        only_a,
        only_b,
        a.too_slow,
        b.too_slow,
        intervals,
        tuple(len(set(a.rounds[L]) & set(b.rounds[L])) for L in lengths) if intervals else (),
    )


_k = format_tokens


@dataclasses.dataclass(frozen=True)
class Sides:
    """Who is clearly faster where, by the noise rule of :func:`separation`."""

    separated: tuple[int, ...]  # per length: -1 A clearly faster, +1 B, 0 within noise
    clear: tuple[tuple[int, str], ...]  # (length index, winner) where one is clearly faster
    ties: tuple[int, ...]  # length indices within noise
    changes: tuple[int, ...]  # indices j into ``clear`` where the winner differs from clear[j - 1]


def sides(pair: PairResult) -> Sides:
    sep = pair.separated or tuple(-1 if x < y else 1 for x, y in zip(pair.total_a, pair.total_b))
    clear = tuple((i, pair.a if s < 0 else pair.b) for i, s in enumerate(sep) if s)
    ties = tuple(i for i, s in enumerate(sep) if not s)
    changes = tuple(j for j in range(1, len(clear)) if clear[j][1] != clear[j - 1][1])
    return Sides(tuple(sep), clear, ties, changes)


@dataclasses.dataclass(frozen=True)
class ClaimedCrossing:
    """The crossover a verdict names: measured (between lengths where each side is clearly faster) or
    from the fitted cost model (one side clearly faster everywhere, the fit crossing between a tenth of
    the shortest and twice the longest measured length)."""

    length: float
    fitted: bool
    extrapolated: bool


def claimed_crossing(pair: PairResult) -> ClaimedCrossing | None:
    """The crossover :func:`verdict` claims for this pair, or None (within noise, one side faster with
    no fitted crossing near the data, or an order that flips more than once). The plot draws exactly
    this, so the picture and the text cannot disagree."""
    s = sides(pair)
    if not s.clear or len(s.changes) > 1:
        return None
    if not s.changes:
        # A fitted crossing far outside the data is the fit's guess, not a finding: keep those from a tenth
        # of the shortest measured length (below the data TTFT is near-linear, the intercept dominates; a
        # root near zero tokens is the intercepts' noise) to twice the longest (above it the quadratic term
        # dominates), and only where no length is within noise.
        # Inside the measured span the measurements themselves say who is faster: one side clearly faster at
        # every length leaves no room for a crossing there, whatever the fit says.
        lo, hi = pair.lengths[0] / 10, 2 * pair.lengths[-1]
        fitted = [
            c
            for c in pair.fitted
            if c.kind == "cross" and lo <= c.length <= hi and not pair.lengths[0] <= c.length <= pair.lengths[-1]
        ]
        if fitted and not s.ties:
            return ClaimedCrossing(fitted[0].length, True, fitted[0].extrapolated)
        return None
    j = s.changes[0]
    lo_i, hi_i = s.clear[j - 1][0], s.clear[j][0]
    inside = [
        c for c in pair.interpolated if c.kind == "cross" and pair.lengths[lo_i] <= c.length <= pair.lengths[hi_i]
    ]
    x = inside[0].length if inside else (pair.lengths[lo_i] + pair.lengths[hi_i]) / 2
    return ClaimedCrossing(x, False, False)


def lengths_span(pair: PairResult, unit: str = "tokens") -> str:
    """``1K-16K tokens``, or ``1K tokens`` where the pair shares one length (``unit``: how lengths are told)."""
    lo, hi = pair.lengths[0], pair.lengths[-1]
    return f"{_k(lo)} {unit}" if lo == hi else f"{_k(lo)}-{_k(hi)} {unit}"


def fitted_outside(pair: PairResult, unit: str = "tokens", what: str = "prompts") -> str:
    """For a pair indistinguishable at every shared length: where its fitted totals cross just outside them (from
    a tenth of the shortest to twice the longest, as :func:`claimed_crossing` keeps), told as a prediction to
    measure, never as a finding (the plot marks no crossing for it); empty otherwise. ``unit``, ``what``: how the
    lengths are told (``new tokens`` and ``turns`` for cached turns)."""
    lo, hi = pair.lengths[0], pair.lengths[-1]
    near = [c for c in pair.fitted if c.kind == "cross" and lo / 10 <= c.length <= 2 * hi and not lo <= c.length <= hi]
    if len(near) != 1:
        return ""
    x = near[0].length
    below = x < lo
    measured = pair.faster_at(0 if below else len(pair.lengths) - 1)  # the medians' order where measured
    other = pair.b if measured == pair.a else pair.a
    where, past, settle = ("below", "shortest", "shorter") if below else ("above", "longest", "longer")
    return (
        f"; their fitted totals cross at about {_k(x)} {unit}, {where} the {past} length measured: {where} it "
        f"{other} is expected faster (extrapolated; measure {settle} {what} to settle it)"
    )


def claims_crossover(pair: PairResult) -> bool:
    """Whether :func:`verdict` names a crossover for this pair (measured or fitted)."""
    return claimed_crossing(pair) is not None


def split_short(pair: PairResult, indices: Sequence[int] | None = None) -> tuple[str, str]:
    """The lengths of ``indices`` (default: all), told: those over enough shared rounds, and those with too few
    (:attr:`PairResult.short_at`), each as ``4K, 16K`` ("" for none)."""
    at = range(len(pair.lengths)) if indices is None else indices
    return (
        ", ".join(_k(pair.lengths[i]) for i in at if i not in pair.short_at),
        ", ".join(_k(pair.lengths[i]) for i in at if i in pair.short_at),
    )


def tie_note(pair: PairResult, ties: Sequence[int], noise: str) -> str:
    """``; indistinguishable here at 4K; not yet compared at 16K``: the lengths (indices ``ties``) where no side is
    faster, those with too few shared rounds (:attr:`PairResult.short_at`) told apart."""
    settled, short = split_short(pair, ties)
    return (f"; {noise} at {settled}" if settled else "") + (f"; not yet compared at {short}" if short else "")


def _noise(pair: PairResult, of: str = "") -> str:
    """How a difference within the noise is told: over rounds, "indistinguishable here"; before them, "within noise"."""
    if pair.in_rounds:
        return "indistinguishable here"
    return f"within noise {of}".strip()


def verdict(pair: PairResult, band: tuple[int, int] = (10_000, 40_000)) -> str:
    """One sentence naming both configurations: who wins where, the crossover, where the agentic band falls.

    Lengths where the two are within noise (:func:`separation`) name no winner: a crossover is only
    claimed between lengths where each side is clearly faster, so noise never reads as a crossing. A side
    whose placement cannot hold the band's prompts (``max_prompt``) never wins the band. Lengths only one
    side measured, the other too slow for them (:func:`beyond_shared`), are told after the shared ones."""
    beyond = beyond_shared(pair)
    held = _band_held(pair, band, beyond)
    if held is not None:
        return held
    told = _verdict(pair, band, beyond is not None)
    return told if beyond is None else f"{told[:-1]}; {beyond}."


CLEAR_OF_ESTIMATE = 2.0
"""How many times a measured turn an unmeasured side's estimated TTFT must be before :func:`beyond_shared` names
the measured side faster: the estimate scales the longest shorter prompt's TTFT linearly, which prefill's growth
with depth makes low but a fixed per-request cost makes high."""


def beyond_shared(pair: PairResult) -> str | None:
    """The lengths past the shared ones that only one side measured: its totals there and, where the other
    was too slow to measure (a max-ttft skip), whether that side's estimated cold TTFT alone is clearly beyond
    the measured side's whole turn. None when both measured the same lengths, or when the other's placement
    does not hold those lengths (a fit@8k level against a fit@32k one)."""
    for measured, other, only, slow, reach in (
        (pair.b, pair.a, pair.only_b, pair.too_slow_a, pair.max_prompt_a),
        (pair.a, pair.b, pair.only_a, pair.too_slow_b, pair.max_prompt_b),
    ):
        if not only or (reach is not None and all(L > reach for L, _ in only)):
            continue  # the other's placement does not hold them: the band's verdict says so
        totals = ", ".join(f"{_k(L)} {t:.1f} s" for L, t in only)
        clause = f"past {_k(pair.lengths[-1])} only {measured} was measured ({totals} a turn)"
        est = dict(slow)
        floors = [(L, t, est[L]) for L, t in only if L in est]
        ests = ", ".join(f"{_k(L)} about {e:.0f} s" for L, _, e in floors)
        if floors and len(floors) == len(only) and all(e >= CLEAR_OF_ESTIMATE * t for _, t, e in floors):
            return clause + (
                f"; {other} was too slow to measure there, and its estimated cold TTFT alone ({ests}, scaled "
                f"linearly from shorter prompts) is more than {CLEAR_OF_ESTIMATE:g}x {measured}'s whole turn, so "
                f"{measured} is faster there"
            )
        if floors:
            return clause + f"; {other} was too slow to measure there (estimated cold TTFT {ests})"
        return clause + f"; {other} has no measurement there"
    return None


def _band_held(pair: PairResult, band: tuple[int, int], beyond: str | None) -> str | None:
    """The verdict when a side's placement cannot hold prompts up to the band's end: what the measurements
    say over the lengths both hold, then who can serve the band at all."""
    lo_b, hi_b = band
    limited = [
        (x, m) for x, m in ((pair.a, pair.max_prompt_a), (pair.b, pair.max_prompt_b)) if m is not None and m < hi_b
    ]
    if not limited:
        return None
    s, claim = sides(pair), claimed_crossing(pair)
    span = f"{lengths_span(pair)}, {pair.response}-token responses"
    if pair.in_rounds:
        span += f", {pair.rounds_told()} of fresh servers"
    if not s.clear:
        within = f"{_noise(pair, 'of each other')} at every length both hold ({span})"
    elif not s.changes:
        if s.ties:  # name where they do not differ, as the verdict over shared lengths does
            within = (
                f"{s.clear[0][1]} is faster at every length both hold where they differ "
                f"({span}{tie_note(pair, s.ties, _noise(pair))})"
            )
        else:
            within = f"{s.clear[0][1]} is faster at every length both hold ({span})"
    elif claim is None:
        within = f"no consistent winner over the lengths both hold ({span})"
    else:
        ci = f"95% CI {_k(pair.ci[0])}-{_k(pair.ci[1])}; " if pair.ci else ""
        within = (
            f"{s.clear[0][1]} is faster below ~{_k(claim.length)} tokens and {s.clear[-1][1]} above "
            f"({ci}{pair.response}-token responses)"
        )
    head = f"{pair.a} vs {pair.b}: {within}"

    def reach(m: int | None) -> int:
        return hi_b if m is None else min(m, hi_b)

    def holds(m: int | None) -> str:
        return "all of it" if m is None or m >= hi_b else ("none of it" if m < lo_b else f"it up to {_k(m)}")

    ra, rb = reach(pair.max_prompt_a), reach(pair.max_prompt_b)
    if beyond is not None:
        head += f"; {beyond}"
    sentence = (
        f"{head}; of the agentic band ({_k(lo_b)}-{_k(hi_b)} tokens) {pair.a}'s placement holds "
        f"{holds(pair.max_prompt_a)} and {pair.b}'s {holds(pair.max_prompt_b)}"
    )
    if ra != rb:
        better, worse_reach = (pair.a, rb) if ra > rb else (pair.b, ra)
        sentence += (
            f", so agentic turns need {better}"
            if worse_reach < lo_b
            else f", so turns past {_k(worse_reach)} tokens need {better}"
        )
    elif ra < lo_b:
        sentence += ": neither serves agentic turns"
    if max(ra, rb) < hi_b:
        sentence += f"; turns past {_k(max(ra, rb))} tokens need a placement for a longer context"
    return sentence + "."


def _verdict(pair: PairResult, band: tuple[int, int], told_beyond: bool) -> str:
    """The verdict over the shared lengths; ``told_beyond``: :func:`beyond_shared` is appended after it, so the
    data stopping short of the band is not said twice."""
    head = f"{pair.a} vs {pair.b}: "
    lo_b, hi_b = band
    s = sides(pair)
    span = f"{lengths_span(pair)}, {pair.response}-token responses"
    if not s.clear:
        gap = max(abs(x - y) / min(x, y) for x, y in zip(pair.total_a, pair.total_b))
        if pair.too_few_rounds:
            return head + (
                f"not yet compared ({span}; {pair.rounds_told()} of fresh servers, fewer than the {MIN_ROUNDS} a "
                f"verdict needs; medians differ by at most {gap:.0%})."
            )
        if pair.short_at:  # some lengths over enough rounds, some not: no "either serves"
            settled, unset = split_short(pair)
            return head + (
                f"indistinguishable here at {settled} and not yet compared at {unset} ({span}; "
                f"{pair.rounds_told()} of fresh servers, fewer than the {MIN_ROUNDS} a verdict needs at {unset}; "
                f"medians differ by at most {gap:.0%})."
            )
        rule = (
            f"indistinguishable here at every measured length ({span}; over {pair.rounds_told()} of fresh servers "
            "the 95% interval of their ratio includes 1"
            if pair.in_rounds
            else f"within noise of each other at every measured length ({span}; sample ranges overlap"
        )
        # "either serves the band" only where the shared lengths reach it; otherwise the lengths past them say
        band_note = (
            f": either serves agentic turns of {_k(lo_b)}-{_k(hi_b)} tokens"
            if pair.lengths[-1] >= lo_b or not told_beyond
            else ""
        )
        return head + f"{rule}, medians differ by at most {gap:.0%}){band_note}{fitted_outside(pair)}."
    winners = [w for _, w in s.clear]
    ties = [_k(pair.lengths[i]) for i in s.ties]
    ties_told = tie_note(pair, s.ties, _noise(pair))
    if pair.in_rounds:
        span += f", {pair.rounds_told()} of fresh servers"
    claim = claimed_crossing(pair)
    if not s.changes:
        winner = winners[0]
        where = "every measured length" if not ties else "every length where they differ"
        sentence = head + f"{winner} is faster at {where} ({span}{ties_told})"
        if claim is not None:
            tag = "extrapolated" if claim.extrapolated else "fitted"
            sentence += f"; the fitted cost model puts a crossover at ~{_k(claim.length)} tokens ({tag})"
            other = pair.b if winner == pair.a else pair.a
            if pair.lengths[-1] < claim.length < hi_b:
                # The fit says the order flips past the data, before the band's end: the measurements alone
                # cannot answer for the band, so say so instead of naming the measured winner.
                part = "the whole agentic band" if claim.length <= lo_b else "part of the agentic band"
                return sentence + (
                    f", past which {other} would be faster: {part} ({_k(lo_b)}-{_k(hi_b)} tokens) lies "
                    f"beyond both the measured lengths and that crossing, so measure prompts up to "
                    f"{_k(hi_b)} tokens before choosing (measured, {winner} wins)."
                )
        if pair.lengths[-1] < lo_b and told_beyond:  # one side alone was measured further: that is told next
            return sentence + "."
        if pair.lengths[-1] < lo_b:  # the data stop short of the band: say so instead of extrapolating silently
            return sentence + (
                f"; the agentic band ({_k(lo_b)}-{_k(hi_b)} tokens) lies beyond the longest measured "
                f"prompt ({_k(pair.lengths[-1])}), so {winner} wins there only if the order holds: "
                f"measure up to {_k(hi_b)} tokens to know."
            )
        return sentence + f", so agentic turns of {_k(lo_b)}-{_k(hi_b)} tokens are best served by {winner}."
    if claim is None:
        runs = ", ".join(f"{w} at {_k(pair.lengths[i])}" for i, w in s.clear)
        return (
            head + f"no consistent winner ({runs}{ties_told}; {pair.response}-token responses): the order flips more "
            "than once, so neither is preferred."
        )
    x = claim.length
    short, long_ = winners[0], winners[-1]
    ci = f"95% CI {_k(pair.ci[0])}-{_k(pair.ci[1])}; " if pair.ci else ""
    if hi_b <= x:
        where = f"the whole agentic band ({_k(lo_b)}-{_k(hi_b)}) lies below it, so {short} wins agentic turns"
    elif lo_b >= x:
        where = f"the whole agentic band ({_k(lo_b)}-{_k(hi_b)}) lies above it, so {long_} wins agentic turns"
    else:
        where = f"it falls inside the agentic band ({_k(lo_b)}-{_k(hi_b)}): {short} wins turns below it, {long_} above"
    return head + (
        f"{short} is faster below ~{_k(x)} tokens and {long_} above ({ci}{pair.response}-token responses{ties_told}); "
        f"{where}."
    )


def relation(pair: PairResult) -> str:
    """A short cell for a configurations matrix, read as A (the row) against B (the column), under the
    same rules as :func:`verdict`: ``faster``, ``slower``, ``within noise``, ``not yet compared`` (too few rounds),
    ``faster below ~8,000``
    (then slower), ``slower below ~8,000`` or ``no consistent winner``; lengths within noise are named."""
    s = sides(pair)
    if not s.clear:
        if pair.too_few_rounds:
            return "not yet compared"
        if pair.short_at:
            return f"indistinguishable (not yet compared at {split_short(pair)[1]})"
        return "indistinguishable" if pair.in_rounds else "within noise"
    tie_word = "indistinguishable at" if pair.in_rounds else "noise at"
    told = tie_note(pair, s.ties, tie_word.removesuffix(" at"))
    ties = f" ({told.removeprefix('; ').replace('; ', ', ')})" if told else ""
    claim = claimed_crossing(pair)
    if not s.changes:
        word = "faster" if s.clear[0][1] == pair.a else "slower"
        fit = (
            f"; fit crosses ~{_k(claim.length)}{' (extrapolated)' if claim.extrapolated else ''}"
            if claim is not None
            else ""
        )
        return word + ties + fit
    if claim is None:
        return "no consistent winner" + ties
    word = "faster" if s.clear[0][1] == pair.a else "slower"
    return f"{word} below ~{_k(claim.length)}, {'slower' if word == 'faster' else 'faster'} above" + ties


_OTHER_SIDE = {"a": "b", "b": "a"}


def swapped(pair: PairResult) -> PairResult:
    """The same comparison read from B's side: every field of A's (``a`` and those ending in ``_a``) exchanged
    with B's, ``separated`` negated and each round interval inverted (the crossings, their interval and the lengths
    are the pair's own)."""
    sides = {
        f.name: getattr(pair, f.name[:-1] + _OTHER_SIDE[f.name[-1]])
        for f in dataclasses.fields(pair)
        if f.name in _OTHER_SIDE or f.name[-2:] in ("_a", "_b")
    }
    intervals = tuple(None if i is None else i.inverted() for i in pair.intervals)
    return dataclasses.replace(pair, separated=tuple(-s for s in pair.separated), intervals=intervals, **sides)


@dataclasses.dataclass(frozen=True)
class Ranked:
    """One length's ranking, the one the lead line, "which to run" and a study's open questions all read: the
    configurations that measured it by median total (``order``), and each one after the fastest compared with it
    once by :func:`separation` (rounds of fresh processes where both were measured in rounds, overlapping ranges
    before rounds): ``ties``, those the noise cannot part from the fastest, and ``slower``, those called slower,
    each in median order (one the rounds call faster than the fastest by median is in neither); ``unsettled``, those
    that share fewer than :data:`~xover.analysis.rounds.MIN_ROUNDS` rounds with the fastest: too few to call them
    either (a 10x gap over 2 rounds is not "indistinguishable"), with ``shared``, the rounds each shares with it;
    ``intervals``, the round-paired interval of each pair measured in rounds (None: fewer than two shared rounds)."""

    order: tuple[str, ...]
    totals: Mapping[str, float]
    ties: tuple[str, ...] = ()
    slower: tuple[str, ...] = ()
    intervals: Mapping[str, RatioInterval | None] = dataclasses.field(default_factory=dict)
    unsettled: tuple[str, ...] = ()
    shared: Mapping[str, int] = dataclasses.field(default_factory=dict)

    @property
    def best(self) -> str:
        return self.order[0]


def rank(configs: Sequence[ConfigData], response: int) -> dict[int, Ranked]:
    """Per length any of ``configs`` measured: its :class:`Ranked`."""
    totals = {c.label: measured_totals(c, response) for c in configs}
    by_label = {c.label: c for c in configs}
    out: dict[int, Ranked] = {}
    for L in sorted({n for t in totals.values() for n in t}):
        order = tuple(sorted((label for label in totals if L in totals[label]), key=lambda label: totals[label][L]))
        best = by_label[order[0]]
        called = {x: separation(best, by_label[x], L, response) for x in order[1:]}
        intervals = {
            x: round_interval(best, by_label[x], L, response)
            for x in order[1:]
            if best.rounds.get(L) and by_label[x].rounds.get(L)
        }
        short = {x for x, i in intervals.items() if called[x] == 0 and too_few(i)}
        out[L] = Ranked(
            order,
            {x: totals[x][L] for x in order},
            tuple(x for x in order[1:] if called[x] == 0 and x not in short),
            tuple(x for x in order[1:] if called[x] == -1),
            intervals,
            tuple(x for x in order[1:] if x in short),
            {x: len(set(best.rounds.get(L, {})) & set(by_label[x].rounds.get(L, {}))) for x in short},
        )
    return out


@dataclasses.dataclass(frozen=True)
class Winner:
    """The answer at one length: the fastest configuration; ``ties``, every other one the noise cannot part from it
    (each compared with the fastest, not only the next by median: a third can be within the noise of the first where
    the second is clearly slower); ``alone``, where no other configuration measured the length (its placement alone
    holds it); ``unsettled``, those with too few rounds beside the fastest to call either way (:class:`Ranked`). A
    tie has no order: ``best`` and ``ties`` are then in alphabetical order."""

    best: str
    ties: tuple[str, ...] = ()
    alone: bool = False
    unsettled: tuple[str, ...] = ()


def winners(configs: Sequence[ConfigData], response: int) -> dict[int, Winner]:
    """Per length any of ``configs`` measured, from its ranking (:func:`rank`): the fastest, with every other
    configuration whose difference from it is within the noise."""
    out: dict[int, Winner] = {}
    for L, r in rank(configs, response).items():
        if len(r.order) == 1:
            out[L] = Winner(r.best, alone=True)
        elif r.ties:
            first, *rest = sorted([r.best, *r.ties])  # the same set reads the same at every length
            out[L] = Winner(first, tuple(rest), unsettled=tuple(sorted(r.unsettled)))
        else:
            out[L] = Winner(r.best, unsettled=tuple(sorted(r.unsettled)))
    return out


def fastest(configs: Sequence[ConfigData], response: int) -> str | None:
    """The fastest configuration at each length every configuration measured, from its ranking (:func:`rank`), for
    studies of three or more. The fastest is named alone only where it is clearly faster than every other;
    otherwise it is told with every one the noise cannot part from it, and a configuration between them by median
    that is called slower is named as such."""
    if len(configs) < 3:
        return None
    ranking = rank(configs, response)
    lengths = [L for L, r in ranking.items() if len(r.order) == len(configs)]
    if not lengths:
        return None
    parts = []
    for L in lengths:
        r = ranking[L]
        best, totals = r.best, r.totals
        if r.ties:  # every configuration the noise cannot part from the fastest, in the order of their medians
            ns = sorted({i.n for x in r.ties if (i := r.intervals.get(x)) is not None})
            n = "too few rounds" if not ns else f"{ns[0]} rounds" if len(ns) == 1 else f"{ns[0]}-{ns[-1]} rounds"
            before = [x for x in r.ties if x not in r.intervals]  # measured before rounds: their ranges overlap
            told = [n] if len(before) < len(r.ties) else []
            if before:
                told.append(f"{', '.join(before)} measured in one process: overlapping ranges")
            n = "; ".join(told)
            who = " and ".join([", ".join([best, *r.ties[:-1]]), r.ties[-1]])
            ts = [f"{totals[t]:.2f}" for t in [best, *r.ties]]
            against = f"{ts[0]} s against {ts[1]} s" if len(ts) == 2 else f"{', '.join(ts[:-1])} and {ts[-1]} s"
            # a configuration between them by median that is called slower than the fastest (the noise differs
            # pair by pair): named, or the reader takes it for one of the tied
            between = [x for x in r.slower if totals[x] < totals[r.ties[-1]]]
            called = "".join(f"; {x}, at {totals[x]:.2f} s, is slower than {best}" for x in between)
            parts.append(f"{_k(L)} {who} indistinguishable here ({against}, {n}{called}{_unsettled(r)})")
            continue
        second = next((x for x in r.order[1:] if x not in r.unsettled), None)
        after = f"; next {second}, {totals[second] / totals[best]:.2f}x" if second is not None else ""
        lead = best if second is not None else f"{best} leads by median"  # compared with none of the others yet
        parts.append(f"{_k(L)} {lead} ({totals[best]:.2f} s{after}{_unsettled(r)})")
    return f"Fastest total time per turn ({response}-token responses): " + "; ".join(parts) + "."


def _unsettled(r: Ranked) -> str:
    """``; not yet compared with vk-gpu tuned (2 rounds shared, 3 needed): vk-cpu6 tuned at 8.87 s``: the
    configurations of a ranking with too few rounds beside the fastest to be called tied or slower, by rounds."""
    by_n: dict[int, list[str]] = {}
    for x in r.unsettled:
        by_n.setdefault(r.shared.get(x, 0), []).append(f"{x} at {r.totals[x]:.2f} s")
    return "".join(
        f"; not yet compared with {r.best} ({n} round{'s' if n != 1 else ''} shared, {MIN_ROUNDS} needed): "
        + ", ".join(who)
        for n, who in sorted(by_n.items())
    )


def open_questions(
    configs: Sequence[ConfigData],
    pairs: Sequence[tuple[str, str]],
    response: int,
    compared: Sequence[tuple[str, str]] = (),
) -> dict[str, set[int]]:
    """The configurations a decision still waits on, each with the prompt lengths it waits on: both sides of a pair
    whose ratio's interval straddles 1 at a length both measured in rounds, and, with three or more configurations,
    the fastest and every other not yet separated from it at a length (not only the next by median: a third can be
    within the noise of the fastest where the second is called slower). ``compared``: pairs the report also tells
    (a configuration against its tuned variant) whose rounds are only made up to the
    :data:`~xover.analysis.rounds.MIN_ROUNDS` shared rounds a verdict needs: "not yet compared" is settled by more
    rounds, "indistinguishable" is an answer. Configurations measured before rounds open no question."""
    by_label = {c.label: c for c in configs}
    out: dict[str, set[int]] = {}

    def add(names: tuple[str, ...], length: int) -> None:
        for name in names:
            out.setdefault(name, set()).add(length)

    def undecided(a: ConfigData, b: ConfigData, length: int) -> bool:
        if not (a.rounds.get(length) and b.rounds.get(length)):
            return False
        r = round_interval(a, b, length, response)
        return r is None or not r.decided

    def uncompared(a: ConfigData, b: ConfigData, length: int) -> bool:
        return too_few_rounds(a, b, length, response)

    for told, still_open in ((pairs, undecided), (compared, uncompared)):
        for x, y in told:
            a, b = by_label.get(x), by_label.get(y)
            if a is not None and b is not None:
                for L in set(a.rounds) & set(b.rounds):
                    if still_open(a, b, L):
                        add((x, y), L)
    if len(configs) >= 3:  # the lead line's ranking (crossover.rank): the fastest and each one tied with it
        for L, r in rank(configs, response).items():
            if len(r.order) == len(configs):
                for other in (*r.ties, *r.unsettled):  # every one the lead line names beside the fastest
                    if other in r.intervals:  # both in rounds: more rounds can settle it
                        add((r.best, other), L)
    return out
