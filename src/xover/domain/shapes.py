"""Shape arithmetic of llama.cpp transformer models: tensors, parameters, bytes, KV cache, expert offload.

Pure: nothing here touches a file. The arithmetic runs on a :class:`TensorTable` (hyperparameters plus
the list of tensors with their ggml types), which comes either from a :class:`ModelShape` (synthetic
models, :func:`tensor_table`) or from a real GGUF's header (:mod:`xover.gguf.inspect`).

Conventions (all sizes in bytes, all counts in parameters = tensor elements):

- *Expert tensors* are those ``--n-cpu-moe`` moves: names matching llama.cpp's
  ``blk\\.N\\.ffn_(up|down|gate|gate_up)_(ch|)exps`` (``common/common.h``), weights and biases alike.
  Shared experts (``*_shexp``) and the router (``ffn_gate_inp``) are not expert tensors.
- *Active parameters per token* (:func:`active_params`): every non-expert tensor, plus
  ``n_expert_used / n_expert`` of the expert tensors, with the token embedding counted as the one row a
  token looks up (``n_embd`` parameters). The two other usual conventions are reported next to it:
  without the embedding at all, and with the whole embedding matrix (what model cards call "A3B").
- *Bytes read per decoded token* (:func:`bytes_per_token`): the same rule applied to bytes, i.e. the
  weight traffic of one decode step at batch size 1. With tied embeddings (no ``output.weight``) the
  embedding matrix doubles as the output projection and is read whole.
- *Shared experts* (``ffn_*_shexp``) and the FFNs of leading dense layers run for every token and stay on
  the GPU under ``--n-cpu-moe``; they count whole in the active figures.
- *NextN / MTP layers* (``nextn_predict_layers`` blocks appended after the trunk, GLM-4.5): llama.cpp counts
  them in the file's size and parameters (llama-bench's ``model_size`` / ``model_n_params``) but skips
  loading them unless multi-token prediction is requested, so they are in :func:`total_bytes` and
  :func:`total_params` but neither in the active figures nor in the GPU bytes of :func:`ncmoe_table`.
- *KV cache*: MLA models (``deepseek2`` with ``key_length_mla``) cache only K, one compressed row of
  ``kv_lora_rank + rope_dim`` per layer (``src/llama-kv-cache.cpp``: ``has_v = !is_mla``). Sliding-window
  layers cache at most ``n_swa + n_ubatch`` cells, padded to 256 (``src/llama-kv-cache-iswa.cpp``), so their
  cost is bounded: :func:`kv_cache_bytes` gives the total at a context length.
- llama.cpp keeps ``token_embd`` in host memory even with every layer offloaded (``dev_input`` is always
  the CPU in ``llama-model.cpp``), so GPU-resident bytes never include it, except for the duplicate the
  output layer gets when embeddings are tied.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from xover.errors import XoverError

ARCHITECTURES = ("qwen3moe", "qwen3", "gpt-oss", "glm4moe", "deepseek2")
"""Architectures :class:`ModelShape` can describe (and :mod:`xover.gguf.synth` can write)."""

MAX_LAYERS = 512  # LLAMA_MAX_LAYERS (src/llama-hparams.h)
MAX_EXPERTS = 1024  # LLAMA_MAX_EXPERTS (src/llama-hparams.h)

_EXPERT_RE = re.compile(r"blk\.(\d+)\.ffn_(up|down|gate|gate_up)_(ch|)exps")
_SHEXP_RE = re.compile(r"blk\.(\d+)\.ffn_(up|down|gate|gate_up)_shexp")
_LAYER_RE = re.compile(r"^blk\.(\d+)\.")


# --------------------------------------------------------------------------------------------------
# ggml types


def type_sizes(ggml_type: str) -> tuple[int, int]:
    """``(elements per block, bytes per block)`` of a ggml type name such as ``"Q4_K"``."""
    try:
        return GGML_QUANT_SIZES[GGMLQuantizationType[ggml_type]]
    except KeyError:
        raise XoverError(f"unknown ggml type {ggml_type!r}: use a name such as Q4_K, Q6_K, Q8_0, F16 or F32") from None


def tensor_nbytes(ne: Sequence[int], ggml_type: str) -> int:
    """Bytes of a tensor's data; ``ne[0]`` (the row length) must be a whole number of blocks."""
    block, size = type_sizes(ggml_type)
    if ne[0] % block:
        raise XoverError(f"row length {ne[0]} is not a multiple of the {ggml_type} block size {block}")
    return math.prod(ne) // block * size


# --------------------------------------------------------------------------------------------------
# tensor tables


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """One tensor of a model: name, shape in ggml order (``ne[0]`` is the row length), type, data bytes."""

    name: str
    ne: tuple[int, ...]
    ggml_type: str
    nbytes: int

    @property
    def n_elements(self) -> int:
        return math.prod(self.ne)

    @property
    def layer(self) -> int | None:
        """The block index of ``blk.N.*`` tensors, else None."""
        m = _LAYER_RE.match(self.name)
        return int(m.group(1)) if m else None

    @property
    def is_expert(self) -> bool:
        """Whether ``--n-cpu-moe`` moves this tensor (llama.cpp's ``LLM_FFN_EXPS_REGEX``)."""
        return _EXPERT_RE.search(self.name) is not None

    @property
    def is_shared_expert(self) -> bool:
        """A shared-expert tensor (``ffn_*_shexp``): runs for every token, stays on the GPU."""
        return _SHEXP_RE.search(self.name) is not None


@dataclasses.dataclass(frozen=True)
class Geometry:
    """A model's geometry as llama.cpp loads it: what :class:`Hyperparams` and the theory's view of a model
    (:class:`xover.analysis.theory.ModelTerms`) both start with."""

    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    n_expert: int  # 0 for dense models
    n_expert_used: int  # 0 for dense models
    n_vocab: int
    n_ctx_train: int

    def geometry(self) -> dict[str, Any]:
        """These fields by name, to start another record of the same model with."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(Geometry)}


@dataclasses.dataclass(frozen=True)
class Hyperparams(Geometry):
    """The hyperparameters the arithmetic needs beyond the tensor table: the geometry, and the features below."""

    # Per-architecture features; the defaults describe a plain transformer (qwen3, qwen3moe). ``n_layer``
    # counts the trunk only: NextN/MTP blocks come on top (``block_count = n_layer + n_layer_nextn``).
    n_layer_dense_lead: int = 0  # leading layers with a dense FFN instead of experts
    n_ff_exp: int = 0  # width of one routed expert
    n_expert_shared: int = 0  # shared experts per MoE layer (always run; never moved by --n-cpu-moe)
    n_ff_shexp: int = 0  # width of the shared-expert FFN of a layer (all shared experts together)
    n_layer_nextn: int = 0  # NextN / MTP blocks after the trunk (not loaded by default)
    swa_window: int = 0  # sliding-window size (tokens), 0 without SWA
    swa_layers: tuple[int, ...] = ()  # the trunk layers that use the window
    rope_dim: int = 0  # rotary dimensions per head (n_rot); 0: the whole head
    kv_lora_rank: int = 0  # MLA: compressed KV rank (the cached row is kv_lora_rank + rope_dim)
    q_lora_rank: int = 0  # MLA: compressed Q rank, 0 when Q is projected directly (DeepSeek-V2-Lite)
    head_dim_k_mla: int = 0  # MLA: the per-head K size after decompression (qk_nope + qk_rope)
    head_dim_v_mla: int = 0  # MLA: the per-head V size after decompression

    @property
    def is_mla(self) -> bool:
        """llama.cpp's ``is_mla()``: MLA head sizes are set; the cache then holds K only."""
        return self.head_dim_k_mla > 0 and self.head_dim_v_mla > 0

    @property
    def dense_layers(self) -> tuple[int, ...]:
        """Trunk layers whose FFN is dense (every layer of a dense model)."""
        return tuple(range(self.n_layer if not self.n_expert else min(self.n_layer_dense_lead, self.n_layer)))

    @property
    def full_attention_layers(self) -> int:
        """Trunk layers whose KV cache grows with the context."""
        return self.n_layer - len(self.swa_layers)


@dataclasses.dataclass(frozen=True)
class TensorTable:
    """Hyperparameters plus every tensor: all that the footprint arithmetic reads."""

    hparams: Hyperparams
    tensors: tuple[TensorInfo, ...]

    def get(self, name: str) -> TensorInfo | None:
        return next((t for t in self.tensors if t.name == name), None)


def is_nextn(table: TensorTable, t: TensorInfo) -> bool:
    """Whether ``t`` belongs to a NextN/MTP block (``blk.N`` with N past the trunk), which llama.cpp skips."""
    layer = t.layer
    return table.hparams.n_layer_nextn > 0 and layer is not None and layer >= table.hparams.n_layer


def _used(table: TensorTable) -> list[TensorInfo]:
    """The tensors a forward pass uses: all but those of NextN/MTP blocks."""
    return [t for t in table.tensors if not is_nextn(table, t)]


def nextn_bytes(table: TensorTable) -> int:
    """Bytes of NextN/MTP blocks: in the file, not loaded unless multi-token prediction is on."""
    return sum(t.nbytes for t in table.tensors if is_nextn(table, t))


def shared_expert_bytes(table: TensorTable) -> int:
    """Bytes of shared-expert tensors in the trunk (on the GPU whatever ``--n-cpu-moe`` says)."""
    return sum(t.nbytes for t in _used(table) if t.is_shared_expert)


def shared_expert_params(table: TensorTable) -> int:
    return sum(t.n_elements for t in _used(table) if t.is_shared_expert)


def total_params(table: TensorTable) -> int:
    """Elements in all tensors."""
    return sum(t.n_elements for t in table.tensors)


def expert_params(table: TensorTable) -> int:
    """Elements in the trunk's expert tensors (NextN/MTP blocks' experts are in :func:`nextn_bytes`)."""
    return sum(t.n_elements for t in _used(table) if t.is_expert)


def total_bytes(table: TensorTable) -> int:
    """Bytes of all tensor data (a GGUF adds its header and alignment padding to this)."""
    return sum(t.nbytes for t in table.tensors)


def expert_bytes(table: TensorTable) -> int:
    """Bytes of the trunk's expert tensors: what ``--n-cpu-moe`` with every layer (``-cmoe``) moves."""
    return sum(t.nbytes for t in _used(table) if t.is_expert)


def expert_bytes_per_layer(table: TensorTable) -> tuple[int, ...]:
    """Bytes of expert tensors in each trunk block, indexed by layer (0 for dense blocks)."""
    per_layer = [0] * table.hparams.n_layer
    for t in _used(table):
        if t.is_expert:
            layer = t.layer
            assert layer is not None  # the expert pattern includes blk.N
            if layer >= len(per_layer):
                per_layer.extend([0] * (layer + 1 - len(per_layer)))
            per_layer[layer] += t.nbytes
    return tuple(per_layer)


def has_tied_embeddings(table: TensorTable) -> bool:
    """True when there is no ``output.weight``: llama.cpp then reuses ``token_embd`` as the output matrix."""
    return table.get("output.weight") is None


def _expert_fraction(hp: Hyperparams, amount: int) -> int:
    """``n_expert_used / n_expert`` of an expert amount, rounded down (exact for equal-sized experts)."""
    return amount * hp.n_expert_used // hp.n_expert if hp.n_expert else amount


def active_params(table: TensorTable, embedding: Literal["row", "none", "full"] = "row") -> int:
    """Parameters one token uses: non-expert tensors plus ``n_expert_used / n_expert`` of the experts.

    ``embedding`` says how ``token_embd`` counts: ``"row"`` (default) the ``n_embd`` values a token looks
    up, ``"none"`` not at all, ``"full"`` the whole matrix (the model-card convention). With tied
    embeddings the matrix is also the output projection, so ``"row"`` counts it whole.
    """
    embd = table.get("token_embd.weight")
    embd_params = embd.n_elements if embd is not None else 0
    used = _used(table)
    dense = sum(t.n_elements for t in used if not t.is_expert) - embd_params
    if embedding == "full" or (embedding == "row" and has_tied_embeddings(table)):
        dense += embd_params
    elif embedding == "row" and embd is not None:
        dense += embd.ne[0]
    return dense + _expert_fraction(table.hparams, sum(t.n_elements for t in used if t.is_expert))


def bytes_per_token(table: TensorTable) -> int:
    """Weight bytes one decode step reads at batch size 1 (same convention as :func:`active_params`)."""
    embd = table.get("token_embd.weight")
    embd_bytes = embd.nbytes if embd is not None else 0
    used = _used(table)
    dense = sum(t.nbytes for t in used if not t.is_expert) - embd_bytes
    if has_tied_embeddings(table):
        dense += embd_bytes
    elif embd is not None:
        dense += embd.nbytes // embd.ne[1]  # one row
    return dense + _expert_fraction(table.hparams, sum(t.nbytes for t in used if t.is_expert))


def input_embd_bytes(table: TensorTable) -> int:
    """Bytes of ``token_embd``, which llama.cpp always keeps in host memory."""
    embd = table.get("token_embd.weight")
    return embd.nbytes if embd is not None else 0


def _kv_row_elements(geom: Geometry, is_mla: bool) -> tuple[int, ...]:
    """Elements one token adds to one layer's cache: (K, V), or (K,) for MLA (compressed, K only)."""
    if is_mla:
        return (geom.n_head_kv * geom.head_dim_k,)  # kv_lora_rank + rope_dim, one "head"
    return (geom.n_head_kv * geom.head_dim_k, geom.n_head_kv * geom.head_dim_v)


def kv_layer_bytes(
    geom: Geometry, is_mla: bool, cache_type_k: str = "F16", cache_type_v: str | None = None
) -> int | None:
    """Cache bytes per token of one layer with K cached as ``cache_type_k`` and V as ``cache_type_v`` (``-ctk``,
    ``-ctv``; V as K when None), or None when a row is not a whole number of its type's blocks, as llama.cpp then
    refuses the type. MLA caches K only."""
    total = 0
    for rows, cache_type in zip(_kv_row_elements(geom, is_mla), (cache_type_k, cache_type_v or cache_type_k)):
        block, size = type_sizes(cache_type.upper())
        if rows % block:
            return None
        total += rows // block * size
    return total


def _kv_layer_bytes(hp: Hyperparams, cache_type: str) -> int | None:
    return kv_layer_bytes(hp, hp.is_mla, cache_type)


def kv_bytes_per_token(hp: Hyperparams, cache_type: str = "F16") -> int | None:
    """KV cache bytes per token of context in the layers whose cache grows with it.

    Each full-attention trunk layer stores ``n_head_kv * (head_dim_k + head_dim_v)`` elements per token;
    an MLA layer stores only ``kv_lora_rank + rope_dim`` (K only). Sliding-window layers are left out: their
    cache is bounded (:func:`kv_swa_bytes_per_cell`, :func:`kv_cache_bytes`). ``cache_type`` is a ggml type
    name (``F16``, ``Q8_0`` = 34 bytes per 32 elements, ...). None when a K or V row is not a whole number
    of blocks, as llama.cpp then refuses the type.
    """
    per_layer = _kv_layer_bytes(hp, cache_type)
    return None if per_layer is None else hp.full_attention_layers * per_layer


def kv_swa_bytes_per_cell(hp: Hyperparams, cache_type: str = "F16") -> int | None:
    """Bytes of one cache cell summed over the sliding-window layers (0 without SWA)."""
    per_layer = _kv_layer_bytes(hp, cache_type)
    return None if per_layer is None else len(hp.swa_layers) * per_layer


def kv_swa_cells(hp: Hyperparams, n_ctx: int, n_ubatch: int = 512, n_seq: int = 1, swa_full: bool = False) -> int:
    """Cells of the SWA cache at a context of ``n_ctx`` cells: llama.cpp's
    ``GGML_PAD(min(n_ctx, n_swa * n_seq + n_ubatch), 256)`` (unified cache), ``n_ctx`` with ``--swa-full``."""
    if not hp.swa_layers or swa_full:
        return n_ctx
    return -(-min(n_ctx, hp.swa_window * n_seq + n_ubatch) // 256) * 256


def kv_cache_bytes(
    hp: Hyperparams, n_ctx: int, cache_type: str = "F16", n_ubatch: int = 512, n_seq: int = 1, swa_full: bool = False
) -> int | None:
    """KV cache bytes of a context of ``n_ctx`` cells: full-attention layers grow with ``n_ctx``,
    sliding-window layers stop at the window plus one ubatch (:func:`kv_swa_cells`)."""
    full, swa = kv_bytes_per_token(hp, cache_type), kv_swa_bytes_per_cell(hp, cache_type)
    if full is None or swa is None:
        return None
    return full * n_ctx + swa * kv_swa_cells(hp, n_ctx, n_ubatch, n_seq, swa_full)


@dataclasses.dataclass(frozen=True)
class NcmoeRow:
    """Weight placement under ``--n-cpu-moe N`` with every layer offloaded (``-ngl`` all)."""

    n_cpu_moe: int
    cpu_expert_bytes: int  # expert tensors of the first N layers, kept in host memory
    gpu_bytes: int  # everything else except token_embd (host memory) and NextN blocks (not loaded)


def ncmoe_table(table: TensorTable) -> tuple[NcmoeRow, ...]:
    """One row per ``N`` in ``0..n_layer``: expert bytes moved to the CPU and the bytes left on the GPU."""
    per_layer = expert_bytes_per_layer(table)
    on_gpu_at_zero = total_bytes(table) - input_embd_bytes(table) - nextn_bytes(table)
    if has_tied_embeddings(table):
        on_gpu_at_zero += input_embd_bytes(table)  # the output layer's duplicate
    rows = []
    cpu = 0
    for n in range(table.hparams.n_layer + 1):
        rows.append(NcmoeRow(n_cpu_moe=n, cpu_expert_bytes=cpu, gpu_bytes=on_gpu_at_zero - cpu))
        if n < len(per_layer):
            cpu += per_layer[n]
    return tuple(rows)


@dataclasses.dataclass(frozen=True)
class Footprint:
    """Everything derived from a tensor table (bytes, parameters, KV cache, offload table)."""

    total_params: int
    expert_params: int
    active_params: int  # token embedding counted as one row (see module docstring)
    active_params_no_embd: int
    active_params_full_embd: int
    total_bytes: int  # tensor data only
    expert_bytes: int
    expert_bytes_per_layer: tuple[int, ...]
    input_embd_bytes: int  # token_embd, always host-resident
    bytes_per_token: int  # weights read per decoded token at batch size 1
    kv_bytes_per_token_f16: int | None
    kv_bytes_per_token_q8_0: int | None
    tied_embeddings: bool
    ncmoe: tuple[NcmoeRow, ...]
    # Per-architecture parts (0 / empty for qwen3moe and qwen3)
    shared_expert_params: int = 0
    shared_expert_bytes: int = 0  # ffn_*_shexp: on the GPU whatever --n-cpu-moe says
    dense_ffn_layers: tuple[int, ...] = ()  # MoE models' leading dense layers: nothing for --n-cpu-moe to move
    nextn_bytes: int = 0  # NextN/MTP blocks: in the file, not loaded (not in ncmoe's gpu_bytes)
    kv_swa_bytes_per_cell_f16: int | None = 0  # the SWA layers' cache per cell (bounded: see kv_cache_bytes)
    kv_swa_bytes_per_cell_q8_0: int | None = 0


def footprint(table: TensorTable) -> Footprint:
    """All derived numbers of a model at once."""
    return Footprint(
        total_params=total_params(table),
        expert_params=expert_params(table),
        active_params=active_params(table, "row"),
        active_params_no_embd=active_params(table, "none"),
        active_params_full_embd=active_params(table, "full"),
        total_bytes=total_bytes(table),
        expert_bytes=expert_bytes(table),
        expert_bytes_per_layer=expert_bytes_per_layer(table),
        input_embd_bytes=input_embd_bytes(table),
        bytes_per_token=bytes_per_token(table),
        kv_bytes_per_token_f16=kv_bytes_per_token(table.hparams, "F16"),
        kv_bytes_per_token_q8_0=kv_bytes_per_token(table.hparams, "Q8_0"),
        tied_embeddings=has_tied_embeddings(table),
        ncmoe=ncmoe_table(table),
        shared_expert_params=shared_expert_params(table),
        shared_expert_bytes=shared_expert_bytes(table),
        dense_ffn_layers=table.hparams.dense_layers if table.hparams.n_expert else (),
        nextn_bytes=nextn_bytes(table),
        kv_swa_bytes_per_cell_f16=kv_swa_bytes_per_cell(table.hparams, "F16"),
        kv_swa_bytes_per_cell_q8_0=kv_swa_bytes_per_cell(table.hparams, "Q8_0"),
    )


# --------------------------------------------------------------------------------------------------
# model shapes (synthetic models)


def use_more_bits(layer: int, n_layer: int) -> bool:
    """llama-quant.cpp's rule for the layers whose ``attn_v`` / ``ffn_down`` get more bits in ``*_M`` mixes."""
    return layer < n_layer // 8 or layer >= 7 * n_layer // 8 or (layer - n_layer // 8) % 3 == 2


@dataclasses.dataclass(frozen=True)
class TypeMix:
    """ggml type per tensor role. The FFN roles cover dense FFNs, expert tensors (``ffn_*_exps``) and shared
    experts (``ffn_*_shexp``); ``expert``, when set, types the routed experts instead (gpt-oss's MXFP4).

    ``more_bits``, when set, replaces the type of ``attn_v`` and ``ffn_down`` (dense, expert and shared) in
    the layers :func:`use_more_bits` selects, as llama.cpp's Q4_K_M / Q5_K_M quantization does.
    MLA projections take the attention types (``attn_q_a``/``attn_q_b`` as ``attn_q``, ``attn_kv_a_mqa`` and
    ``attn_k_b`` as ``attn_k``, ``attn_v_b`` as ``attn_v``, without more bits); other matrices (NextN's
    ``eh_proj``) take ``other``; biases, attention sinks and expert-bias vectors take ``bias``.
    ``fallback`` demotes a type whose block does not divide a tensor's rows as llama-quant.cpp's
    ``tensor_type_fallback`` does (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, Q2_K/Q3_K -> Q4_0); without it
    such a shape is rejected. The defaults are a Q4_K_M-like mix.
    """

    token_embd: str = "Q4_K"
    output: str = "Q6_K"
    attn_q: str = "Q4_K"
    attn_k: str = "Q4_K"
    attn_v: str = "Q4_K"
    attn_output: str = "Q4_K"
    ffn_gate: str = "Q4_K"
    ffn_up: str = "Q4_K"
    ffn_down: str = "Q4_K"
    ffn_gate_inp: str = "F32"
    norm: str = "F32"
    more_bits: str | None = "Q6_K"
    expert: str | None = None
    other: str = "Q4_K"
    bias: str = "F32"
    fallback: bool = False

    def for_role(self, role: str, layer: int | None, n_layer: int, row: int | None = None) -> str:
        """The type of a tensor role (``attn_q``, ``ffn_down_exps``, ``attn_k_norm``, ...) in a layer;
        ``row`` (the tensor's ``ne[0]``) applies the fallback when ``fallback`` is set."""
        chosen = self._base_type(role, layer, n_layer)
        if self.fallback and row is not None and row % type_sizes(chosen)[0]:
            chosen = _FALLBACK.get(chosen, chosen)
            if row % type_sizes(chosen)[0]:
                chosen = "F16"
        return chosen

    def _base_type(self, role: str, layer: int | None, n_layer: int) -> str:
        if role.endswith("norm"):
            return self.norm
        if role in ("bias", "attn_sinks", "exp_probs_b"):
            return self.bias
        if role.endswith("_exps") and self.expert:
            return self.expert
        base = role.removesuffix("_exps").removesuffix("_shexp")
        if self.more_bits and base in ("attn_v", "ffn_down") and layer is not None and use_more_bits(layer, n_layer):
            return self.more_bits
        base = _MLA_ROLES.get(base, base)
        return str(getattr(self, base))


_MLA_ROLES = {
    "attn_q_a": "attn_q",
    "attn_q_b": "attn_q",
    "attn_kv_a_mqa": "attn_k",
    "attn_k_b": "attn_k",
    "attn_v_b": "attn_v",
    "nextn_eh_proj": "other",
}
_FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0", "Q2_K": "Q4_0", "Q3_K": "Q4_0"}


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """The geometry and type mix of a model of one of :data:`ARCHITECTURES`.

    ``n_ff`` is the dense FFN width (qwen3, and the leading dense layers of glm4moe / deepseek2); qwen3moe
    and gpt-oss only use ``n_ff_exp``. ``rope_base`` is ``rope.freq_base``; ``rms_eps`` the RMS-norm epsilon.

    The fields after ``types`` describe the other architectures and default to a plain transformer:

    - ``n_expert_shared``: shared experts per MoE layer, of width ``n_ff_exp`` each (glm4moe, deepseek2);
    - ``n_dense_lead``: leading layers with a dense FFN of ``n_ff`` (``leading_dense_block_count``);
    - ``n_nextn``: NextN/MTP blocks written after the ``n_layer`` trunk blocks (``nextn_predict_layers``);
    - ``swa_window`` / ``swa_pattern``: sliding window (tokens) in the layers where
      ``layer % swa_pattern < swa_pattern - 1`` (llama.cpp's ``set_swa_pattern``; gpt-oss: 2, even layers);
    - ``rope_dim``: rotary dimensions per head (GLM's partial rotary, MLA's ``qk_rope_head_dim``), 0 = all;
    - MLA (deepseek2): ``head_dim`` is ``qk_nope + qk_rope``, ``v_head_dim`` the value head,
      ``kv_lora_rank`` / ``q_lora_rank`` the compressed ranks (``q_lora_rank`` 0: Q projected directly);
    - ``expert_bias``: an ``exp_probs_b`` bias per expert (sigmoid routing: GLM-4.5, DeepSeek-V3).
    """

    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_expert: int
    n_expert_used: int
    n_ff_exp: int
    n_vocab: int
    n_ctx_train: int
    rope_base: float
    rms_eps: float
    types: TypeMix = TypeMix()
    n_expert_shared: int = 0
    n_dense_lead: int = 0
    n_nextn: int = 0
    swa_window: int = 0
    swa_pattern: int = 0
    rope_dim: int = 0
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    v_head_dim: int = 0
    expert_bias: bool = False

    @property
    def is_moe(self) -> bool:
        return self.arch != "qwen3"

    @property
    def is_mla(self) -> bool:
        return self.arch == "deepseek2"

    @property
    def n_rot(self) -> int:
        return self.rope_dim or self.head_dim

    @property
    def head_dim_v(self) -> int:
        return self.v_head_dim or self.head_dim

    @property
    def block_count(self) -> int:
        """Blocks in the file: the trunk plus NextN/MTP blocks."""
        return self.n_layer + self.n_nextn

    def layer_is_moe(self, layer: int) -> bool:
        return self.is_moe and layer >= self.n_dense_lead

    def swa_layers(self) -> tuple[int, ...]:
        if not self.swa_window:
            return ()
        p = self.swa_pattern
        return tuple(i for i in range(self.n_layer) if p == 0 or i % p < p - 1)

    def hparams(self) -> Hyperparams:
        mla = self.is_mla
        return Hyperparams(
            arch=self.arch,
            n_layer=self.n_layer,
            n_embd=self.n_embd,
            n_head=self.n_head,
            n_head_kv=self.n_head_kv,
            head_dim_k=self.kv_lora_rank + self.n_rot if mla else self.head_dim,
            head_dim_v=self.kv_lora_rank if mla else self.head_dim,
            n_expert=self.n_expert if self.is_moe else 0,
            n_expert_used=self.n_expert_used if self.is_moe else 0,
            n_vocab=self.n_vocab,
            n_ctx_train=self.n_ctx_train,
            n_layer_dense_lead=self.n_dense_lead if self.is_moe else 0,
            n_ff_exp=self.n_ff_exp if self.is_moe else 0,
            n_expert_shared=self.n_expert_shared,
            n_ff_shexp=self.n_ff_exp * self.n_expert_shared,
            n_layer_nextn=self.n_nextn,
            swa_window=self.swa_window,
            swa_layers=self.swa_layers(),
            rope_dim=self.rope_dim,
            kv_lora_rank=self.kv_lora_rank,
            q_lora_rank=self.q_lora_rank,
            head_dim_k_mla=self.head_dim if mla else 0,
            head_dim_v_mla=self.head_dim_v if mla else 0,
        )


Role = tuple[str, str, tuple[int, ...]]  # (name without "blk.N.", type role, ne)


def _attention(shape: ModelShape) -> list[Role]:
    d, hd = shape.n_embd, shape.head_dim
    q, kv = hd * shape.n_head, hd * shape.n_head_kv
    if shape.arch in ("qwen3moe", "qwen3"):  # src/models/qwen3*.cpp
        return [
            ("attn_q.weight", "attn_q", (d, q)),
            ("attn_k.weight", "attn_k", (d, kv)),
            ("attn_v.weight", "attn_v", (d, kv)),
            ("attn_output.weight", "attn_output", (q, d)),
            ("attn_k_norm.weight", "attn_k_norm", (hd,)),
            ("attn_q_norm.weight", "attn_q_norm", (hd,)),
        ]
    if shape.arch == "deepseek2":  # src/models/deepseek2.cpp, with the split k_b / v_b of current GGUFs
        rope, nope, lora, vh, h = shape.n_rot, hd - shape.n_rot, shape.kv_lora_rank, shape.head_dim_v, shape.n_head
        out: list[Role] = []
        if shape.q_lora_rank:
            out.append(("attn_q_a_norm.weight", "attn_q_a_norm", (shape.q_lora_rank,)))
        out.append(("attn_kv_a_norm.weight", "attn_kv_a_norm", (lora,)))
        if shape.q_lora_rank:
            out += [
                ("attn_q_a.weight", "attn_q_a", (d, shape.q_lora_rank)),
                ("attn_q_b.weight", "attn_q_b", (shape.q_lora_rank, h * hd)),
            ]
        else:
            out.append(("attn_q.weight", "attn_q", (d, h * hd)))
        return out + [
            ("attn_kv_a_mqa.weight", "attn_kv_a_mqa", (d, lora + rope)),
            ("attn_k_b.weight", "attn_k_b", (nope, lora, h)),
            ("attn_v_b.weight", "attn_v_b", (lora, vh, h)),
            ("attn_output.weight", "attn_output", (h * vh, d)),
        ]
    # gpt-oss (src/models/openai-moe.cpp) and glm4moe (glm4-moe.cpp): q/k/v biases from create_tensor_qkv
    out = [
        ("attn_q.weight", "attn_q", (d, q)),
        ("attn_k.weight", "attn_k", (d, kv)),
        ("attn_v.weight", "attn_v", (d, kv)),
        ("attn_q.bias", "bias", (q,)),
        ("attn_k.bias", "bias", (kv,)),
        ("attn_v.bias", "bias", (kv,)),
        ("attn_output.weight", "attn_output", (q, d)),
    ]
    if shape.arch == "gpt-oss":
        out += [("attn_output.bias", "bias", (d,)), ("attn_sinks.weight", "attn_sinks", (shape.n_head,))]
    return out


def _ffn(shape: ModelShape, layer: int) -> list[Role]:
    d = shape.n_embd
    if not shape.layer_is_moe(layer):
        f = shape.n_ff
        return [
            ("ffn_gate.weight", "ffn_gate", (d, f)),
            ("ffn_down.weight", "ffn_down", (f, d)),
            ("ffn_up.weight", "ffn_up", (d, f)),
        ]
    e, f = shape.n_expert, shape.n_ff_exp
    out: list[Role] = [("ffn_gate_inp.weight", "ffn_gate_inp", (d, e))]
    if shape.arch == "gpt-oss":
        out.append(("ffn_gate_inp.bias", "bias", (e,)))
    if shape.expert_bias:
        out.append(("exp_probs_b.bias", "exp_probs_b", (e,)))
    out += [
        ("ffn_gate_exps.weight", "ffn_gate_exps", (d, f, e)),
        ("ffn_down_exps.weight", "ffn_down_exps", (f, d, e)),
        ("ffn_up_exps.weight", "ffn_up_exps", (d, f, e)),
    ]
    if shape.arch == "gpt-oss":
        out += [
            ("ffn_gate_exps.bias", "bias", (f, e)),
            ("ffn_down_exps.bias", "bias", (d, e)),
            ("ffn_up_exps.bias", "bias", (f, e)),
        ]
    if shape.n_expert_shared:
        s = f * shape.n_expert_shared
        out += [
            ("ffn_gate_shexp.weight", "ffn_gate_shexp", (d, s)),
            ("ffn_down_shexp.weight", "ffn_down_shexp", (s, d)),
            ("ffn_up_shexp.weight", "ffn_up_shexp", (d, s)),
        ]
    return out


def _layer_roles(shape: ModelShape, layer: int = 0) -> list[Role]:
    """``(name, role, ne)`` of each tensor in one block, in llama.cpp's load order (``src/models/<arch>.cpp``)."""
    d = shape.n_embd
    norm = [("attn_norm.weight", "attn_norm", (d,))]
    if shape.arch in ("qwen3moe", "qwen3"):
        return norm + _attention(shape) + [("ffn_norm.weight", "ffn_norm", (d,))] + _ffn(shape, layer)
    if shape.arch == "deepseek2":
        return norm + _attention(shape) + [("ffn_norm.weight", "ffn_norm", (d,))] + _ffn(shape, layer)
    roles = (
        norm + _attention(shape) + [("post_attention_norm.weight", "post_attention_norm", (d,))] + _ffn(shape, layer)
    )
    if layer >= shape.n_layer:  # NextN/MTP block (glm4-moe.cpp); embed_tokens / shared_head_head are optional
        roles += [
            ("nextn.eh_proj.weight", "nextn_eh_proj", (2 * d, d)),
            ("nextn.enorm.weight", "nextn_enorm", (d,)),
            ("nextn.hnorm.weight", "nextn_hnorm", (d,)),
            ("nextn.shared_head_norm.weight", "nextn_shared_head_norm", (d,)),
        ]
    return roles


def _tensor(name: str, ne: tuple[int, ...], ggml_type: str) -> TensorInfo:
    return TensorInfo(name=name, ne=ne, ggml_type=ggml_type, nbytes=tensor_nbytes(ne, ggml_type))


def tensor_infos(shape: ModelShape) -> tuple[TensorInfo, ...]:
    """Every tensor llama.cpp's loader expects for the shape, named and shaped as in the GGUF."""
    validate(shape)
    mix, d, v, n = shape.types, shape.n_embd, shape.n_vocab, shape.n_layer
    out = [
        _tensor("token_embd.weight", (d, v), mix.for_role("token_embd", None, n, d)),
        _tensor("output_norm.weight", (d,), mix.norm),
        _tensor("output.weight", (d, v), mix.for_role("output", None, n, d)),
    ]
    for i in range(shape.block_count):
        for name, role, ne in _layer_roles(shape, i):
            out.append(_tensor(f"blk.{i}.{name}", ne, mix.for_role(role, i, n, ne[0])))
    return tuple(out)


def tensor_table(shape: ModelShape) -> TensorTable:
    """The shape as the footprint arithmetic sees it."""
    return TensorTable(hparams=shape.hparams(), tensors=tensor_infos(shape))


MIN_VOCAB = 256 + 2
"""256 byte tokens, one merged token and an end-of-text token (see :mod:`xover.gguf.synth`)."""

# The shape field that sets each role's row length (ne[0]) where it is not n_embd, for error messages.
_ROW_FIELDS = {
    "attn_output": "n_head * head_dim",
    "attn_k_norm": "head_dim",
    "attn_q_norm": "head_dim",
    "ffn_down": "n_ff",
    "ffn_down_exps": "n_ff_exp",
    "ffn_down_shexp": "n_ff_exp * n_expert_shared",
    "attn_k_b": "head_dim - rope_dim",
    "attn_v_b": "kv_lora_rank",
    "attn_q_b": "q_lora_rank",
}


def _shape_problems(shape: ModelShape) -> Iterable[str]:
    """One message per problem, each saying what to change."""
    if shape.arch not in ARCHITECTURES:
        yield f"arch {shape.arch!r} is not supported: choose one of {', '.join(ARCHITECTURES)}"
        return
    ints: tuple[str, ...] = ("n_layer", "n_embd", "n_head", "n_head_kv", "head_dim", "n_vocab", "n_ctx_train")
    ints += ("n_expert", "n_expert_used", "n_ff_exp") if shape.is_moe else ("n_ff",)
    if shape.n_dense_lead:
        ints += ("n_ff",)
    if shape.is_mla:
        ints += ("kv_lora_rank", "rope_dim", "v_head_dim")
    for name in ints:
        value = getattr(shape, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            yield f"{name} must be a whole number of at least 1 (got {value!r})"
            return
    for name in (
        "n_expert_shared",
        "n_dense_lead",
        "n_nextn",
        "swa_window",
        "swa_pattern",
        "rope_dim",
        "kv_lora_rank",
        "q_lora_rank",
        "v_head_dim",
    ):
        value = getattr(shape, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            yield f"{name} must be a whole number of at least 0 (got {value!r})"
            return
    if shape.block_count > MAX_LAYERS:
        yield f"n_layer {shape.block_count} exceeds llama.cpp's limit of {MAX_LAYERS}"
    if shape.n_head_kv > 0 and shape.n_head % shape.n_head_kv:
        yield f"n_head {shape.n_head} must be a multiple of n_head_kv {shape.n_head_kv}"
    if shape.is_moe:
        if shape.n_expert > MAX_EXPERTS:
            yield f"n_expert {shape.n_expert} exceeds llama.cpp's limit of {MAX_EXPERTS}"
        if shape.n_expert_used > shape.n_expert:
            yield f"n_expert_used {shape.n_expert_used} exceeds n_expert {shape.n_expert}: lower n_expert_used"
    if shape.n_vocab < MIN_VOCAB:
        yield f"n_vocab {shape.n_vocab} is too small: the byte-level tokenizer needs at least {MIN_VOCAB}"
    if not (shape.rms_eps > 0 and shape.rope_base > 0):
        yield "rms_eps and rope_base must be positive"
    yield from _arch_problems(shape)


def _arch_problems(shape: ModelShape) -> Iterable[str]:
    """What each architecture's loader insists on (src/models/<arch>.cpp)."""
    a = shape.arch
    if a != "deepseek2" and (shape.kv_lora_rank or shape.q_lora_rank or shape.v_head_dim):
        yield f"kv_lora_rank, q_lora_rank and v_head_dim are MLA fields: {a} has no MLA (use arch deepseek2)"
    if a in ("qwen3moe", "qwen3", "gpt-oss") and (shape.n_expert_shared or shape.n_dense_lead or shape.n_nextn):
        yield f"{a} has no shared experts, leading dense layers or NextN layers: set them to 0"
    if a != "gpt-oss" and (shape.swa_window or shape.swa_pattern):
        yield f"{a} has no sliding-window attention in llama.cpp: set swa_window and swa_pattern to 0"
    if a in ("qwen3moe", "qwen3") and shape.expert_bias:
        yield f"{a} has no expert bias: set expert_bias to false"
    if a == "gpt-oss" and not shape.swa_window:
        yield "gpt-oss needs a sliding window (swa_window, 128 in the published models)"
    if a == "glm4moe" and not shape.expert_bias:
        yield "glm4moe's loader requires exp_probs_b in every MoE layer: set expert_bias to true"
    if a == "glm4moe" and shape.n_nextn > 1:
        yield "glm4moe supports at most one NextN layer in llama.cpp: set n_nextn to 0 or 1"
    if a == "deepseek2" and shape.n_nextn:
        yield "deepseek2 GGUFs carry no NextN layers (convert_hf_to_gguf.py skips them): set n_nextn to 0"
    if shape.is_mla:
        if shape.n_head_kv != 1:
            yield f"deepseek2 (MLA) GGUFs have n_head_kv 1, not {shape.n_head_kv}: set n_head_kv=1"
        if shape.rope_dim >= shape.head_dim:
            yield f"rope_dim {shape.rope_dim} must be smaller than head_dim {shape.head_dim} (qk_nope + qk_rope)"
    if shape.n_dense_lead > shape.n_layer:
        yield f"n_dense_lead {shape.n_dense_lead} exceeds n_layer {shape.n_layer}"
    if shape.rope_dim > shape.head_dim or shape.rope_dim % 2:
        yield f"rope_dim {shape.rope_dim} must be even and at most head_dim {shape.head_dim}"


def _type_problems(shape: ModelShape) -> Iterable[str]:
    mix = shape.types
    for field in dataclasses.fields(mix):
        name = getattr(mix, field.name)
        if isinstance(name, bool):
            continue
        if name is not None and name not in GGMLQuantizationType.__members__:
            yield f"types.{field.name} = {name!r} is not a ggml type: use e.g. Q4_K, Q6_K, Q8_0, F16 or F32"
            return
    layers = sorted({0, shape.n_dense_lead, shape.n_layer - 1, *range(shape.n_layer, shape.block_count)})
    roles: list[tuple[str, tuple[int, ...]]] = [("token_embd", (shape.n_embd,)), ("output", (shape.n_embd,))]
    roles += list(
        {role: ne for i in layers if 0 <= i < shape.block_count for _, role, ne in _layer_roles(shape, i)}.items()
    )
    for role, ne in roles:
        used = sorted({mix.for_role(role, layer, shape.n_layer, ne[0]) for layer in range(shape.n_layer)})
        for ggml_type in used:
            block = type_sizes(ggml_type)[0]
            if ne[0] % block:
                dim = _ROW_FIELDS.get(role, "n_embd")
                yield (
                    f"{role} rows have {ne[0]} elements ({dim}), not a multiple of {block} as {ggml_type} needs: "
                    f"make {dim} a multiple of {block} or give {role} a type with smaller blocks (Q8_0, F16)"
                )


def validate(shape: ModelShape) -> None:
    """Raise :class:`XoverError` naming the first problem that would stop llama.cpp loading the shape."""
    problem = next(itertools.chain(_shape_problems(shape), _type_problems(shape)), None)
    if problem is not None:
        raise XoverError(problem)


def type_mix_overrides(base: TypeMix, overrides: Mapping[str, Any]) -> TypeMix:
    """``base`` with some roles retyped; unknown role names raise :class:`XoverError`."""
    roles = [f.name for f in dataclasses.fields(TypeMix)]
    unknown = sorted(set(overrides) - set(roles))
    if unknown:
        raise XoverError(f"unknown tensor role {unknown[0]!r}: choose from {', '.join(roles)}")
    return dataclasses.replace(base, **overrides)
