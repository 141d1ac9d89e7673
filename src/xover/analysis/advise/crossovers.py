"""The crossover between offload levels revisited: at llama.cpp's defaults and with each level's
recommended settings (:mod:`xover.analysis.crossover` on advise's measurements). Pure."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence

from xover.analysis.advise.objective import Measurement, ttft_s
from xover.analysis.crossover import ConfigData, PairResult, compare_pair


def config_data(label: str, m: Measurement, lengths: Sequence[int]) -> ConfigData:
    """A measurement as :mod:`xover.analysis.crossover` input: TTFT samples (one per repetition, from
    the prefill integral) at ``lengths``, decode samples at the measured depths."""
    ttft = {
        L: [ttft_s([(r.depth, r.tokens, r.samples_tps[i]) for r in m.prefill], L) for i in range(m.repetitions)]
        for L in lengths
    }
    return ConfigData(label, ttft, {r.depth: list(r.samples_tps) for r in m.decode})


@dataclasses.dataclass(frozen=True)
class RevisitedPair:
    a: str  # configuration labels
    b: str
    at_defaults: PairResult
    with_knobs: PairResult  # each level with its own recommended settings


def revisit_crossovers(
    levels: Sequence[tuple[str, Measurement, Measurement]], lengths: Sequence[int], response: int, n_boot: int = 200
) -> tuple[RevisitedPair, ...]:
    """Each pair of offload levels' crossover at llama.cpp's defaults and with the recommended settings.
    ``levels``: (label, defaults' measurement, recommended's measurement)."""
    out = []
    for (la, da, ra), (lb, db, rb) in itertools.combinations(levels, 2):
        out.append(
            RevisitedPair(
                la,
                lb,
                compare_pair(config_data(la, da, lengths), config_data(lb, db, lengths), response, n_boot=n_boot),
                compare_pair(config_data(la, ra, lengths), config_data(lb, rb, lengths), response, n_boot=n_boot),
            )
        )
    return tuple(out)
