"""Blob against chat: does a prompt sent as an agent sends it cost what one token array of the same length costs? Pure.

The cold stage's prompts are token arrays on ``/completion`` (blobs). At one length per configuration each server also
sends a prompt of exactly that length as many chat messages (mode ``chat``, :mod:`xover.domain.chat_prompts`). Both
are cold and of the same token count on the same fresh server, so each round (server) gives one paired ratio, chat's
TTFT over the blob's, and the rounds give its interval (:func:`xover.analysis.rounds.paired_ratio`): a difference is
called only where the interval excludes 1.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping, Sequence

from xover.analysis.crossover import ConfigData
from xover.analysis.rounds import RatioInterval, paired_ratio, too_few
from xover.domain.units import format_tokens


@dataclasses.dataclass(frozen=True)
class ShapeEffect:
    """One configuration at one length: median cold TTFT of each shape (s) and chat's over the blob's by round."""

    config: str
    length: int
    blob_s: float
    chat_s: float
    interval: RatioInterval | None

    @property
    def differs(self) -> bool:
        return self.interval is not None and self.interval.decided

    def describe(self) -> str:
        """``fa=on at 16K: chat 1.08x the blob's TTFT (1.03-1.13, 3 rounds): slower as chat`` and the like."""
        head = f"{self.config} at {format_tokens(self.length)}"
        iv = self.interval
        if iv is None or too_few(iv):
            n = 0 if iv is None else iv.n
            return f"{head}: not yet compared ({n} shared round{'s' if n != 1 else ''})"
        span = f"chat {iv.ratio:.3f}x the blob's TTFT ({iv.low:.3f}-{iv.high:.3f}, {iv.n} rounds)"
        if not iv.decided:
            return f"{head}: {span}: indistinguishable here"
        return f"{head}: {span}: {'slower' if iv.sign > 0 else 'faster'} as chat"


def _round_ttft(data: ConfigData, length: int) -> dict[int, float]:
    return {r: ttft for r, (ttft, _) in data.rounds.get(length, {}).items()}


def shape_effects(cold: Sequence[ConfigData], chat: Sequence[ConfigData]) -> list[ShapeEffect]:
    """Per configuration measured both ways, per length it sent as chat: the two shapes compared round by round."""
    blobs = {c.label: c for c in cold}
    out = []
    for c in chat:
        b = blobs.get(c.label)
        for length in sorted(c.ttft_s):
            if b is None or not b.ttft_s.get(length):
                continue
            out.append(
                ShapeEffect(
                    c.label,
                    length,
                    statistics.median(b.ttft_s[length]),
                    statistics.median(c.ttft_s[length]),
                    paired_ratio(_round_ttft(c, length), _round_ttft(b, length)),
                )
            )
    return out


def pair_by_shape(
    a: str, b: str, cold: Mapping[str, ConfigData], chat: Mapping[str, ConfigData], length: int
) -> tuple[RatioInterval | None, RatioInterval | None]:
    """``b``'s cold TTFT over ``a``'s at ``length``, round by round, as blobs and as chat: whether the shape changes
    what one configuration costs against the other (an expert placement's prefill penalty, say)."""

    def ratio(data: Mapping[str, ConfigData]) -> RatioInterval | None:
        if a not in data or b not in data:
            return None
        return paired_ratio(_round_ttft(data[b], length), _round_ttft(data[a], length))

    return ratio(cold), ratio(chat)


def summary(effects: Sequence[ShapeEffect]) -> str:
    """One line for the report's section: whether any configuration's chat-shaped prompts differ beyond the noise."""
    compared = [e for e in effects if e.interval is not None and not too_few(e.interval)]
    if not compared:
        return "Chat-shaped prompts are not yet compared with blobs: fewer than 3 shared rounds."
    differ = [e for e in compared if e.differs]
    if not differ:
        return (
            "Chat-shaped prompts prefill like one blob of the same length here: every configuration's difference is "
            "within the noise between its servers, so the cold verdicts hold for what an agent sends."
        )
    ratios = [e.interval.ratio for e in differ if e.interval is not None]
    lo, hi = min(ratios), max(ratios)
    span = f"{lo:.2f}x" if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}-{hi:.2f}x"
    names = ", ".join(sorted({e.config for e in differ}))
    return (
        f"Chat-shaped prompts take {span} the blob's TTFT beyond the noise between servers ({names}): an agent's "
        "prompts of that length cost that much more (or less) than the cold verdicts' blobs, which the cold "
        "prompts' crossovers do not include."
    )
