"""Write shape-faithful synthetic GGUF models that llama.cpp loads and runs.

The weights are random but valid: quantized blocks carry small finite f16 scales, so no NaN or Inf
reaches attention or expert routing, and norms are ones. The speed of a model in llama.cpp depends on
its shapes and types, not on the values, so these files benchmark like the real models, with one
difference: a random router spreads tokens evenly over the experts, where trained routers are skewed.

**Routing depends on the token.** The tensors that write into the residual stream (``attn_output`` and
every ``ffn_down``: dense, expert and shared-expert, weights and biases) are zero, so each layer's hidden state is the
token's own embedding and each router picks experts by token and layer. With random non-zero
writers the residual stream fills with context averages that are nearly the same at every position:
the routers then send most tokens of a long prompt to the same few experts, a 512-token ubatch reads
about half of each layer's experts instead of nearly all, and prefill with experts on the CPU (whose
cost is copying or reading the experts a ubatch touches) measured faster than it is on a real model.
Every kernel still runs on every tensor: llama.cpp never looks at weight values to skip work.
Generation samples the end-of-text token now and then, as any model may: clients that need a fixed
number of tokens send ``ignore_eos``.

Writing streams at disk speed with little memory: a pool of a few MB of valid blocks is generated once
per ggml type, and each tensor is written as a rotated run of its pool. The header (metadata and tensor
table) comes from ``gguf.GGUFWriter``; the tensor data is appended directly, because the writer's
``write_tensor_data`` needs each tensor as one in-memory array (up to 255 MB for ``output.weight`` of
qwen3-30b-a3b). The file is written as ``<path>.tmp`` and renamed when complete.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import numpy as np
from gguf import (
    GGUF_DEFAULT_ALIGNMENT,
    ExpertGatingFuncType,
    GGMLQuantizationType,
    GGUFWriter,
    LlamaFileType,
    TokenType,
)
from gguf.quants import quant_shape_to_byte_shape

from xover.domain.presets import ALL_PRESETS
from xover.domain.shapes import ModelShape, TensorInfo, TypeMix, tensor_infos, type_sizes
from xover.errors import XoverError

SYNTHETIC_KEY = "xover.synthetic"
PRESET_KEY = "xover.preset"
SHAPE_KEY = "xover.shape"
EOS_TOKEN = "<|endoftext|>"

POOL_BYTES = 4 << 20
"""Target size of the random block pool of each ggml type (rounded down to whole blocks)."""

QUANT_VERSION = 2  # GGML_QNT_VERSION

_FLOAT_TYPES = ("F32", "F16", "BF16")


@dataclasses.dataclass(frozen=True)
class _BlockScales:
    """Where a quantized block keeps its f16 multipliers, and their magnitude.

    Each multiplier is drawn from ``[value, 2 * value]``. The values keep typical dequantized weights
    around 0.01-0.05 (the range of the quant x sub-scale products differs by type) and every multiplier
    an f16 normal number (>= 6.1e-5), so no backend flushes them to zero. Mins (``dmin``, ``m``) are
    set to centre the weights near zero: min = -(mean quant) x scale.
    """

    scale_offsets: tuple[int, ...]
    scale: float
    min_offsets: tuple[int, ...] = ()
    min_value: float = 0.0


# Offsets from ggml/src/ggml-common.h.
_QUANT_LAYOUTS: dict[str, _BlockScales] = {
    "Q4_0": _BlockScales((0,), 2.5e-3),
    "Q4_1": _BlockScales((0,), 1.5e-3, (2,), -0.0112),
    "Q5_0": _BlockScales((0,), 1.25e-3),
    "Q5_1": _BlockScales((0,), 7.5e-4, (2,), -0.0116),
    "Q8_0": _BlockScales((0,), 1.5e-4),
    "Q2_K": _BlockScales((80,), 5e-4, (82,), 7.5e-4),
    "Q3_K": _BlockScales((108,), 2.5e-4),
    "Q4_K": _BlockScales((0,), 6.2e-5, (2,), 4.65e-4),
    "Q5_K": _BlockScales((0,), 6.2e-5, (2,), 9.6e-4),
    "Q6_K": _BlockScales((208,), 6.2e-5),
}

_MXFP4_EXPONENTS = (119, 120)
"""E8M0 scales of MXFP4 blocks: ``ggml_e8m0_to_fp32_half(e)`` = 2**(e - 128), 1/512 and 1/256, which with
the e2m1 values (mean magnitude 4.5) gives weights around 0.01-0.02."""

SYNTH_TYPES = _FLOAT_TYPES + tuple(_QUANT_LAYOUTS) + ("MXFP4",)
"""ggml types :func:`write_model` can fill with valid random data."""


def _unsupported(ggml_type: str) -> XoverError:
    return XoverError(f"cannot synthesize {ggml_type} data: use one of {', '.join(SYNTH_TYPES)}")


@dataclasses.dataclass(frozen=True)
class SynthResult:
    path: Path
    bytes: int  # file size
    seconds: float  # wall time of the whole write, header to rename
    tensors: int


# --------------------------------------------------------------------------------------------------
# tokenizer


def gpt2_byte_tokens() -> list[str]:
    """GPT-2's byte-to-unicode table: the token text of each byte 0..255, in byte order."""
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)}
    extra = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(extra)) for b in range(256)]


@dataclasses.dataclass(frozen=True)
class Vocab:
    tokens: tuple[str, ...]
    types: tuple[int, ...]
    merges: tuple[str, ...]
    eos_id: int


def synthetic_vocab(n_vocab: int) -> Vocab:
    """A byte-level BPE vocabulary of ``n_vocab`` tokens that any text tokenizes into.

    The 256 byte tokens, one merge (the loader rejects a BPE vocabulary without merges), padding tokens
    up to ``n_vocab - 1`` and an end-of-text control token last (also used as BOS, as Qwen does).
    """
    byte_tokens = gpt2_byte_tokens()
    space, t = byte_tokens[ord(" ")], byte_tokens[ord("t")]
    padding = [f"<xover_pad_{i}>" for i in range(n_vocab - 258)]
    tokens = (*byte_tokens, space + t, *padding, EOS_TOKEN)
    types = (int(TokenType.NORMAL),) * (n_vocab - 1) + (int(TokenType.CONTROL),)
    return Vocab(tokens=tokens, types=types, merges=(f"{space} {t}",), eos_id=n_vocab - 1)


# --------------------------------------------------------------------------------------------------
# random block pools


def _float_values(ggml_type: str, values: np.ndarray) -> np.ndarray:
    """float32 values encoded as ``ggml_type`` bytes."""
    if ggml_type == "F32":
        return values.astype("<f4").view(np.uint8)
    if ggml_type == "F16":
        return values.astype("<f2").view(np.uint8)
    return (values.astype("<f4").view("<u4") >> 16).astype("<u2").view(np.uint8)  # BF16: top half of f32


def block_pool(ggml_type: str, rng: np.random.Generator, pool_bytes: int = POOL_BYTES) -> np.ndarray:
    """About ``pool_bytes`` of valid random ``ggml_type`` data (whole blocks, flat uint8)."""
    block, size = type_sizes(ggml_type)
    n_blocks = max(1, pool_bytes // size)
    if ggml_type in _FLOAT_TYPES:
        return _float_values(ggml_type, rng.normal(0.0, 0.02, n_blocks * block))
    if ggml_type == "MXFP4":  # block_mxfp4 (ggml-common.h): uint8 e, then 16 bytes of e2m1 nibbles
        pool = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
        pool[:, 0] = rng.choice(np.array(_MXFP4_EXPONENTS, dtype=np.uint8), n_blocks)
        return pool.reshape(-1)
    layout = _QUANT_LAYOUTS.get(ggml_type)
    if layout is None:
        raise _unsupported(ggml_type)
    pool = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    for offsets, value in ((layout.scale_offsets, layout.scale), (layout.min_offsets, layout.min_value)):
        for off in offsets:
            f16 = (rng.uniform(1.0, 2.0, n_blocks) * value).astype("<f2")
            pool[:, off : off + 2] = f16.view(np.uint8).reshape(n_blocks, 2)
    return pool.reshape(-1)


RESIDUAL_WRITERS = re.compile(r"\.(attn_output|ffn_down(_exps|_shexp|_chexps)?)\.(weight|bias)$")
"""Tensor names whose output is added to the residual stream: written as zeros (module docstring)."""


def ones_pool(ggml_type: str) -> np.ndarray:
    """64 KiB of ones in a float type: the data of norm weights."""
    block, size = type_sizes(ggml_type)
    return _float_values(ggml_type, np.ones((64 << 10) // size * block, dtype=np.float32))


ZERO_BIASES = re.compile(r"\.exp_probs_b\.bias$")
"""The per-expert selection bias of sigmoid routers (GLM-4.5, DeepSeek-V3), written as zeros: trained, it
balances the load over the experts; random, it would favour some experts in every token's choice."""


def pool_kind(name: str, ggml_type: str) -> str:
    """How a tensor is filled: "norm" (ones), "zero" (a residual writer, an expert-selection bias) or "weight"
    (random blocks)."""
    if name.endswith("norm.weight") and ggml_type in _FLOAT_TYPES:
        return "norm"
    return "zero" if RESIDUAL_WRITERS.search(name) or ZERO_BIASES.search(name) else "weight"


class _Pools:
    """One lazily built pool per (type, kind); kind is what :func:`pool_kind` returns."""

    def __init__(self, seed: int) -> None:
        self._rng = np.random.default_rng(seed)
        self._pools: dict[tuple[str, str], memoryview] = {}

    def get(self, ggml_type: str, kind: str) -> memoryview:
        key = (ggml_type, kind)
        if key not in self._pools:
            if kind == "norm":
                data = ones_pool(ggml_type)
            elif kind == "zero":  # all-zero bytes are 0.0 in every float and block type (scales of 0)
                data = np.zeros(max(1, POOL_BYTES // type_sizes(ggml_type)[1]) * type_sizes(ggml_type)[1], np.uint8)
            else:
                data = block_pool(ggml_type, self._rng)
            self._pools[key] = memoryview(data.tobytes())
        return self._pools[key]


# --------------------------------------------------------------------------------------------------
# metadata


def file_type(mix: TypeMix) -> LlamaFileType:
    """``general.file_type`` for a mix, named after its FFN type (what llama.cpp's ftype names mean)."""
    main = mix.expert or mix.ffn_gate
    if main == "MXFP4":
        return LlamaFileType.MOSTLY_MXFP4_MOE
    if main in ("Q4_K", "Q5_K"):
        suffix = "M" if mix.more_bits else "S"
        return LlamaFileType[f"MOSTLY_{main}_{suffix}"]
    if main == "Q3_K":
        return LlamaFileType.MOSTLY_Q3_K_M
    if main == "F32":
        return LlamaFileType.ALL_F32
    return LlamaFileType.__members__.get(f"MOSTLY_{main}", LlamaFileType.GUESSED)


def preset_name(shape: ModelShape) -> str | None:
    """The name of the preset equal to ``shape``, else None."""
    return next((name for name, p in ALL_PRESETS.items() if p == shape), None)


def _add_metadata(w: GGUFWriter, shape: ModelShape, label: str, seed: int) -> None:
    """The keys llama.cpp reads for the arch (``src/models/<arch>.cpp``), as llama.cpp's converters write them."""
    w.add_name(f"xover synthetic {label}")
    w.add_file_type(int(file_type(shape.types)))
    w.add_quantization_version(QUANT_VERSION)
    w.add_context_length(shape.n_ctx_train)
    w.add_embedding_length(shape.n_embd)
    w.add_block_count(shape.block_count)
    w.add_feed_forward_length(shape.n_ff)
    w.add_head_count(shape.n_head)
    w.add_head_count_kv(shape.n_head_kv)
    hp = shape.hparams()
    w.add_key_length(hp.head_dim_k)
    w.add_value_length(hp.head_dim_v)
    w.add_layer_norm_rms_eps(shape.rms_eps)
    w.add_rope_freq_base(shape.rope_base)
    if shape.is_moe:
        w.add_expert_count(shape.n_expert)
        w.add_expert_used_count(shape.n_expert_used)
        w.add_expert_feed_forward_length(shape.n_ff_exp)
    if shape.rope_dim:
        w.add_rope_dimension_count(shape.rope_dim)
    if shape.arch == "gpt-oss":
        w.add_sliding_window(shape.swa_window)
        if shape.swa_pattern != 2:  # openai-moe.cpp's default pattern is 2
            w.add_uint32(f"{shape.arch}.attention.sliding_window_pattern", shape.swa_pattern)
    if shape.arch in ("glm4moe", "deepseek2"):
        w.add_leading_dense_block_count(shape.n_dense_lead)
        w.add_expert_shared_count(shape.n_expert_shared)
        w.add_expert_weights_scale(1.0)
        w.add_expert_weights_norm(shape.arch == "glm4moe" or shape.expert_bias)
        sigmoid = shape.arch == "glm4moe" or shape.expert_bias
        w.add_expert_gating_func(ExpertGatingFuncType.SIGMOID if sigmoid else ExpertGatingFuncType.SOFTMAX)
    if shape.n_nextn:
        w.add_nextn_predict_layers(shape.n_nextn)
    if shape.is_mla:
        w.add_vocab_size(shape.n_vocab)
        w.add_q_lora_rank(shape.q_lora_rank)  # 0: Q projected directly (the loader needs the key unless 27 layers)
        w.add_kv_lora_rank(shape.kv_lora_rank)
        w.add_key_length_mla(shape.head_dim)
        w.add_value_length_mla(shape.head_dim_v)
    vocab = synthetic_vocab(shape.n_vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(vocab.tokens)
    w.add_token_types(vocab.types)
    w.add_token_merges(vocab.merges)
    w.add_eos_token_id(vocab.eos_id)
    w.add_bos_token_id(vocab.eos_id)
    w.add_add_bos_token(False)
    w.add_bool(SYNTHETIC_KEY, True)
    w.add_string(PRESET_KEY, label)
    w.add_string(SHAPE_KEY, json.dumps(dataclasses.asdict(shape), sort_keys=True))
    w.add_uint32("xover.seed", seed)


def _add_tensor_info(w: GGUFWriter, t: TensorInfo) -> None:
    qtype = GGMLQuantizationType[t.ggml_type]
    byte_shape = quant_shape_to_byte_shape(tuple(reversed(t.ne)), qtype)  # numpy order, last dim in bytes
    w.add_tensor_info(t.name, byte_shape, np.dtype(np.uint8), t.nbytes, raw_dtype=qtype)


def _write_header(path: Path, shape: ModelShape, tensors: tuple[TensorInfo, ...], label: str, seed: int) -> None:
    w = GGUFWriter(path, arch=shape.arch)
    _add_metadata(w, shape, label, seed)
    for t in tensors:
        _add_tensor_info(w, t)
    w.write_header_to_file(path)
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()


# --------------------------------------------------------------------------------------------------
# writing


def _pad(n: int, align: int = GGUF_DEFAULT_ALIGNMENT) -> int:
    """Zero bytes that bring ``n`` to a multiple of ``align``."""
    return -n % align


def _write_run(f: BinaryIO, pool: memoryview, start: int, nbytes: int, on_chunk: Callable[[int], None]) -> None:
    """Write ``nbytes`` of ``pool`` starting at ``start``, wrapping around, one pool-sized chunk at a time."""
    pos, left = start, nbytes
    while left:
        chunk = pool[pos : pos + left]
        f.write(chunk)
        left -= len(chunk)
        pos = 0
        on_chunk(len(chunk))


def _check_free_space(directory: Path, need: int) -> None:
    free = shutil.disk_usage(directory).free
    if free < need:
        raise XoverError(
            f"{directory} has {free / 2**30:.1f} GiB free but the model needs {need / 2**30:.1f} GiB: "
            "free space or choose another output path"
        )


def write_model(
    shape: ModelShape, path: Path | str, seed: int = 0, progress: Callable[[int, int], None] | None = None
) -> SynthResult:
    """Write ``shape`` as a GGUF at ``path`` (via ``<path>.tmp``, renamed when complete).

    ``progress(bytes_done, bytes_total)`` is called as tensor data is written (bytes of tensor data).
    ``seed`` makes the data reproducible.
    """
    start_ns = time.perf_counter_ns()
    path = Path(path)
    tensors = tensor_infos(shape)  # validates
    unsupported = sorted({t.ggml_type for t in tensors} - set(SYNTH_TYPES))
    if unsupported:
        raise _unsupported(unsupported[0])
    data_total = sum(t.nbytes for t in tensors)
    path.parent.mkdir(parents=True, exist_ok=True)
    _check_free_space(path.parent, data_total + (64 << 20))
    tmp = path.with_name(path.name + ".tmp")
    label = preset_name(shape) or "custom"
    done = 0

    def on_chunk(n: int) -> None:
        nonlocal done
        done += n
        if progress is not None:
            progress(done, data_total)

    try:
        _write_header(tmp, shape, tensors, label, seed)
        pools = _Pools(seed)
        with tmp.open("ab") as f:
            f.write(bytes(_pad(f.tell())))
            for i, t in enumerate(tensors):
                pool = pools.get(t.ggml_type, pool_kind(t.name, t.ggml_type))
                block_bytes = type_sizes(t.ggml_type)[1]
                start = (i * 7919) % (len(pool) // block_bytes) * block_bytes  # rotate: neighbours differ
                _write_run(f, pool, start, t.nbytes, on_chunk)
                f.write(bytes(_pad(t.nbytes)))
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    seconds = (time.perf_counter_ns() - start_ns) / 1e9
    return SynthResult(path=path, bytes=path.stat().st_size, seconds=seconds, tensors=len(tensors))
