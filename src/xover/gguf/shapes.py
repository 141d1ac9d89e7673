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

ARCHITECTURES = ("qwen3moe", "qwen3")
"""Architectures :class:`ModelShape` can describe (and :mod:`xover.gguf.synth` can write)."""

MAX_LAYERS = 512  # LLAMA_MAX_LAYERS (src/llama-hparams.h)
MAX_EXPERTS = 1024  # LLAMA_MAX_EXPERTS (src/llama-hparams.h)

_EXPERT_RE = re.compile(r"blk\.(\d+)\.ffn_(up|down|gate|gate_up)_(ch|)exps")
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


@dataclasses.dataclass(frozen=True)
class Hyperparams:
    """The hyperparameters the arithmetic needs beyond the tensor table."""

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


@dataclasses.dataclass(frozen=True)
class TensorTable:
    """Hyperparameters plus every tensor: all that the footprint arithmetic reads."""

    hparams: Hyperparams
    tensors: tuple[TensorInfo, ...]

    def get(self, name: str) -> TensorInfo | None:
        return next((t for t in self.tensors if t.name == name), None)


def total_params(table: TensorTable) -> int:
    """Elements in all tensors."""
    return sum(t.n_elements for t in table.tensors)


def expert_params(table: TensorTable) -> int:
    """Elements in expert tensors."""
    return sum(t.n_elements for t in table.tensors if t.is_expert)


def total_bytes(table: TensorTable) -> int:
    """Bytes of all tensor data (a GGUF adds its header and alignment padding to this)."""
    return sum(t.nbytes for t in table.tensors)


def expert_bytes(table: TensorTable) -> int:
    """Bytes of expert tensors."""
    return sum(t.nbytes for t in table.tensors if t.is_expert)


def expert_bytes_per_layer(table: TensorTable) -> tuple[int, ...]:
    """Bytes of expert tensors in each block, indexed by layer (0 for dense blocks)."""
    per_layer = [0] * table.hparams.n_layer
    for t in table.tensors:
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
    dense = sum(t.n_elements for t in table.tensors if not t.is_expert) - embd_params
    if embedding == "full" or (embedding == "row" and has_tied_embeddings(table)):
        dense += embd_params
    elif embedding == "row" and embd is not None:
        dense += embd.ne[0]
    return dense + _expert_fraction(table.hparams, expert_params(table))


def bytes_per_token(table: TensorTable) -> int:
    """Weight bytes one decode step reads at batch size 1 (same convention as :func:`active_params`)."""
    embd = table.get("token_embd.weight")
    embd_bytes = embd.nbytes if embd is not None else 0
    dense = sum(t.nbytes for t in table.tensors if not t.is_expert) - embd_bytes
    if has_tied_embeddings(table):
        dense += embd_bytes
    elif embd is not None:
        dense += embd.nbytes // embd.ne[1]  # one row
    return dense + _expert_fraction(table.hparams, expert_bytes(table))


def input_embd_bytes(table: TensorTable) -> int:
    """Bytes of ``token_embd``, which llama.cpp always keeps in host memory."""
    embd = table.get("token_embd.weight")
    return embd.nbytes if embd is not None else 0


def kv_bytes_per_token(hp: Hyperparams, cache_type: str = "F16") -> int | None:
    """KV cache bytes per token of context: ``n_layer * n_head_kv * (head_dim_k + head_dim_v)`` elements.

    ``cache_type`` is a ggml type name (``F16``, ``Q8_0`` = 34 bytes per 32 elements, ...). None when a
    K or V row (``n_head_kv * head_dim``) is not a whole number of blocks, as llama.cpp then refuses the type.
    """
    block, size = type_sizes(cache_type)
    rows = (hp.n_head_kv * hp.head_dim_k, hp.n_head_kv * hp.head_dim_v)
    if any(r % block for r in rows):
        return None
    return hp.n_layer * sum(rows) // block * size


@dataclasses.dataclass(frozen=True)
class NcmoeRow:
    """Weight placement under ``--n-cpu-moe N`` with every layer offloaded (``-ngl`` all)."""

    n_cpu_moe: int
    cpu_expert_bytes: int  # expert tensors of the first N layers, kept in host memory
    gpu_bytes: int  # everything else except token_embd (always in host memory; see module docstring)


def ncmoe_table(table: TensorTable) -> tuple[NcmoeRow, ...]:
    """One row per ``N`` in ``0..n_layer``: expert bytes moved to the CPU and the bytes left on the GPU."""
    per_layer = expert_bytes_per_layer(table)
    on_gpu_at_zero = total_bytes(table) - input_embd_bytes(table)
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
    )


# --------------------------------------------------------------------------------------------------
# model shapes (synthetic models)


def use_more_bits(layer: int, n_layer: int) -> bool:
    """llama-quant.cpp's rule for the layers whose ``attn_v`` / ``ffn_down`` get more bits in ``*_M`` mixes."""
    return layer < n_layer // 8 or layer >= 7 * n_layer // 8 or (layer - n_layer // 8) % 3 == 2


@dataclasses.dataclass(frozen=True)
class TypeMix:
    """ggml type per tensor role. The FFN roles cover both dense FFNs and expert tensors (``ffn_*_exps``).

    ``more_bits``, when set, replaces the type of ``attn_v`` and ``ffn_down`` in the layers
    :func:`use_more_bits` selects, as llama.cpp's Q4_K_M / Q5_K_M quantization does.
    The defaults are a Q4_K_M-like mix.
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

    def for_role(self, role: str, layer: int | None, n_layer: int) -> str:
        """The type of a tensor role (``attn_q``, ``ffn_down_exps``, ``attn_k_norm``, ...) in a layer."""
        base = role.removesuffix("_exps")
        if base.endswith("norm"):
            return self.norm
        if self.more_bits and base in ("attn_v", "ffn_down") and layer is not None and use_more_bits(layer, n_layer):
            return self.more_bits
        return str(getattr(self, base))


@dataclasses.dataclass(frozen=True)
class ModelShape:
    """The geometry and type mix of a qwen3moe (MoE) or qwen3 (dense) model.

    ``n_ff`` is the dense FFN width (written as ``feed_forward_length`` for both architectures; qwen3moe
    only uses ``n_ff_exp``). ``rope_base`` is ``rope.freq_base``; ``rms_eps`` the RMS-norm epsilon.
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

    @property
    def is_moe(self) -> bool:
        return self.arch == "qwen3moe"

    def hparams(self) -> Hyperparams:
        return Hyperparams(
            arch=self.arch,
            n_layer=self.n_layer,
            n_embd=self.n_embd,
            n_head=self.n_head,
            n_head_kv=self.n_head_kv,
            head_dim_k=self.head_dim,
            head_dim_v=self.head_dim,
            n_expert=self.n_expert if self.is_moe else 0,
            n_expert_used=self.n_expert_used if self.is_moe else 0,
            n_vocab=self.n_vocab,
            n_ctx_train=self.n_ctx_train,
        )


def _layer_roles(shape: ModelShape) -> list[tuple[str, tuple[int, ...]]]:
    """``(role, ne)`` of each tensor in one block, in llama.cpp's load order (``src/models/qwen3*.cpp``)."""
    d, hd = shape.n_embd, shape.head_dim
    q, kv = hd * shape.n_head, hd * shape.n_head_kv
    roles: list[tuple[str, tuple[int, ...]]] = [
        ("attn_norm", (d,)),
        ("attn_q", (d, q)),
        ("attn_k", (d, kv)),
        ("attn_v", (d, kv)),
        ("attn_output", (q, d)),
        ("attn_k_norm", (hd,)),
        ("attn_q_norm", (hd,)),
        ("ffn_norm", (d,)),
    ]
    if shape.is_moe:
        e, f = shape.n_expert, shape.n_ff_exp
        roles += [
            ("ffn_gate_inp", (d, e)),
            ("ffn_gate_exps", (d, f, e)),
            ("ffn_down_exps", (f, d, e)),
            ("ffn_up_exps", (d, f, e)),
        ]
    else:
        roles += [("ffn_gate", (d, shape.n_ff)), ("ffn_down", (shape.n_ff, d)), ("ffn_up", (d, shape.n_ff))]
    return roles


def _tensor(name: str, ne: tuple[int, ...], ggml_type: str) -> TensorInfo:
    return TensorInfo(name=name, ne=ne, ggml_type=ggml_type, nbytes=tensor_nbytes(ne, ggml_type))


def tensor_infos(shape: ModelShape) -> tuple[TensorInfo, ...]:
    """Every tensor llama.cpp's loader expects for the shape, named and shaped as in the GGUF."""
    validate(shape)
    mix, d, v = shape.types, shape.n_embd, shape.n_vocab
    out = [
        _tensor("token_embd.weight", (d, v), mix.token_embd),
        _tensor("output_norm.weight", (d,), mix.norm),
        _tensor("output.weight", (d, v), mix.output),
    ]
    for i in range(shape.n_layer):
        for role, ne in _layer_roles(shape):
            out.append(_tensor(f"blk.{i}.{role}.weight", ne, mix.for_role(role, i, shape.n_layer)))
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
}


def _shape_problems(shape: ModelShape) -> Iterable[str]:
    """One message per problem, each saying what to change."""
    if shape.arch not in ARCHITECTURES:
        yield f"arch {shape.arch!r} is not supported: choose one of {', '.join(ARCHITECTURES)}"
        return
    ints: tuple[str, ...] = ("n_layer", "n_embd", "n_head", "n_head_kv", "head_dim", "n_vocab", "n_ctx_train")
    ints += ("n_expert", "n_expert_used", "n_ff_exp") if shape.is_moe else ("n_ff",)
    for name in ints:
        value = getattr(shape, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            yield f"{name} must be a whole number of at least 1 (got {value!r})"
            return
    if shape.n_layer > MAX_LAYERS:
        yield f"n_layer {shape.n_layer} exceeds llama.cpp's limit of {MAX_LAYERS}"
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



def _type_problems(shape: ModelShape) -> Iterable[str]:
    mix = shape.types
    for field in dataclasses.fields(mix):
        name = getattr(mix, field.name)
        if name is not None and name not in GGMLQuantizationType.__members__:
            yield f"types.{field.name} = {name!r} is not a ggml type: use e.g. Q4_K, Q6_K, Q8_0, F16 or F32"
            return
    roles = [("token_embd", (shape.n_embd,)), ("output", (shape.n_embd,)), *_layer_roles(shape)]
    for role, ne in roles:
        used = sorted({mix.for_role(role, layer, shape.n_layer) for layer in range(shape.n_layer)})
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
