"""Named model shapes for synthetic GGUFs, and custom shapes built from them."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from xover.errors import XoverError
from xover.gguf.shapes import ModelShape, TypeMix, type_mix_overrides, validate

Q4_K_M = TypeMix()
"""Q4_K everywhere, Q6_K for ``output`` and for ``attn_v`` / ``ffn_down`` in half the layers, F32 norms."""

PRESETS: dict[str, ModelShape] = {
    # A few MB; loads and runs on 2 CPU cores in milliseconds. Every row length is 256 so the same
    # Q4_K_M mix as the big presets applies; layers 2 and 3 get the Q6_K variant.
    "tiny-moe": ModelShape(
        arch="qwen3moe",
        n_layer=4,
        n_embd=256,
        n_head=4,
        n_head_kv=2,
        head_dim=64,
        n_ff=512,
        n_expert=8,
        n_expert_used=2,
        n_ff_exp=256,
        n_vocab=1024,
        n_ctx_train=32768,
        rope_base=1e7,
        rms_eps=1e-6,
        types=Q4_K_M,
    ),
    # Qwen3-Coder-30B-A3B-Instruct's geometry (config.json); ~18.6 GB as Q4_K_M.
    "qwen3-30b-a3b": ModelShape(
        arch="qwen3moe",
        n_layer=48,
        n_embd=2048,
        n_head=32,
        n_head_kv=4,
        head_dim=128,
        n_ff=6144,
        n_expert=128,
        n_expert_used=8,
        n_ff_exp=768,
        n_vocab=151936,
        n_ctx_train=262144,
        rope_base=1e7,
        rms_eps=1e-6,
        types=Q4_K_M,
    ),
    # Dense qwen3 with Qwen3-32B's geometry except n_ff 23296 (instead of 25600), so that its total
    # parameters (30.50 B) and file size match qwen3-30b-a3b: the MoE vs dense comparison at equal size.
    "dense-30b": ModelShape(
        arch="qwen3",
        n_layer=64,
        n_embd=5120,
        n_head=64,
        n_head_kv=8,
        head_dim=128,
        n_ff=23296,
        n_expert=0,
        n_expert_used=0,
        n_ff_exp=0,
        n_vocab=151936,
        n_ctx_train=40960,
        rope_base=1e6,
        rms_eps=1e-6,
        types=Q4_K_M,
    ),
}

_FIELDS = tuple(f.name for f in dataclasses.fields(ModelShape))


def preset(name: str) -> ModelShape:
    """A preset by name; an unknown name raises :class:`XoverError` listing the known ones."""
    try:
        return PRESETS[name]
    except KeyError:
        raise XoverError(f"unknown model preset {name!r}: choose one of {', '.join(PRESETS)}") from None


def make_shape(base: str | ModelShape, **overrides: Any) -> ModelShape:
    """A preset (or shape) with fields replaced, validated as llama.cpp would load it.

    ``types`` may be a :class:`TypeMix` or a mapping that retypes some roles of the base's mix, e.g.
    ``make_shape("tiny-moe", n_layer=2, types={"attn_v": "Q8_0"})``.
    """
    shape = preset(base) if isinstance(base, str) else base
    unknown = sorted(set(overrides) - set(_FIELDS))
    if unknown:
        raise XoverError(f"unknown shape option {unknown[0]!r}: choose from {', '.join(_FIELDS)}")
    types = overrides.get("types")
    if isinstance(types, Mapping):
        overrides["types"] = type_mix_overrides(shape.types, types)
    shape = dataclasses.replace(shape, **overrides)
    validate(shape)
    return shape
