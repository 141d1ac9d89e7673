"""What crosses the link to RPC workers for a layer split, and the least time that takes. Pure.

llama.cpp with ``--rpc`` and ``-ngl N`` keeps the token embedding and the first ``n_layer - N`` layers on the
host and puts the last ``N`` layers (and, with ``N > n_layer``, the output layer) on the workers' devices, each
worker one contiguous range of layers. ``ggml_backend_sched`` then runs every ubatch as splits: at each boundary
between the host and a worker range the hidden state (``n_tokens x n_embd`` F32 activations) is sent to the
worker (``SET_TENSOR``, no reply), the range is computed there (``GRAPH_COMPUTE``, no reply) and the result is
read back (``GET_TENSOR``: the host waits for its reply). Two workers never copy to each other directly (the
backend copies between different servers through the host), so every worker range costs, per ubatch, at least

* one round trip (the read-back is a request answered after the range has been computed),
* ``n_tokens x n_embd x 4`` bytes towards the worker, and
* the same back, or, for the range that ends with the output layer, ``n_outputs x n_vocab x 4`` bytes of logits.

This is a lower bound: it leaves out the other inputs the worker's layers read (positions, the KQ mask, which
grows with the context), the serialized graph (``GRAPH_COMPUTE`` sends every node's description unless the graph
is reused), the worker's compute, and any time lost when host and link do not overlap (they cannot within a
ubatch: each split waits for the previous). A measured speed above the limit means an assumption here does not
hold for that run.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from statistics import median

from xover.analysis.theory import ModelTerms

ACTIVATION_BYTES = 4  # F32 hidden state between backends

ASSUMPTIONS = (
    "the last -ngl layers (and the output layer when -ngl exceeds the layer count) run on the workers, one "
    "contiguous range per worker (fewer when fewer layers than workers are offloaded)",
    "per ubatch and worker range: one round trip, the F32 hidden state (tokens x n_embd x 4 bytes) each way, "
    "or the logits of the outputs (n_vocab x 4 bytes each) back from the range that holds the output layer",
    "not counted (so the time is a lower bound): positions, KQ mask, graph descriptions, the workers' compute, "
    "host compute",
    "prefill outputs one token's logits (the last ubatch), decode one per token",
)


@dataclasses.dataclass(frozen=True)
class LinkModel:
    """The three model figures the link needs."""

    n_layer: int
    n_embd: int
    n_vocab: int

    @classmethod
    def from_terms(cls, terms: ModelTerms) -> LinkModel:
        return cls(terms.n_layer, terms.n_embd, terms.n_vocab)


@dataclasses.dataclass(frozen=True)
class Link:
    """A measured link: round-trip time and bandwidth towards the worker (up) and back (down)."""

    rtt_s: float
    up_bytes_s: float
    down_bytes_s: float

    @classmethod
    def from_probe(cls, rtt_ms: Sequence[float], up_mib_s: Sequence[float], down_mib_s: Sequence[float]) -> Link:
        """The medians of a probe's samples (milliseconds, MiB/s)."""
        mib = 1 << 20
        return cls(median(rtt_ms) / 1e3, median(up_mib_s) * mib, median(down_mib_s) * mib)


@dataclasses.dataclass(frozen=True)
class Traffic:
    """What crosses the link for one ubatch: round trips and bytes each way."""

    round_trips: int
    up_bytes: int
    down_bytes: int

    def time_s(self, link: Link) -> float:
        """The least time this traffic takes on ``link``: round trips x RTT + bytes / bandwidth each way."""
        return self.round_trips * link.rtt_s + self.up_bytes / link.up_bytes_s + self.down_bytes / link.down_bytes_s


def worker_ranges(model: LinkModel, n_gpu_layers: int, n_workers: int) -> int:
    """How many contiguous layer ranges run on workers: one per worker that gets at least one layer."""
    offloaded = min(max(n_gpu_layers, 0), model.n_layer)
    return min(offloaded, max(n_workers, 0))


def ubatch_traffic(model: LinkModel, n_gpu_layers: int, n_workers: int, n_tokens: int, n_outputs: int) -> Traffic:
    """Least traffic of one ubatch of ``n_tokens`` tokens of which ``n_outputs`` produce logits."""
    r = worker_ranges(model, n_gpu_layers, n_workers)
    if r == 0:
        return Traffic(0, 0, 0)
    hidden = n_tokens * model.n_embd * ACTIVATION_BYTES
    if n_gpu_layers > model.n_layer:  # the last range ends with the output layer: logits come back, not the state
        last = n_outputs * model.n_vocab * ACTIVATION_BYTES
        return Traffic(r - 1 + (1 if last else 0), r * hidden, (r - 1) * hidden + last)
    return Traffic(r, r * hidden, r * hidden)


def decode_limit_tps(model: LinkModel, n_gpu_layers: int, n_workers: int, link: Link) -> float | None:
    """The most tokens per second decode can reach through the link alone (None: nothing crosses it)."""
    t = ubatch_traffic(model, n_gpu_layers, n_workers, 1, 1).time_s(link)
    return 1.0 / t if t > 0 else None


def prefill_link_s(
    model: LinkModel, n_gpu_layers: int, n_workers: int, n_prompt: int, n_ubatch: int, link: Link
) -> float:
    """The least link time of a prefill of ``n_prompt`` tokens in ubatches of ``n_ubatch`` (the last one partial
    and the only one with an output)."""
    n_ub = max(1, math.ceil(n_prompt / max(1, n_ubatch)))
    total = 0.0
    for i in range(n_ub):
        n = min(n_ubatch, n_prompt - i * n_ubatch)
        total += ubatch_traffic(model, n_gpu_layers, n_workers, n, 1 if i == n_ub - 1 else 0).time_s(link)
    return total


def prefill_limit_tps(
    model: LinkModel, n_gpu_layers: int, n_workers: int, n_prompt: int, n_ubatch: int, link: Link
) -> float | None:
    """The most prompt tokens per second prefill can reach through the link alone (None: nothing crosses it)."""
    t = prefill_link_s(model, n_gpu_layers, n_workers, n_prompt, n_ubatch, link)
    return n_prompt / t if t > 0 else None
