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

Experts placed on a worker (``--override-tensor "blk\\.[0-9]\\.ffn_.*_exps=RPC0[host:port]"``, the layers themselves
here) cross the link once per such layer and ubatch: the layer's input (``n_tokens x n_embd`` F32) and its router's
choice (``n_tokens x n_expert_used`` expert ids, I32, and their weights, F32) go to the worker, which runs the
experts (``MUL_MAT_ID``: weights in an RPC buffer are not host memory, so op offload never copies them to a local
GPU), and the weighted sum (``n_tokens x n_embd`` F32) comes back before the next layer can start: one round trip
per layer. Decode then pays ``n_layers_on_worker`` round trips per token, where a layer split pays one per range.

This is a lower bound: it leaves out the other inputs the worker's layers read (positions, the KQ mask, which
grows with the context), the serialized graph (``GRAPH_COMPUTE`` sends every node's description unless the graph
is reused), the worker's compute, and any time lost when host and link do not overlap (they cannot within a
ubatch: each split waits for the previous). A measured speed above the limit means an assumption here does not
hold for that run.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from statistics import median

from xover.analysis.theory import ModelTerms

ACTIVATION_BYTES = 4  # F32 hidden state between backends

ASSUMPTIONS = (
    "a layer split: the -ngl layers on the workers form one contiguous range per worker (fewer when fewer layers "
    "than workers are offloaded); the output layer is on a worker only when -ngl exceeds the layer count and this "
    "host has no GPU of its own (llama.cpp puts RPC devices first and the output on the last device)",
    "experts on a worker (-ot ...=RPC<d>[host:port]): per such layer and ubatch one round trip, the layer's input "
    "and the router's ids and weights (n_expert_used x 8 bytes per token) up, the weighted sum back (the weighting "
    "done on the worker: doing it here would bring n_expert_used states back instead of one)",
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
    n_expert_used: int = 0  # experts each token is routed to (0: a dense model)

    @classmethod
    def from_terms(cls, terms: ModelTerms) -> LinkModel:
        return cls(terms.n_layer, terms.n_embd, terms.n_vocab, terms.n_expert_used)


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

    def __add__(self, other: Traffic) -> Traffic:
        return Traffic(
            self.round_trips + other.round_trips, self.up_bytes + other.up_bytes, self.down_bytes + other.down_bytes
        )

    def time_s(self, link: Link) -> float:
        """The least time this traffic takes on ``link``: round trips x RTT + bytes / bandwidth each way."""
        return self.round_trips * link.rtt_s + self.up_bytes / link.up_bytes_s + self.down_bytes / link.down_bytes_s


@dataclasses.dataclass(frozen=True)
class Placement:
    """What of the model runs on the RPC workers: a layer split (the ``n_gpu_layers`` offloaded layers over the
    ``n_workers`` workers' devices) and ``expert_layers`` layers run here whose experts are on a worker
    (``-ot ...=RPC<d>[host:port]``); ``local_gpu``: this host has a GPU of its own, which takes the output layer."""

    n_gpu_layers: int
    n_workers: int
    expert_layers: int = 0
    local_gpu: bool = False


def worker_ranges(model: LinkModel, placement: Placement) -> int:
    """How many contiguous layer ranges run on workers: one per worker that gets at least one layer."""
    offloaded = min(max(placement.n_gpu_layers, 0), model.n_layer)
    return min(offloaded, max(placement.n_workers, 0))


def ubatch_traffic(model: LinkModel, placement: Placement, n_tokens: int, n_outputs: int) -> Traffic:
    """Least traffic of one ubatch of ``n_tokens`` tokens of which ``n_outputs`` produce logits: the layer
    split's plus that of the layers whose experts are on a worker."""
    experts = expert_traffic(model, placement.expert_layers, n_tokens)
    r = worker_ranges(model, placement)
    if r == 0:
        return experts
    hidden = n_tokens * model.n_embd * ACTIVATION_BYTES
    if placement.n_gpu_layers > model.n_layer and not placement.local_gpu:  # the last range ends with the output
        last = n_outputs * model.n_vocab * ACTIVATION_BYTES  # layer: logits come back, not the state
        return experts + Traffic(r - 1 + (1 if last else 0), r * hidden, (r - 1) * hidden + last)
    return experts + Traffic(r, r * hidden, r * hidden)


def expert_traffic(model: LinkModel, expert_layers: int, n_tokens: int) -> Traffic:
    """Least traffic of one ubatch through ``expert_layers`` layers whose experts are on a worker: per layer one
    round trip, the input state and the router's ids and weights up, the weighted sum back."""
    if expert_layers <= 0 or n_tokens <= 0:
        return Traffic(0, 0, 0)
    up = n_tokens * (model.n_embd + 2 * model.n_expert_used) * ACTIVATION_BYTES
    down = n_tokens * model.n_embd * ACTIVATION_BYTES
    return Traffic(expert_layers, expert_layers * up, expert_layers * down)


def expert_layers_on_workers(overrides: str, n_layer: int) -> int:
    """How many of ``n_layer`` layers have their routed experts in an RPC buffer under llama-bench's ``-ot``
    value (``<regex>=<buffer type>`` items joined by ``;``): the first item whose regex finds a layer's expert
    tensor decides where it goes, as in llama.cpp's loader."""
    items = []
    for item in overrides.split(";"):
        pattern, sep, buft = item.rpartition("=")
        if sep and pattern:
            items.append((re.compile(pattern), buft))
    count = 0
    for i in range(n_layer):
        names = [f"blk.{i}.ffn_{part}_exps.weight" for part in ("up", "gate", "down", "gate_up")]
        if any(next((b for rx, b in items if rx.search(n)), "").startswith("RPC") for n in names):
            count += 1
    return count


def decode_limit_tps(model: LinkModel, placement: Placement, link: Link) -> float | None:
    """The most tokens per second decode can reach through the link alone (None: nothing crosses it)."""
    t = ubatch_traffic(model, placement, 1, 1).time_s(link)
    return 1.0 / t if t > 0 else None


def prefill_link_s(model: LinkModel, placement: Placement, n_prompt: int, n_ubatch: int, link: Link) -> float:
    """The least link time of a prefill of ``n_prompt`` tokens in ubatches of ``n_ubatch`` (the last one partial
    and the only one with an output)."""
    n_ub = max(1, math.ceil(n_prompt / max(1, n_ubatch)))
    total = 0.0
    for i in range(n_ub):
        n = min(n_ubatch, n_prompt - i * n_ubatch)
        total += ubatch_traffic(model, placement, n, 1 if i == n_ub - 1 else 0).time_s(link)
    return total


def prefill_limit_tps(model: LinkModel, placement: Placement, n_prompt: int, n_ubatch: int, link: Link) -> float | None:
    """The most prompt tokens per second prefill can reach through the link alone (None: nothing crosses it)."""
    t = prefill_link_s(model, placement, n_prompt, n_ubatch, link)
    return n_prompt / t if t > 0 else None
