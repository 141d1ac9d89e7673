"""Theory before measurement: arithmetic intensity, expert coverage, quadratic attention, rooflines,
VRAM placement and a stored, falsifiable prediction. Pure: no I/O; the hardware arrives as numbers.

**Model.** Everything derives from a :class:`ModelTerms` (built from a GGUF's tensor table) and a
:class:`~xover.domain.profiles.Hardware`. With a GPU, every layer is offloaded (``-ngl`` all) and
``--n-cpu-moe N`` keeps the expert tensors of the first N layers in host memory.

* **Decode** (one token at depth d): each part of the model costs ``max(FLOPs / FLOP/s, bytes / B/s)``
  on the device that holds it. GPU: the non-expert weights, ``k/E`` of the GPU-resident experts and the
  KV cache of d tokens; CPU: ``k/E`` of the CPU-resident experts (and one embedding row). Decode batches
  are 1 token, below op offload's minimum, so the CPU computes its experts.
* **Prefill** runs in ubatches of B tokens. Weights are read once per ubatch and shared by its B
  tokens; of the experts only those the ubatch routes to are read, a fraction ``1 - (1 - k/E)^B``
  under uniform routing. GPU parts cost ``max(FLOPs, bytes)`` each (dense weights, GPU experts,
  attention). CPU-resident experts, with op offload on and ``B >= GGML_OP_OFFLOAD_MIN_BATCH`` (32):
  llama.cpp copies **the experts the ubatch uses** (``ggml_backend_sched_compute_splits`` in
  ``ggml-backend.cpp`` reads the router's ids, copies each run of consecutive used experts, plus up to
  512 padding bytes after a run that does not end at the last expert) and computes them on the GPU:
  copy time at the host-to-device rate (pinned with ``-lm none`` / ``--no-mmap``, pageable with mmap)
  plus their GPU cost, serialised on one stream. Without op offload (or for smaller ubatches) the CPU
  computes them: ``max(FLOPs / CPU FLOP/s, touched bytes / CPU B/s)``.
* **Attention** of a ubatch ending at position e computes ``B x e`` scores per head and layer (llama.cpp
  evaluates the whole masked tile): ``2 n_layer n_head (d_k + d_v) B e`` FLOPs, i.e.
  ``4 n_layer n_head head_dim`` per query-key pair, and reads the ``e`` cached tokens' K and V.
* On a CPU-only machine every part runs on the CPU and ``--n-cpu-moe`` moves nothing.

The **prediction** evaluates this with the rates llama.cpp reaches (``quant_flops_per_s`` for GPU
matmuls); the **limit** (:func:`roofline_limit`) with the datasheet fp16 peak, an upper bound that a
measured number is shown against. Bandwidths are ceilings in both. Not modelled: kernel launch and
synchronisation overheads (large for batch-1 decode on fast GPUs), CUDA graphs, the activations sent
between CPU and GPU, embedding lookups in prefill (one host row per token), routing imbalance, thermal limits; every prediction lists its assumptions.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from xover.analysis.crossover import Crossing
from xover.domain import llama_options as opts
from xover.domain.config import LlamaConfig
from xover.domain.profiles import Hardware
from xover.domain.shapes import (
    Geometry,
    TensorTable,
    active_params,
    has_tied_embeddings,
    kv_bytes_per_token,
    kv_layer_bytes,
    kv_swa_bytes_per_cell,
    ncmoe_table,
    nextn_bytes,
    shared_expert_bytes,
    total_bytes,
)
from xover.errors import XoverError

OP_OFFLOAD_MIN_BATCH = 32  # GGML_OP_OFFLOAD_MIN_BATCH default (ggml-cuda.cu)
COPY_PADDING_BYTES = 512  # extra bytes copied after a run of used experts (ggml-backend.cpp)
CTX_PAD = 256  # llama.cpp rounds n_ctx up to a multiple of this (and the SWA cache's size)
MMQ_TYPES = frozenset(
    {
        "Q1_0",
        "Q2_0",
        "Q4_0",
        "Q4_1",
        "Q5_0",
        "Q5_1",
        "Q8_0",
        "Q2_K",
        "Q3_K",
        "Q4_K",
        "Q5_K",
        "Q6_K",
        "IQ1_S",
        "IQ2_XXS",
        "IQ2_XS",
        "IQ2_S",
        "IQ3_XXS",
        "IQ3_S",
        "IQ4_XS",
        "IQ4_NL",
        "MXFP4",
        "NVFP4",
    }
)
"""ggml types with an MMQ kernel (``ggml_cuda_should_use_mmq``, ggml-cuda/mmq.cu); F16/BF16/F32 go to cuBLAS."""
MMQ_ROWS = 128  # mmq.cu: ``fallback = ne01 % 128 != 0`` picks the reduced tile set
F32 = 4

# --------------------------------------------------------------------------------------------------
# model terms


@dataclasses.dataclass(frozen=True)
class ModelTerms(Geometry):
    """What the theory needs from a model, derived once from its tensor table: its geometry, and the terms below.

    ``dense_*`` is everything but the expert tensors: ``dense_params`` counts the matmul parameters a
    token uses (output projection included, embedding lookup excluded); ``dense_gpu_bytes`` the
    non-expert weights on the GPU (``token_embd`` stays in host memory; with tied embeddings its
    output copy is on the GPU). Expert figures are per layer and cover all experts of the layer.
    """

    ffn_width: int  # per token: n_expert_used x n_ff_exp for MoE, n_ff for dense
    dense_params: int
    dense_gpu_bytes: int
    embd_row_bytes: int
    total_bytes: int
    expert_params_layer: tuple[int, ...]
    expert_bytes_layer: tuple[int, ...]
    expert_copy_tensors_layer: tuple[tuple[int, ...], ...]  # bytes of each 3-D expert tensor, copied by expert
    kv_bytes_per_token: int  # full-attention layers only: the part of the cache that grows with the context
    # Per-architecture terms (defaults: a plain transformer, qwen3 / qwen3moe)
    n_layer_swa: int = 0  # sliding-window layers (gpt-oss: every other one): they attend to at most the window
    swa_window: int = 0
    kv_swa_bytes_per_cell: int = 0  # the SWA layers' cache per cell, summed over them
    is_mla: bool = False  # MLA (deepseek2): one compressed K row per token, V a view of it
    nextn_bytes: int = 0  # NextN/MTP blocks: in the file (total_bytes), never loaded
    shared_expert_bytes: int = 0  # ffn_*_shexp: in dense_gpu_bytes, always read, never moved by --n-cpu-moe
    dense_ffn_layers: int = 0  # leading dense-FFN layers of a MoE model: no experts to move
    expert_mmq: bool = True  # the routed experts' type has an MMQ kernel (quantized types, MXFP4): tiles pad
    expert_mmq_fallback: bool = False  # expert rows not a multiple of 128: MMQ's reduced tile set (gpt-oss's 2880)

    @property
    def n_layer_full(self) -> int:
        """Layers whose attention spans the whole context (all but the sliding-window ones)."""
        return self.n_layer - self.n_layer_swa

    def swa_keys(self, queries: int, end: float) -> float:
        """Keys a sliding-window layer evaluates for ``queries`` tokens ending at position ``end``: the SWA
        cache holds at most the window plus the ubatch (``llama-kv-cache-iswa.cpp``), so ``min(end, W + B)``."""
        return min(end, self.swa_window + queries)

    def swa_cells(self, n_ctx: int, ubatch: int) -> int:
        """Cells of the SWA cache llama.cpp allocates (one sequence, unified):
        ``GGML_PAD(min(n_ctx, n_swa + n_ubatch), 256)``, as :func:`xover.domain.shapes.kv_swa_cells`."""
        if not self.n_layer_swa:
            return 0
        return -(-min(n_ctx, self.swa_window + ubatch) // CTX_PAD) * CTX_PAD

    def with_cache_types(self, cache_type_k: str = "F16", cache_type_v: str | None = None) -> ModelTerms:
        """These terms with the KV cache stored as ``-ctk cache_type_k -ctv cache_type_v`` (V as K when None):
        a smaller cache type frees VRAM that a budget's placement gives to experts. Its quality cost is not
        something xover measures."""
        per_layer = kv_layer_bytes(self, self.is_mla, cache_type_k, cache_type_v)
        if per_layer is None:
            raise XoverError(
                f"a KV cache of type {cache_type_k}/{cache_type_v or cache_type_k} does not fit this model's head "
                "size: use f16 or q8_0"
            )
        return dataclasses.replace(
            self, kv_bytes_per_token=self.n_layer_full * per_layer, kv_swa_bytes_per_cell=self.n_layer_swa * per_layer
        )

    def kv_cache_bytes(self, n_ctx: int, ubatch: int = 512) -> int:
        """KV buffer bytes at a (padded) context of ``n_ctx`` cells: the full-attention cache grows with it, the
        SWA cache stops at :meth:`swa_cells` (iSWA: two caches)."""
        return self.kv_bytes_per_token * n_ctx + self.kv_swa_bytes_per_cell * self.swa_cells(n_ctx, ubatch)

    def kv_read_bytes(self, queries: int, end: int) -> int:
        """KV bytes ``queries`` tokens ending at ``end`` read: every cached token of the full-attention
        layers, at most :meth:`swa_keys` of the sliding-window layers."""
        out = self.kv_bytes_per_token * end
        if self.n_layer_swa:
            out += self.kv_swa_bytes_per_cell * min(end, self.swa_window + queries)
        return out

    @property
    def active_fraction(self) -> float:
        """``k / E``: the share of each layer's experts one token uses (1 for dense models)."""
        return self.n_expert_used / self.n_expert if self.n_expert else 1.0

    def gpu_weight_bytes(self, n_cpu_moe: int) -> int:
        """Weights on the GPU under ``--n-cpu-moe N`` with every layer offloaded."""
        return self.dense_gpu_bytes + sum(self.expert_bytes_layer[n_cpu_moe:])


def model_terms(table: TensorTable, cache_type: str = "F16") -> ModelTerms:
    """The :class:`ModelTerms` of a tensor table; ``cache_type`` is the KV cache's ggml type."""
    hp = table.hparams
    kv = kv_bytes_per_token(hp, cache_type)
    if kv is None:
        raise XoverError(f"a KV cache of type {cache_type} does not fit this model's head size: use F16 or Q8_0")
    params_layer = [0] * hp.n_layer
    bytes_layer = [0] * hp.n_layer
    copy_layer: list[list[int]] = [[] for _ in range(hp.n_layer)]
    for t in table.tensors:
        if t.is_expert and t.layer is not None and t.layer < hp.n_layer:
            params_layer[t.layer] += t.n_elements
            bytes_layer[t.layer] += t.nbytes
            if len(t.ne) == 3:
                copy_layer[t.layer].append(t.nbytes)
    embd = table.get("token_embd.weight")
    tied = has_tied_embeddings(table)
    dense_params = active_params(table, "none") - (
        sum(params_layer) * hp.n_expert_used // hp.n_expert if hp.n_expert else 0
    )
    if tied and embd is not None:
        dense_params += embd.n_elements
    gpu_at_zero = ncmoe_table(table)[0].gpu_bytes
    swa = kv_swa_bytes_per_cell(hp, cache_type)
    if swa is None:
        raise XoverError(f"a KV cache of type {cache_type} does not fit this model's head size: use F16 or Q8_0")
    experts = [
        t for t in table.tensors if t.is_expert and len(t.ne) == 3 and t.layer is not None and t.layer < hp.n_layer
    ]
    return ModelTerms(
        **hp.geometry(),
        ffn_width=_ffn_width(table),
        dense_params=dense_params,
        dense_gpu_bytes=gpu_at_zero - sum(bytes_layer),
        embd_row_bytes=embd.nbytes // embd.ne[1] if embd is not None and len(embd.ne) > 1 else 0,
        total_bytes=total_bytes(table),
        expert_params_layer=tuple(params_layer),
        expert_bytes_layer=tuple(bytes_layer),
        expert_copy_tensors_layer=tuple(tuple(c) for c in copy_layer),
        kv_bytes_per_token=kv,
        n_layer_swa=len(hp.swa_layers),
        swa_window=hp.swa_window if hp.swa_layers else 0,
        kv_swa_bytes_per_cell=swa,
        is_mla=hp.is_mla,
        nextn_bytes=nextn_bytes(table),
        shared_expert_bytes=shared_expert_bytes(table),
        dense_ffn_layers=len(hp.dense_layers) if hp.n_expert else 0,
        expert_mmq=all(t.ggml_type in MMQ_TYPES for t in experts),
        expert_mmq_fallback=any(t.ne[1] % MMQ_ROWS for t in experts),
    )


def _ffn_width(table: TensorTable) -> int:
    """Per-token FFN activations' width: ``n_expert_used x n_ff_exp`` (MoE) or ``n_ff`` (dense)."""
    hp = table.hparams
    for name, factor in (("blk.0.ffn_up_exps.weight", hp.n_expert_used), ("blk.0.ffn_up.weight", 1)):
        t = table.get(name)
        if t is not None and len(t.ne) >= 2:
            return t.ne[1] * max(factor, 1)
    return 4 * hp.n_embd


def _check_ncmoe(terms: ModelTerms, n_cpu_moe: int) -> None:
    if not 0 <= n_cpu_moe <= terms.n_layer:
        raise XoverError(f"--n-cpu-moe {n_cpu_moe} is outside 0..{terms.n_layer} (the model's layer count)")


# --------------------------------------------------------------------------------------------------
# expert coverage


def coverage(batch: int, n_expert: int, n_expert_used: int) -> float:
    """Expected share of a layer's experts that a batch of ``batch`` tokens routes to, uniform routing:
    ``1 - (1 - k/E)^B``. Dense models (``n_expert = 0``) read their whole FFN: 1."""
    if batch < 1:
        raise XoverError(f"a batch of {batch} tokens is empty: use at least 1")
    if not n_expert:
        return 1.0
    return 1.0 - (1.0 - n_expert_used / n_expert) ** batch


def copied_bytes(tensor_bytes: int, n_expert: int, cover: float) -> float:
    """Expected bytes llama.cpp copies of one 3-D expert tensor when a share ``cover`` of experts is used.

    The used experts, plus ``min(expert size, 512)`` bytes after each run of consecutive used experts
    that does not end at the last expert; there are ``(E - 1) c (1 - c)`` such runs on average when
    experts are used independently with probability c.
    """
    expert = tensor_bytes / n_expert
    runs = (n_expert - 1) * cover * (1.0 - cover)
    return n_expert * cover * expert + runs * min(expert, COPY_PADDING_BYTES)


def cpu_expert_bytes(terms: ModelTerms, n_cpu_moe: int) -> int:
    """Expert bytes ``--n-cpu-moe N`` keeps in host memory."""
    return sum(terms.expert_bytes_layer[:n_cpu_moe])


def expert_transfer_bytes(terms: ModelTerms, n_cpu_moe: int, batch: int) -> float:
    """Expected bytes of CPU-resident experts one ubatch of ``batch`` tokens reads: what op offload
    copies to the GPU (used experts and padding of the 3-D tensors, other expert tensors whole), or
    what the CPU streams through when it computes them itself."""
    if not terms.n_expert:
        return float(cpu_expert_bytes(terms, n_cpu_moe))
    cover = coverage(batch, terms.n_expert, terms.n_expert_used)
    out = 0.0
    for layer in range(n_cpu_moe):
        copies = terms.expert_copy_tensors_layer[layer]
        out += sum(copied_bytes(b, terms.n_expert, cover) for b in copies)
        out += terms.expert_bytes_layer[layer] - sum(copies)
    return out


# --------------------------------------------------------------------------------------------------
# decode and prefill intensity


def _attn_flops(terms: ModelTerms, layers: int, queries: int, keys: float) -> float:
    return 2.0 * layers * terms.n_head * (terms.head_dim_k + terms.head_dim_v) * queries * keys


def attention_flops(terms: ModelTerms, queries: int, keys: float) -> float:
    """FLOPs of attention for ``queries`` tokens ending at position ``keys`` (each attending to ``keys`` cached
    tokens): ``2 n_layer n_head (d_k + d_v) q k`` (QK^T and softmax(QK^T)V), i.e. 4 n_layer n_head head_dim q k.

    Sliding-window layers evaluate at most ``min(keys, window + queries)`` keys (:meth:`ModelTerms.swa_keys`).
    MLA (deepseek2) runs the absorbed form llama.cpp's ``deepseek2.cpp`` builds: ``wk_b`` folds into the query
    and ``wv_b`` is applied after attention, so attention is MQA over the compressed cache with
    ``d_k = kv_lora_rank + rope`` (576) and ``d_v = kv_lora_rank`` (512) per query head; ``wk_b`` / ``wv_b``
    themselves are weights (in the dense FLOPs).
    """
    out = _attn_flops(terms, terms.n_layer_full, queries, keys)
    if terms.n_layer_swa:
        out += _attn_flops(terms, terms.n_layer_swa, queries, terms.swa_keys(queries, keys))
    return out


def _sum_min(first: float, step: float, n: int, cap: float) -> float:
    """``sum(min(first + i step, cap) for i in range(n))`` in closed form (keys of successive ubatches or
    decode steps in a sliding-window layer)."""
    if n <= 0:
        return 0.0
    m = 0 if first > cap else min(n, int((cap - first) // step) + 1)
    return m * first + step * m * (m - 1) / 2 + (n - m) * cap


@dataclasses.dataclass(frozen=True)
class DecodeIntensity:
    """One decode step at ``depth`` tokens of context: bytes read, FLOPs, FLOP per byte."""

    depth: int
    weight_bytes: int
    kv_bytes: int
    weight_flops: float
    attention_flops: float
    weight_intensity: float = dataclasses.field(init=False)  # FLOP per weight byte: 2 / bytes per weight
    intensity: float = dataclasses.field(init=False)  # everything together

    def __post_init__(self) -> None:
        object.__setattr__(self, "weight_intensity", self.weight_flops / self.weight_bytes)
        object.__setattr__(self, "intensity", self.flops / self.bytes)

    @property
    def bytes(self) -> int:
        return self.weight_bytes + self.kv_bytes

    @property
    def flops(self) -> float:
        return self.weight_flops + self.attention_flops


def decode_intensity(terms: ModelTerms, depth: int) -> DecodeIntensity:
    """Bytes and FLOPs of one decoded token at ``depth``: active weights (non-expert, ``k/E`` of the
    experts, one embedding row) plus the KV cache of ``depth`` tokens."""
    weight_bytes = round(
        terms.dense_gpu_bytes + terms.embd_row_bytes + terms.active_fraction * sum(terms.expert_bytes_layer)
    )
    weight_flops = 2.0 * (terms.dense_params + terms.active_fraction * sum(terms.expert_params_layer))
    kv = terms.kv_read_bytes(1, depth)
    attn = attention_flops(terms, 1, depth)
    return DecodeIntensity(
        depth=depth, weight_bytes=weight_bytes, kv_bytes=kv, weight_flops=weight_flops, attention_flops=attn
    )


def decode_intensity_note(terms: ModelTerms) -> str:
    """One line on why decode's intensity does not grow with model size."""
    d = decode_intensity(terms, 0)
    bits = 8 * d.weight_bytes / (d.weight_flops / 2)
    gqa = terms.n_head / terms.n_head_kv if terms.n_head_kv else float("nan")
    values = terms.n_head_kv * (terms.head_dim_k + (0 if terms.is_mla else terms.head_dim_v))  # MLA: V is a view of K
    kv_bytes_per_value = terms.kv_bytes_per_token / ((terms.n_layer_full or terms.n_layer) * values)
    return (
        f"each active weight is used once per token: 2 FLOP per {bits / 8:.2f} bytes ({bits:.2f} bits) = "
        f"{d.weight_intensity:.2f} FLOP/byte, set by the quantization, not the model size (F16 gives 1.0); "
        f"the KV cache adds {gqa / kv_bytes_per_value:.1f} FLOP/byte (n_head/n_head_kv = {gqa:.0f} query heads per "
        f"{kv_bytes_per_value:.0f}-byte K/V value)"
    )


@dataclasses.dataclass(frozen=True)
class PrefillIntensity:
    """A ubatch of ``ubatch`` tokens at ``depth``: weights read once and shared, FLOPs, FLOP per byte."""

    ubatch: int
    depth: int
    coverage: float  # share of each layer's experts the ubatch reads
    weight_bytes: float  # read once per ubatch
    kv_bytes: int
    flops: float  # whole ubatch, attention included
    flops_per_token: float = dataclasses.field(init=False)
    intensity: float = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "flops_per_token", self.flops / self.ubatch)
        object.__setattr__(self, "intensity", self.flops / (self.weight_bytes + self.kv_bytes))


def prefill_intensity(terms: ModelTerms, ubatch: int, depth: int = 0) -> PrefillIntensity:
    """Intensity of one ubatch ending at ``depth + ubatch``: ``B x 2 x active params`` (+ attention) over
    the non-expert weights plus the experts the ubatch touches plus the KV cache it reads."""
    cover = coverage(ubatch, terms.n_expert, terms.n_expert_used)
    weights = terms.dense_gpu_bytes + cover * sum(terms.expert_bytes_layer)
    end = depth + ubatch
    kv = terms.kv_read_bytes(ubatch, end)
    flops = ubatch * 2.0 * (terms.dense_params + terms.active_fraction * sum(terms.expert_params_layer))
    flops += attention_flops(terms, ubatch, end)
    return PrefillIntensity(ubatch=ubatch, depth=depth, coverage=cover, weight_bytes=weights, kv_bytes=kv, flops=flops)


@dataclasses.dataclass(frozen=True)
class Ridge:
    """Where a processor turns compute-bound: peak FLOP/s over bandwidth, in FLOP per byte."""

    name: str
    flops_per_s: float
    bw_bytes_per_s: float

    @property
    def flop_per_byte(self) -> float:
        return self.flops_per_s / self.bw_bytes_per_s


def ridges(hw: Hardware) -> tuple[Ridge, ...]:
    """The GPU's ridge at the fp16 peak and at llama.cpp's quantized rate, and the CPU's."""
    out = []
    if hw.gpu:
        out.append(Ridge("GPU fp16 peak", hw.gpu.fp16_flops_per_s, hw.gpu.mem_bw_bytes_per_s))
        out.append(Ridge("GPU llama.cpp quantized", hw.gpu.quant_flops_per_s, hw.gpu.mem_bw_bytes_per_s))
    out.append(Ridge("CPU", hw.cpu.flops_per_s, hw.cpu.mem_bw_bytes_per_s))
    return tuple(out)


def compute_bound_ubatch(terms: ModelTerms, ridge: Ridge, limit: int = 1 << 16) -> int | None:
    """The smallest ubatch (at depth 0) whose intensity reaches the ridge, or None below ``limit``."""
    lo, hi = 1, limit
    if prefill_intensity(terms, hi).intensity < ridge.flop_per_byte:
        return None
    while lo < hi:  # intensity grows with the ubatch
        mid = (lo + hi) // 2
        if prefill_intensity(terms, mid).intensity >= ridge.flop_per_byte:
            hi = mid
        else:
            lo = mid + 1
    return lo


# --------------------------------------------------------------------------------------------------
# quadratic attention and flash attention memory


@dataclasses.dataclass(frozen=True)
class AttentionRow:
    """Attention of a prompt of ``length`` tokens prefilled from empty in ubatches of ``ubatch``."""

    length: int
    score_entries: int  # n_layer x n_head x L x L: every query against every key (the causal half masked);
    # sliding-window layers against at most the window
    kv_bytes: int  # the cache the prompt leaves: linear in L (sliding-window layers: at most window + ubatch)
    attention_flops: float  # what llama.cpp computes: B x (end position) scores per ubatch
    prefill_flops: float  # weights and attention together
    attention_share: float  # of prefill FLOPs
    fa_off_scores_bytes: int  # per layer, FA off: the f32 n_head x ubatch x n_kv score matrix of the last ubatch
    mask_bytes_fa_on: int  # the f16 ubatch x n_kv mask FA on keeps instead


def _ubatches(length: int, ubatch: int) -> tuple[int, int]:
    return divmod(length, ubatch)


def prefill_attention_flops(terms: ModelTerms, length: int, ubatch: int, depth: int = 0) -> float:
    """Attention FLOPs of prefilling ``length`` tokens on top of ``depth`` in ubatches of ``ubatch``."""
    full, rem = _ubatches(length, ubatch)
    ends = full * depth + ubatch * full * (full + 1) / 2  # sum of end positions of full ubatches
    flops = _attn_flops(terms, terms.n_layer_full, ubatch, 1) * ends
    if terms.n_layer_swa:
        flops += _attn_flops(terms, terms.n_layer_swa, ubatch, 1) * _sum_min(
            depth + ubatch, ubatch, full, terms.swa_window + ubatch
        )
    if rem:
        flops += attention_flops(terms, rem, depth + length)
    return flops


def attention_row(terms: ModelTerms, length: int, ubatch: int = 512) -> AttentionRow:
    """Entries, bytes and FLOPs of attention for one prompt length (see :class:`AttentionRow`)."""
    attn = prefill_attention_flops(terms, length, ubatch)
    weights = length * 2.0 * (terms.dense_params + terms.active_fraction * sum(terms.expert_params_layer))
    n_kv = _pad_ctx(length)
    b = min(ubatch, length)
    return AttentionRow(
        length=length,
        score_entries=terms.n_head
        * length
        * (terms.n_layer_full * length + terms.n_layer_swa * min(length, terms.swa_window)),
        kv_bytes=terms.kv_read_bytes(b, length),
        attention_flops=attn,
        prefill_flops=weights + attn,
        attention_share=attn / (weights + attn),
        fa_off_scores_bytes=terms.n_head * b * n_kv * F32,
        mask_bytes_fa_on=b * n_kv * 2,
    )


# --------------------------------------------------------------------------------------------------
# configurations and rates


@dataclasses.dataclass(frozen=True)
class Offload:
    """What the theory models of a configuration (:func:`offload_of` derives it from one): ``--n-cpu-moe``, op
    offload and its threshold, ``-ub``, and whether host weights are pinned."""

    n_cpu_moe: int = 0
    op_offload: bool = True
    ubatch: int = 512
    pinned: bool = False  # CPU-resident weights in pinned memory (-lm none / --no-mmap); mmap is pageable
    op_offload_min_batch: int = OP_OFFLOAD_MIN_BATCH

    def __post_init__(self) -> None:
        if self.n_cpu_moe < 0 or self.ubatch < 1 or self.op_offload_min_batch < 0:
            raise XoverError("--ncmoe must be >= 0 and --ubatch >= 1")

    def dims(self) -> dict[str, str]:
        """The settings as llama-bench names them, for labels."""
        return {
            "ncmoe": str(self.n_cpu_moe),
            "ub": str(self.ubatch),
            "nopo": "0" if self.op_offload else "1",
            "lm": "none" if self.pinned else "mmap",
            "GGML_OP_OFFLOAD_MIN_BATCH": str(self.op_offload_min_batch),
        }


def config_labels(configs: Sequence[Offload]) -> list[str]:
    """Labels made of what differs between the configurations (``ncmoe=18 nopo=1``), as ``xover bench`` names them."""
    dims = [c.dims() for c in configs]
    names = list(dims[0]) if dims else []
    varying = [n for n in names if len({d[n] for d in dims}) > 1]
    if not varying:
        varying = ["ncmoe"]
    return [" ".join(f"{n}={d[n]}" for n in varying) for d in dims]


def offload_of(config: LlamaConfig) -> Offload:
    """The theory's view of a configuration, read through the option table: settings it does not give keep
    llama.cpp's defaults (op offload on, ubatch 512, mmap); ``--no-mmap`` passed through to llama-server pins
    host weights as ``-lm none`` does, and an engine that always pins its CPU experts (ik_llama.cpp) pins them."""
    try:
        return Offload(
            n_cpu_moe=config.n_cpu_moe,
            op_offload=config.get(opts.NO_OP_OFFLOAD.name) != "1",
            ubatch=int(config.int_value(opts.UBATCH_SIZE.name) or opts.UBATCH_SIZE.default),
            pinned=config.get(opts.LOAD_MODE.name) == "none"
            or "--no-mmap" in config.server_args
            or opts.traits(config.engine).pins_cpu_experts,
            op_offload_min_batch=int(config.get(opts.OP_OFFLOAD_MIN_BATCH.name) or OP_OFFLOAD_MIN_BATCH),
        )
    except ValueError:
        raise XoverError(f"{config.name}: a setting the theory reads is not a number") from None


Basis = Literal["prediction", "limit"]


# --------------------------------------------------------------------------------------------------
# MMQ tile padding of expert matmuls (llama.cpp's CUDA kernels)

MMQ_MAX_TILE = 128
"""Largest column tile (mmq_x) of llama.cpp's quantized matmul kernel (ggml-cuda/mmq.cuh)."""
MMQ_MIN_BATCH = 9
"""Below this many tokens llama.cpp multiplies with its vector kernels (MMVQ), which have no column tiles."""
_RDNA = re.compile(r"RX\s*[79]\d{3}|RDNA", re.IGNORECASE)


def pads_expert_tiles(gpu_name: str) -> bool:
    """Whether llama.cpp sizes MMQ tiles by the ubatch on this GPU (all but AMD RDNA3/4, which size them by
    the tokens per expert)."""
    return not _RDNA.search(gpu_name)


MMQ_TILES = (8, 16, 24, 32, 40, 48, 64, 80, 96, 112, 128)
"""Column tiles (J) llama.cpp's MMQ has for every quantized type, MXFP4 included, on Volta..Hopper
(``ggml-cuda/mmq-config-ampere.cuh``; Blackwell uses the same unless activations are FP4)."""
MMQ_TILES_FALLBACK = (8, 16, 32, 64, 128)
"""The tiles left when the weight's rows are not a multiple of 128 (``fallback``: gpt-oss's 2880-row experts)."""


def mmq_tile(batch: int, fallback: bool = False) -> int:
    """The column tile llama.cpp's MMQ picks for a ubatch of ``batch`` tokens: the first of its tiles that needs
    the fewest tiles for ``batch`` columns (``mul_mat_q_switch_J``, ggml-cuda/mmq.cuh)."""
    tiles = MMQ_TILES_FALLBACK if fallback else MMQ_TILES
    return min(tiles, key=lambda j: (-(-batch // j), j))


def expert_tile_padding(batch: int, n_expert: int, n_expert_used: int, tile: int | None = None) -> float:
    """Columns MMQ computes for a ubatch's expert matmuls over the columns that carry tokens (>= 1).

    On NVIDIA (and AMD other than RDNA3/4) llama.cpp sizes the tile by the ubatch's tokens, not by the
    tokens each expert receives (``ncols_opt = ne12``, ggml-cuda/mmq.cu), and each expert's tokens fill
    whole tiles: an expert with ``n`` tokens costs ``ceil(n / tile)`` tiles. With ``n ~ Binomial(B, k/E)``
    the expected padded columns are ``E * sum_n P(n) ceil(n / tile) * tile`` against ``B k`` useful ones:
    4x for 512 tokens over 8 of 128 experts (32 tokens each in tiles of 128), 1.25x at 4096.
    """
    if not n_expert or batch < MMQ_MIN_BATCH:
        return 1.0
    t = tile or mmq_tile(batch)
    p = n_expert_used / n_expert
    log_p, log_q = math.log(p), math.log1p(-p) if p < 1 else -math.inf
    expected_tiles = 0.0
    for n in range(1, batch + 1):
        log_pmf = (
            math.lgamma(batch + 1)
            - math.lgamma(n + 1)
            - math.lgamma(batch - n + 1)
            + n * log_p
            + ((batch - n) * log_q if batch > n else 0.0)
        )
        if log_pmf > -60:
            expected_tiles += math.exp(log_pmf) * -(-n // t)
    return n_expert * expected_tiles * t / (batch * n_expert_used)


@dataclasses.dataclass(frozen=True)
class _Rates:
    gpu: bool
    gpu_flops: float
    gpu_bw: float
    cpu_flops: float
    cpu_bw: float
    h2d: float
    tile_padding: bool = False  # expert matmuls on the GPU pay MMQ's tile padding (prediction basis, not RDNA3/4)


def _rates(hw: Hardware, cfg: Offload, basis: Basis) -> _Rates:
    g = hw.gpu
    if g is None:
        return _Rates(False, 0.0, 0.0, hw.cpu.flops_per_s, hw.cpu.mem_bw_bytes_per_s, 0.0)
    return _Rates(
        True,
        g.fp16_flops_per_s if basis == "limit" else g.quant_flops_per_s,
        g.mem_bw_bytes_per_s,
        hw.cpu.flops_per_s,
        hw.cpu.mem_bw_bytes_per_s,
        g.h2d_pinned_bytes_per_s if cfg.pinned else g.h2d_pageable_bytes_per_s,
        tile_padding=basis == "prediction" and pads_expert_tiles(g.name),
    )


def _roof(flops: float, nbytes: float, flops_per_s: float, bytes_per_s: float) -> float:
    return max(flops / flops_per_s, nbytes / bytes_per_s)


# --------------------------------------------------------------------------------------------------
# roofline times


@dataclasses.dataclass(frozen=True)
class _Costs:
    """Per-configuration constants: a decode step is ``decode_base + (depth + 1) decode_per_key`` seconds;
    a ubatch of b tokens ending at e costs ``ubatch(b) + e attn_per_key(b)``."""

    decode_base_s: float
    decode_per_key_s: float
    terms: ModelTerms
    rates: _Rates
    cfg: Offload
    decode_per_swa_key_s: float = 0.0  # sliding-window layers: at most window + 1 keys per decoded token
    _memo: dict[int, float] = dataclasses.field(default_factory=dict, compare=False, repr=False)

    def ubatch_s(self, b: int) -> float:
        """Everything in a ubatch of ``b`` tokens except attention (memoised: scans reuse a few sizes)."""
        if b not in self._memo:
            self._memo[b] = self._ubatch_s(b)
        return self._memo[b]

    def _ubatch_s(self, b: int) -> float:
        t, r, cfg = self.terms, self.rates, self.cfg
        frac = t.active_fraction
        n = cfg.n_cpu_moe if r.gpu else 0
        gpu_exp_params = sum(t.expert_params_layer[n:])
        gpu_exp_bytes = sum(t.expert_bytes_layer[n:])
        cover = coverage(b, t.n_expert, t.n_expert_used)
        dense_f = 2.0 * b * t.dense_params
        dense_b = t.dense_gpu_bytes
        pad = 1.0
        if r.gpu and r.tile_padding and t.expert_mmq:
            pad = expert_tile_padding(b, t.n_expert, t.n_expert_used, mmq_tile(b, t.expert_mmq_fallback))
        exp_f = 2.0 * b * frac * gpu_exp_params * pad
        exp_b = cover * gpu_exp_bytes
        flops_per_s = r.gpu_flops if r.gpu else r.cpu_flops
        bw = r.gpu_bw if r.gpu else r.cpu_bw
        s = _roof(dense_f, dense_b, flops_per_s, bw) + _roof(exp_f, exp_b, flops_per_s, bw)
        if n:
            cpu_f = 2.0 * b * frac * sum(t.expert_params_layer[:n])
            moved = expert_transfer_bytes(t, n, b)
            if cfg.op_offload and b >= cfg.op_offload_min_batch:
                s += moved / r.h2d + _roof(cpu_f * pad, moved, r.gpu_flops, r.gpu_bw)
            else:
                s += _roof(cpu_f, moved, r.cpu_flops, r.cpu_bw)
        return s

    def attn_per_key_s(self, b: int) -> float:
        """Attention of a ubatch of ``b`` per key of the full-attention layers."""
        r = self.rates
        flops_per_s = r.gpu_flops if r.gpu else r.cpu_flops
        bw = r.gpu_bw if r.gpu else r.cpu_bw
        t = self.terms
        return max(_attn_flops(t, t.n_layer_full, b, 1) / flops_per_s, t.kv_bytes_per_token / bw)

    def swa_per_key_s(self, b: int) -> float:
        """The same per key of the sliding-window layers (0 without them)."""
        t, r = self.terms, self.rates
        flops_per_s = r.gpu_flops if r.gpu else r.cpu_flops
        bw = r.gpu_bw if r.gpu else r.cpu_bw
        return max(_attn_flops(t, t.n_layer_swa, b, 1) / flops_per_s, t.kv_swa_bytes_per_cell / bw)

    def prefill_s(self, length: int, depth: int = 0) -> float:
        """Seconds to prefill ``length`` tokens on top of ``depth`` cached ones."""
        if length < 1:
            return 0.0
        B = self.cfg.ubatch
        full, rem = _ubatches(length, B)
        s = 0.0
        t = self.terms
        if full:
            ends = full * depth + B * full * (full + 1) / 2
            s += full * self.ubatch_s(B) + ends * self.attn_per_key_s(B)
            if t.n_layer_swa:
                s += _sum_min(depth + B, B, full, t.swa_window + B) * self.swa_per_key_s(B)
        if rem:
            s += self.ubatch_s(rem) + (depth + length) * self.attn_per_key_s(rem)
            if t.n_layer_swa:
                s += t.swa_keys(rem, depth + length) * self.swa_per_key_s(rem)
        return s

    def decode_s(self, depth: int) -> float:
        """Seconds for one decoded token with ``depth`` tokens already in the cache."""
        s = self.decode_base_s + (depth + 1) * self.decode_per_key_s
        if self.terms.n_layer_swa:
            s += self.terms.swa_keys(1, depth + 1) * self.decode_per_swa_key_s
        return s

    def decode_sum_s(self, depth: int, tokens: int) -> float:
        """Seconds to decode ``tokens`` tokens starting at ``depth`` (depths depth .. depth+tokens-1)."""
        keys = tokens * (depth + 1) + tokens * (tokens - 1) / 2
        s = tokens * self.decode_base_s + keys * self.decode_per_key_s
        if self.terms.n_layer_swa:
            s += _sum_min(depth + 1, 1, tokens, self.terms.swa_window + 1) * self.decode_per_swa_key_s
        return s

    def total_s(self, length: int, response: int) -> float:
        """TTFT of a ``length``-token prompt plus ``response`` decoded tokens (as :mod:`crossover` defines it)."""
        return self.prefill_s(length) + self.decode_sum_s(length, response)


def _costs(terms: ModelTerms, hw: Hardware, cfg: Offload, basis: Basis) -> _Costs:
    _check_ncmoe(terms, cfg.n_cpu_moe)
    r = _rates(hw, cfg, basis)
    frac = terms.active_fraction
    n = cfg.n_cpu_moe if r.gpu else 0
    flops_per_s = r.gpu_flops if r.gpu else r.cpu_flops
    bw = r.gpu_bw if r.gpu else r.cpu_bw
    resident_f = 2.0 * (terms.dense_params + frac * sum(terms.expert_params_layer[n:]))
    resident_b = terms.dense_gpu_bytes + frac * sum(terms.expert_bytes_layer[n:])
    cpu_f = 2.0 * frac * sum(terms.expert_params_layer[:n])
    cpu_b = terms.embd_row_bytes + frac * sum(terms.expert_bytes_layer[:n])
    base = _roof(resident_f, resident_b, flops_per_s, bw) + _roof(cpu_f, cpu_b, r.cpu_flops, r.cpu_bw)
    per_key = max(_attn_flops(terms, terms.n_layer_full, 1, 1) / flops_per_s, terms.kv_bytes_per_token / bw)
    per_swa_key = max(_attn_flops(terms, terms.n_layer_swa, 1, 1) / flops_per_s, terms.kv_swa_bytes_per_cell / bw)
    return _Costs(base, per_key, terms, r, cfg, per_swa_key)


@dataclasses.dataclass(frozen=True)
class RooflineLimit:
    """Upper bounds for one configuration at one depth: no measurement can beat these."""

    depth: int
    pp_tokens: int
    prefill_tps: float  # pp_tokens new tokens on top of depth (llama-bench pp512 @ dN)
    decode_tps: float  # one token at depth (llama-bench tg @ dN)


def roofline_limit(terms: ModelTerms, hw: Hardware, config: Offload, depth: int, pp_tokens: int = 512) -> RooflineLimit:
    """The roofline ceiling on prefill and decode tok/s at ``depth``: the theory at the datasheet fp16
    peak and the bandwidth ceilings. Show a measured ``pp512 @ dN`` / ``tg128 @ dN`` as a share of it."""
    c = _costs(terms, hw, config, "limit")
    return RooflineLimit(
        depth=depth,
        pp_tokens=pp_tokens,
        prefill_tps=pp_tokens / c.prefill_s(pp_tokens, depth),
        decode_tps=1.0 / c.decode_s(depth),
    )


METRICS = ("ttft_s", "prefill_tps", "pp_tps", "decode_tps", "total_s", "limit_pp_tps", "limit_decode_tps")
"""Metrics a prediction holds at each length L (see :func:`build_prediction`)."""


@dataclasses.dataclass(frozen=True)
class PredictedPoint:
    """The prediction for one configuration and prompt length (metrics as in :data:`METRICS`)."""

    length: int
    ttft_s: float  # prefill of L tokens from an empty cache
    prefill_tps: float  # L / ttft_s
    pp_tps: float  # pp_tokens new tokens on top of L cached ones (llama-bench pp @ dL)
    decode_tps: float  # one token at depth L (llama-bench tg @ dL)
    total_s: float  # ttft_s + response tokens decoded at depths L .. L+R-1
    limit_pp_tps: float
    limit_decode_tps: float


def predict_point(
    terms: ModelTerms, hw: Hardware, config: Offload, length: int, response: int = 200, pp_tokens: int = 512
) -> PredictedPoint:
    """Predicted prefill, decode, TTFT and total time at one prompt length."""
    return _point(
        _costs(terms, hw, config, "prediction"), _costs(terms, hw, config, "limit"), length, response, pp_tokens
    )


def _point(c: _Costs, lim: _Costs, length: int, response: int, pp_tokens: int) -> PredictedPoint:
    ttft = c.prefill_s(length)
    return PredictedPoint(
        length=length,
        ttft_s=ttft,
        prefill_tps=length / ttft,
        pp_tps=pp_tokens / c.prefill_s(pp_tokens, length),
        decode_tps=1.0 / c.decode_s(length),
        total_s=ttft + c.decode_sum_s(length, response),
        limit_pp_tps=pp_tokens / lim.prefill_s(pp_tokens, length),
        limit_decode_tps=1.0 / lim.decode_s(length),
    )


# --------------------------------------------------------------------------------------------------
# predicted crossovers


def _grid(max_length: int) -> list[int]:
    """Prompt lengths to scan: every 16 tokens up to 1024, then every 256."""
    return sorted({*range(16, min(1024, max_length) + 1, 16), *range(1024, max_length + 1, 256), max_length})


@dataclasses.dataclass(frozen=True)
class PredictedPair:
    """Two configurations' predicted totals compared over prompt lengths."""

    a: str
    b: str
    crossings: tuple[Crossing, ...]  # integer lengths: the first L where the faster one changes
    faster_short: str  # faster at the shortest scanned length
    faster_long: str  # faster at the longest scanned length
    max_length: int


def crossings(a: _Costs, b: _Costs, response: int, max_length: int, measured: tuple[int, int]) -> tuple[Crossing, ...]:
    """Exact integer crossovers of two totals: scan the grid for sign changes, then bisect each."""

    def diff(length: int) -> float:
        return a.total_s(length, response) - b.total_s(length, response)

    grid = _grid(max_length)
    values = [diff(x) for x in grid]
    out = []
    for (x0, d0), (x1, d1) in zip(zip(grid, values), zip(grid[1:], values[1:])):
        if d0 == 0 or (d0 < 0) == (d1 < 0):
            continue
        lo, hi = x0, x1  # sign(diff(lo)) == sign(d0) != sign(diff(hi))
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if (diff(mid) < 0) == (d0 < 0):
                lo = mid
            else:
                hi = mid
        out.append(Crossing(float(hi), "cross", not measured[0] <= hi <= measured[1]))
    return tuple(out)


def predicted_pairs(
    terms: ModelTerms,
    hw: Hardware,
    configs: Sequence[Offload],
    lengths: Sequence[int],
    response: int = 200,
    max_length: int | None = None,
) -> tuple[PredictedPair, ...]:
    """Every pair of configurations: where the faster one changes, scanned up to ``max_length``
    (default: 4x the longest length, within the model's training context)."""
    labels = config_labels(configs)
    costs = [_costs(terms, hw, c, "prediction") for c in configs]
    top = max(lengths)
    if max_length is None:
        max_length = max(top, min(4 * top, terms.n_ctx_train or 4 * top))
    span = (min(lengths), top)
    out = []
    for (i, ca), (j, cb) in itertools.combinations(enumerate(costs), 2):
        xs = crossings(ca, cb, response, max_length, span)
        short = labels[i] if ca.total_s(16, response) <= cb.total_s(16, response) else labels[j]
        long_ = labels[i] if ca.total_s(max_length, response) <= cb.total_s(max_length, response) else labels[j]
        out.append(PredictedPair(labels[i], labels[j], xs, short, long_, max_length))
    return tuple(out)


# --------------------------------------------------------------------------------------------------
# memory: buffers and placement


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
    """What one device holds for a configuration and context: llama.cpp's three logged buffers.

    ``model_bytes`` and ``kv_bytes`` follow llama.cpp exactly (``model buffer size``, ``KV buffer
    size``); ``compute_bytes`` is a rough estimate of ``compute buffer size`` (see
    :func:`memory_estimate`).
    """

    device: Literal["gpu", "cpu"]
    n_cpu_moe: int
    n_ctx: int  # as given; llama.cpp pads it to a multiple of 256
    ubatch: int
    flash_attn: bool
    model_bytes: int
    kv_bytes: int
    compute_bytes: int
    host_model_bytes: int  # weights left in host memory (token_embd, CPU-resident experts)

    @property
    def total_bytes(self) -> int:
        return self.model_bytes + self.kv_bytes + self.compute_bytes


def _pad_ctx(n_ctx: int) -> int:
    return -(-n_ctx // CTX_PAD) * CTX_PAD


def memory_estimate(
    terms: ModelTerms,
    n_cpu_moe: int,
    n_ctx: int,
    ubatch: int = 512,
    flash_attn: bool = True,
    device: Literal["gpu", "cpu"] = "gpu",
    n_outputs: int | None = None,
    compute_per_token: float | None = None,
) -> MemoryEstimate:
    """Model, KV and compute buffers on ``device`` (``cpu`` for a CPU-only build, where all weights sit).

    Model buffer: what ``--n-cpu-moe N`` leaves on the GPU (everything but ``token_embd`` and the first N
    layers' expert tensors); NextN/MTP blocks (GLM-4.5) are never loaded. KV buffer: the full-attention
    layers' cache of the padded context, plus, with sliding-window layers (gpt-oss, iSWA), a second cache of
    :meth:`ModelTerms.swa_cells`; MLA (deepseek2) caches one compressed K row per layer. Model and KV are
    exact against llama.cpp's load log (``tests/real/test_placement_real.py``).

    Compute buffer (rough, fitted to llama.cpp's CPU logs on synthetic qwen3moe shapes): the KQ mask
    (``ubatch x n_kv``, f16 with flash attention, f32 without) plus the largest of three peaks, in f32:
    the FFN (``ubatch x (3 ffn_width + 3 n_embd + n_head d_k)``), attention (``ubatch x (2 n_embd +
    2 (n_head + 2 n_head_kv) d_k)``, plus the ``n_head x ubatch x n_kv`` score matrix without flash
    attention) and the output (``n_outputs x n_vocab`` logits, ``n_outputs`` = ubatch as in llama-bench,
    plus ``ubatch x n_embd``). Checked: exact on the CPU logs of tiny-moe variants; 12 % under the
    CUDA0 compute buffer of the qwen3-30b-a3b shape on an H200 (301 vs 342 MiB at n_ctx 512), which
    ``--n-cpu-moe 18`` with op offload left unchanged (the expert copies do not live there).

    Against llama-server's logs it is off both ways: llama-server reserves one output per slot
    (``server_output_limits``: ``n_outputs_max = n_parallel``), not a ubatch of logits, while the CUDA graph's
    MoE intermediates outgrow the FFN term (qwen3-30b-a3b, ``-ub 512``, 8,704 cells: 309 MiB estimated, 226
    logged; gpt-oss-120b, ``-ub 4096``, 16,896 cells: 1,218 logged). So where a load of the same model has
    been logged, ``compute_per_token`` (:func:`compute_per_token`, from that log) replaces the FFN and attention
    peaks: the compute buffer is then the mask plus the larger of that many bytes per ubatch token and the output
    peak. The log is a server's (one output row), so the calibration holds the activations only, and a llama-bench
    trial's ubatch of logits still counts where it is the larger peak: at ``-ub 4096`` qwen3-30b-a3b's llama-server
    logged 962 MiB of compute buffer (h200-16gib-cached), its llama-bench 2,732 MiB (h200-16gib-qwen3-30b-a3b),
    2,374 MiB of which are the logits.
    """
    _check_ncmoe(terms, n_cpu_moe)
    n_kv = _pad_ctx(n_ctx)
    b = min(ubatch, n_kv)
    outputs = b if n_outputs is None else min(n_outputs, b)
    mask = _mask_bytes(terms, n_kv, ubatch, flash_attn)
    hd = terms.head_dim_k
    ffn = b * (3 * terms.ffn_width + 3 * terms.n_embd + terms.n_head * hd)
    attn = b * (2 * terms.n_embd + 2 * (terms.n_head + 2 * terms.n_head_kv) * hd)
    if not flash_attn:
        attn += terms.n_head * b * n_kv
    out = outputs * terms.n_vocab + b * terms.n_embd
    peak = F32 * max(ffn, attn, out) if compute_per_token is None else max(round(compute_per_token * b), F32 * out)
    compute = mask + peak
    loaded = terms.total_bytes - terms.nextn_bytes  # NextN/MTP blocks are in the file, never loaded
    model = terms.gpu_weight_bytes(n_cpu_moe) if device == "gpu" else loaded
    return MemoryEstimate(
        device=device,
        n_cpu_moe=n_cpu_moe,
        n_ctx=n_ctx,
        ubatch=ubatch,
        flash_attn=flash_attn,
        model_bytes=model,
        kv_bytes=terms.kv_cache_bytes(n_kv, ubatch),
        compute_bytes=compute,
        host_model_bytes=loaded - model if device == "gpu" else 0,
    )


def _mask_bytes(terms: ModelTerms, n_kv: int, ubatch: int, flash_attn: bool) -> int:
    """The KQ mask of one ubatch over the padded context (f16 with flash attention, f32 without), plus the SWA
    cache's second mask (iSWA)."""
    b = min(ubatch, n_kv)
    mask = b * n_kv * (2 if flash_attn else F32)
    if terms.n_layer_swa:
        mask += b * terms.swa_cells(n_kv, ubatch) * (2 if flash_attn else F32)
    return mask


def compute_per_token(terms: ModelTerms, logged_bytes: int, ubatch: int, n_ctx: int, flash_attn: bool = True) -> float:
    """Bytes per ubatch token of a compute buffer llama.cpp logged at ``-ub ubatch`` and ``n_ctx`` cells, the KQ
    mask taken out: the graph's activations grow with the ubatch, the mask with the ubatch times the context. A
    plan for another ubatch or context scales the first and recomputes the second (:func:`memory_estimate`)."""
    n_kv = _pad_ctx(n_ctx)
    return max(0.0, (logged_bytes - _mask_bytes(terms, n_kv, ubatch, flash_attn)) / min(ubatch, n_kv))


@dataclasses.dataclass(frozen=True)
class Placement:
    """The smallest ``--n-cpu-moe`` that fits a context in a VRAM budget (None: not even all experts out)."""

    n_ctx: int
    n_cpu_moe: int | None
    estimate: MemoryEstimate  # at that N (or at N = n_layer when nothing fits)
    budget_bytes: int
    headroom_bytes: int


# What a llama.cpp CUDA process needs beyond the buffers it logs: its CUDA context (525 MiB on the H200 with
# CUDA 12, measured: llama.cpp saw 15,859 MiB free of a 16 GiB budget) and the allocations it makes at the first
# request (cuBLAS workspace, the ggml CUDA pool). Measured on the H200 under a 16 GiB budget (qwen3-30b-a3b,
# -c 8704, studies/h200-vram-budget): 182 MiB left after the logged buffers and the context crashed the first
# request (cuBLAS workspace: out of memory), 555 MiB served. 1 GiB covers both with a margin.
DEFAULT_HEADROOM_BYTES = 1 << 30


def plan_placement(
    terms: ModelTerms,
    budget_bytes: int,
    contexts: Sequence[int],
    ubatch: int = 512,
    flash_attn: bool = True,
    headroom_bytes: int = DEFAULT_HEADROOM_BYTES,
    compute_per_token: float | None = None,
    n_outputs: int | None = None,
) -> tuple[Placement, ...]:
    """For each context, the smallest N whose GPU buffers plus ``headroom_bytes`` (CUDA context, cuBLAS
    workspace and pool, fragmentation: :data:`DEFAULT_HEADROOM_BYTES`) fit in ``budget_bytes`` of free VRAM;
    ``compute_per_token``: the compute buffer calibrated from a logged load (:func:`compute_per_token`);
    ``n_outputs``: the logits rows reserved (None: a whole ubatch, as llama-bench; 1: llama-server's one slot)."""
    out = []
    for n_ctx in contexts:
        chosen = None
        est = memory_estimate(terms, terms.n_layer, n_ctx, ubatch, flash_attn, "gpu", n_outputs, compute_per_token)
        for n in range(terms.n_layer + 1):
            e = memory_estimate(terms, n, n_ctx, ubatch, flash_attn, "gpu", n_outputs, compute_per_token)
            if e.total_bytes + headroom_bytes <= budget_bytes:
                chosen, est = n, e
                break
        out.append(Placement(n_ctx, chosen, est, budget_bytes, headroom_bytes))
    return tuple(out)


# --------------------------------------------------------------------------------------------------
# the stored prediction

PREDICTION_SCHEMA = "xover.prediction/1"


def lowest_serving(
    serves: Callable[[int], bool], low: int, high: int, top: int, above: int = 4
) -> tuple[int | None, tuple[int, ...]]:
    """The lowest ``--n-cpu-moe`` that serves, asking ``serves(level)`` (a real llama-server load and request) as
    few times as it can, and the levels it asked in order. Fewer experts on the CPU need more GPU memory, so a level
    that serves is taken to mean every level above it serves too. ``high`` is a level expected to serve (llama-bench's
    placement, which reserves a whole ubatch of logits); where it does not, up to ``above`` levels over it are tried
    (capped at ``top``, every expert out) and the first that serves is the answer (None: none did). ``low`` is the
    planner's least level for the server (its one output row, no headroom): the answer is sought by bisection between
    ``low`` and ``high``, and below ``low`` (one level, then two, four...) where ``low`` itself serves. The answer is proven: it serves, and the level
    below it (where there is one) was asked and did not."""
    asked: dict[int, bool] = {}

    def ok(level: int) -> bool:
        if level not in asked:
            asked[level] = serves(level)
        return asked[level]

    high = max(0, min(high, top))
    low = max(0, min(low, high))
    good = next((m for m in range(high, min(top, high + above) + 1) if ok(m)), None)
    if good is None or good > high:  # the levels below a refused one are refused too
        return good, tuple(asked)
    bad = -1  # the highest level known not to serve
    if good > low:
        if ok(low):
            good = low
        else:
            bad = low
    step = 1
    while bad < 0 and good > 0:  # the planner's least level serves: the edge is most likely just below it
        probe = max(0, good - step)
        if ok(probe):
            good, step = probe, step * 2
        else:
            bad = probe
    while good - bad > 1:
        mid = (good + bad) // 2
        if ok(mid):
            good = mid
        else:
            bad = mid
    return good, tuple(asked)


def assumptions(hw: Hardware, configs: Sequence[Offload]) -> list[str]:
    """The assumptions every stored prediction states."""
    out = [
        (
            "roofline: each part of the model costs max(FLOPs / FLOP/s, bytes / bandwidth) on the device holding it; "
            "parts run one after another (no CPU/GPU overlap)"
        ),
        "uniform expert routing: a ubatch of B tokens reads 1 - (1 - k/E)^B of each layer's experts",
        "no kernel-launch, synchronisation or CPU<->GPU activation-transfer overheads (decode on fast GPUs lands far below)",
        "flash attention on; attention computes the whole B x n_kv tile of each ubatch; KV cache f16",
        "TTFT = prefill time of the prompt from an empty cache; decode_tps at depth L is one token at L",
    ]
    if hw.gpu is None:
        out.append("CPU-only: every part runs on the CPU; --n-cpu-moe moves nothing")
    else:
        out += [
            "every layer on the GPU (-ngl all); --n-cpu-moe N keeps the experts of the first N layers in host memory",
            (
                f"GPU matmuls at {hw.gpu.quant_flops_per_s / 1e12:.0f} TFLOP/s (llama.cpp quantized kernels); "
                f"limits at the {hw.gpu.fp16_flops_per_s / 1e12:.0f} TFLOP/s fp16 peak"
            ),
            (
                "expert matmuls on the GPU fill whole MMQ column tiles sized by the ubatch (up to 128 tokens), not by "
                "each expert's tokens: predictions count the padded work (4x at -ub 512 for 8 of 128 experts, 1.24x at "
                "4096); limits count only the useful work"
            )
            if pads_expert_tiles(hw.gpu.name)
            else "expert matmuls: RDNA3/4 size MMQ tiles by each expert's tokens, so no tile padding is counted",
            (
                "op offload: ubatches of >= GGML_OP_OFFLOAD_MIN_BATCH tokens copy the used CPU-resident experts to the GPU "
                "(host-to-device rate: pinned with -lm none, pageable with mmap) and compute them there; decode and smaller "
                "batches compute them on the CPU"
            ),
        ]
    if any(c.n_cpu_moe for c in configs) and hw.gpu is not None:
        out.append(
            f"CPU experts at {hw.cpu.flops_per_s / 1e12:.2f} TFLOP/s and {hw.cpu.mem_bw_bytes_per_s / 1e9:.0f} GB/s"
        )
    return out


def _scan_lengths(lengths: Sequence[int]) -> list[int]:
    """The requested lengths plus a quarter-octave grid from 64 to twice the longest: the stored
    curve that :func:`predicted_value` interpolates for lengths nobody asked for in advance."""
    top = 2 * max(lengths)
    grid = {round(2 ** (i / 4)) for i in range(24, 4 * math.ceil(math.log2(top)) + 1) if round(2 ** (i / 4)) <= top}
    return sorted(grid | set(lengths))


@dataclasses.dataclass(frozen=True)
class TheoryInputs:
    """What a prediction and a theory report are made of: the model's terms, the hardware, the configurations
    (their theory views), the prompt lengths, the caller's description of the model and the moment it was made,
    the response length, the new tokens of ``pp @ depth``, and an optional VRAM budget with the headroom kept
    free in it."""

    terms: ModelTerms
    hw: Hardware
    configs: tuple[Offload, ...]
    lengths: tuple[int, ...]
    model: Mapping[str, Any]
    created_at: str
    created_unix_ns: int
    response: int = 200
    pp_tokens: int = 512
    vram_budget_bytes: int | None = None
    headroom_bytes: int = DEFAULT_HEADROOM_BYTES


def build_prediction(inputs: TheoryInputs) -> dict[str, Any]:
    """The prediction as a JSON-able dict, to be stored before anything is measured.

    Schema (``"schema": "xover.prediction/1"``)::

        created_at, created_unix_ns    when it was made (the caller's clock)
        model                          the caller's description (name, source, bytes...)
        hardware                       Hardware.to_dict(): gpu, cpu and each field's source
        assumptions                    list of sentences
        response_tokens, pp_tokens     R of total_s; the new tokens of pp_tps
        lengths                        the requested prompt lengths
        configs: [{label, n_cpu_moe, op_offload, ubatch, pinned, op_offload_min_batch,
                   points: [{length, <METRICS>..., fits}]   at the requested lengths
                   curve:  {length: [...], <metric>: [...]}  the same metrics on a denser grid}]
        crossovers: [{a, b, lengths: [int...], faster_short, faster_long, max_length}]

    ``fits`` is whether the configuration's GPU buffers at a context of L + R tokens, plus
    ``headroom_bytes``, fit ``vram_budget_bytes`` (None when no budget was given or there is no GPU).
    """
    terms, hw, configs, lengths = inputs.terms, inputs.hw, inputs.configs, inputs.lengths
    response, pp_tokens, vram_budget_bytes = inputs.response, inputs.pp_tokens, inputs.vram_budget_bytes
    if not configs or not lengths:
        raise XoverError("a prediction needs at least one --ncmoe value and one --lengths value")
    labels = config_labels(configs)
    entries = []
    for cfg, label in zip(configs, labels):
        c, lim = _costs(terms, hw, cfg, "prediction"), _costs(terms, hw, cfg, "limit")
        scan = [_point(c, lim, L, response, pp_tokens) for L in _scan_lengths(lengths)]
        by_length = {p.length: p for p in scan}
        points = []
        for L in lengths:
            fits = None
            if vram_budget_bytes is not None and hw.gpu is not None:
                need = memory_estimate(terms, cfg.n_cpu_moe, L + response, cfg.ubatch)
                fits = need.total_bytes + inputs.headroom_bytes <= vram_budget_bytes
            points.append({**dataclasses.asdict(by_length[L]), "fits": fits})
        curve = {m: [getattr(p, m) for p in scan] for m in ("length", *METRICS)}
        entries.append({"label": label, **dataclasses.asdict(cfg), "points": points, "curve": curve})
    pairs = predicted_pairs(terms, hw, configs, lengths, response)
    return {
        "schema": PREDICTION_SCHEMA,
        "created_at": inputs.created_at,
        "created_unix_ns": inputs.created_unix_ns,
        "model": dict(inputs.model),
        "hardware": hw.to_dict(),
        "assumptions": assumptions(hw, configs),
        "response_tokens": response,
        "pp_tokens": pp_tokens,
        "lengths": list(lengths),
        "configs": entries,
        "crossovers": [
            {
                "a": p.a,
                "b": p.b,
                "lengths": [int(x.length) for x in p.crossings],
                "faster_short": p.faster_short,
                "faster_long": p.faster_long,
                "max_length": p.max_length,
            }
            for p in pairs
        ],
    }


def predicted_value(prediction: Mapping[str, Any], config: str | Offload, length: int, metric: str) -> float | None:
    """The value a stored prediction gave for ``metric`` of ``config`` at ``length``.

    ``config`` is a stored label or the :class:`Offload` of what was measured (see
    :func:`offload_of`). Lengths between stored ones are interpolated linearly in the stored
    curve; None when the configuration was not predicted or the length lies outside the curve.
    """
    if prediction.get("schema") != PREDICTION_SCHEMA:
        raise XoverError(f"not a {PREDICTION_SCHEMA} prediction: store one with xover predict")
    if metric not in METRICS:
        raise XoverError(f"unknown metric {metric!r}: choose one of {', '.join(METRICS)}")
    entry = next((e for e in prediction["configs"] if _same_config(e, config)), None)
    if entry is None:
        return None
    xs, ys = entry["curve"]["length"], entry["curve"][metric]
    if not xs or not xs[0] <= length <= xs[-1]:
        return None
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if x0 <= length <= x1:
            return float(y0 + (y1 - y0) * (length - x0) / (x1 - x0)) if x1 > x0 else float(y0)
    return float(ys[0])


def _same_config(entry: Mapping[str, Any], config: str | Offload) -> bool:
    if isinstance(config, str):
        return bool(entry["label"] == config)
    return all(entry[f.name] == getattr(config, f.name) for f in dataclasses.fields(Offload))


# --------------------------------------------------------------------------------------------------
# the whole theory, as one JSON-able record

THEORY_SCHEMA = "xover.theory/1"
INTENSITY_UBATCHES = (1, 8, 32, 64, 128, 256, 512, 1024, 2048)


def expert_rows(terms: ModelTerms, hw: Hardware, n_cpu_moe: Sequence[int], ubatch: int) -> list[dict[str, Any]]:
    """Per ``--n-cpu-moe`` value: the CPU-resident experts, what decode and one ubatch read of them, and
    what that ubatch costs copied (op offload, pinned and pageable) or computed on the CPU."""
    rows = []
    for n in n_cpu_moe:
        _check_ncmoe(terms, n)
        moved = expert_transfer_bytes(terms, n, ubatch)
        cpu_f = 2.0 * ubatch * terms.active_fraction * sum(terms.expert_params_layer[:n])
        rows.append(
            {
                "n_cpu_moe": n,
                "cpu_expert_bytes": cpu_expert_bytes(terms, n),
                "decode_bytes": terms.active_fraction * cpu_expert_bytes(terms, n),
                "ubatch": ubatch,
                "ubatch_bytes": moved,
                "copy_s_pinned": moved / hw.gpu.h2d_pinned_bytes_per_s if hw.gpu else None,
                "copy_s_pageable": moved / hw.gpu.h2d_pageable_bytes_per_s if hw.gpu else None,
                "cpu_compute_s": _roof(cpu_f, moved, hw.cpu.flops_per_s, hw.cpu.mem_bw_bytes_per_s),
            }
        )
    return rows


def architecture_terms(terms: ModelTerms, ubatch: int = 512) -> dict[str, Any]:
    """What the architecture changes in the theory: window-bounded and compressed KV, always-on shared experts,
    dense leading layers, NextN bytes, the MMQ tile set, and the expert bytes one ubatch copies per CPU layer."""
    first_moe = min(terms.dense_ffn_layers, terms.n_layer - 1)
    per_layer = expert_transfer_bytes(terms, first_moe + 1, ubatch) - expert_transfer_bytes(terms, first_moe, ubatch)
    return {
        "arch": terms.arch,
        "n_layer": terms.n_layer,
        "full_attention_layers": terms.n_layer_full,
        "swa_layers": terms.n_layer_swa,
        "swa_window": terms.swa_window,
        "mla": terms.is_mla,
        "kv_bytes_per_token": terms.kv_bytes_per_token,
        "kv_swa_bytes_per_cell": terms.kv_swa_bytes_per_cell,
        "shared_expert_bytes": terms.shared_expert_bytes,
        "dense_ffn_layers": terms.dense_ffn_layers,
        "nextn_bytes": terms.nextn_bytes,
        "expert_mmq": terms.expert_mmq,
        "mmq_tiles": list(MMQ_TILES_FALLBACK if terms.expert_mmq_fallback else MMQ_TILES) if terms.expert_mmq else [],
        "ubatch": ubatch,
        "ubatch_bytes_per_cpu_layer": per_layer,
    }


def theory_report(inputs: TheoryInputs) -> dict[str, Any]:
    """Decode and prefill intensity, ridges, expert coverage, attention growth, predictions and (with a
    VRAM budget) placement, as one JSON-able dict (``"schema": "xover.theory/1"``)."""
    terms, hw, configs, lengths = inputs.terms, inputs.hw, inputs.configs, inputs.lengths
    vram_budget_bytes, headroom_bytes = inputs.vram_budget_bytes, inputs.headroom_bytes
    ubatch = configs[0].ubatch if configs else 512
    ubatches = sorted({*INTENSITY_UBATCHES, *(c.ubatch for c in configs)})
    placement = None
    if vram_budget_bytes is not None and hw.gpu is not None:
        placement = {
            "budget_bytes": vram_budget_bytes,
            "headroom_bytes": headroom_bytes,
            "ubatch": ubatch,
            "rows": [
                {
                    "n_ctx": p.n_ctx,
                    "n_cpu_moe": p.n_cpu_moe,
                    **dataclasses.asdict(p.estimate),
                    "total_bytes": p.estimate.total_bytes,
                }
                for p in plan_placement(terms, vram_budget_bytes, lengths, ubatch, headroom_bytes=headroom_bytes)
            ],
        }
    return {
        "schema": THEORY_SCHEMA,
        "created_at": inputs.created_at,
        "model": dict(inputs.model),
        "hardware": hw.to_dict(),
        "decode": {
            "note": decode_intensity_note(terms),
            "rows": [
                {**dataclasses.asdict(d), "bytes": d.bytes, "flops": d.flops}
                for d in (decode_intensity(terms, L) for L in (0, *lengths))
            ],
        },
        "prefill": {
            "rows": [dataclasses.asdict(prefill_intensity(terms, b)) for b in ubatches],
            "ridges": [
                {
                    "name": r.name,
                    "flop_per_byte": r.flop_per_byte,
                    "compute_bound_ubatch": compute_bound_ubatch(terms, r),
                }
                for r in ridges(hw)
            ],
        },
        "experts": {
            "n_expert": terms.n_expert,
            "n_expert_used": terms.n_expert_used,
            "coverage": {str(b): coverage(b, terms.n_expert, terms.n_expert_used) for b in ubatches},
            "mmq_tile_padding": (
                {
                    str(b): expert_tile_padding(
                        b, terms.n_expert, terms.n_expert_used, mmq_tile(b, terms.expert_mmq_fallback)
                    )
                    for b in ubatches
                }
                if hw.gpu is not None and pads_expert_tiles(hw.gpu.name) and terms.expert_mmq
                else {}
            ),
            "rows": expert_rows(terms, hw, sorted({c.n_cpu_moe for c in configs}), ubatch),
        },
        "architecture": architecture_terms(terms, ubatch),
        "attention": {"ubatch": ubatch, "rows": [dataclasses.asdict(attention_row(terms, L, ubatch)) for L in lengths]},
        "placement": placement,
        "prediction": build_prediction(inputs),
    }
