"""Named model shapes for synthetic GGUFs, and custom shapes built from them.

Geometry comes from each model's published ``config.json`` (field names quoted next to each preset);
the GGUF-side conventions (MLA's n_head_kv 1, the NextN block appended to GLM's trunk, DeepSeek's MTP
layer dropped) from llama.cpp's converters (``conversion/*.py`` in the pinned tree). The type mixes follow
the common GGUF releases: ggml-org's gpt-oss files (MXFP4 experts, Q8_0 elsewhere, F32 vectors; their
llama-bench sizes 59.02 GiB / 11.27 GiB are reproduced exactly) and llama-quant's Q4_K_M rule for the rest.

:data:`PRESETS` holds the shapes with the Q4_K_M-like mix, :data:`MXFP4_PRESETS` the gpt-oss family;
:data:`ALL_PRESETS` both. Shapes marked *theory only* are too large to synthesize on a small machine but
give a :class:`~xover.domain.shapes.TensorTable` and footprint like any other.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from xover.domain.shapes import ModelShape, TypeMix, type_mix_overrides, validate
from xover.errors import XoverError

Q4_K_M = TypeMix()
"""Q4_K everywhere, Q6_K for ``output`` and for ``attn_v`` / ``ffn_down`` in half the layers, F32 norms."""

Q4_K_M_FALLBACK = TypeMix(fallback=True)
"""Q4_K_M with llama-quant's fallback for rows that are not whole 256-blocks (Q4_K -> Q5_0, Q6_K -> Q8_0):
GLM-4.5-Air's and DeepSeek-V2-Lite's experts of 1408 and MLA's ``attn_k_b`` rows of 128 get it."""

MXFP4_MOE = TypeMix(token_embd="Q8_0", output="Q8_0", attn_q="Q8_0", attn_k="Q8_0", attn_v="Q8_0",
                    attn_output="Q8_0", ffn_gate="Q8_0", ffn_up="Q8_0", ffn_down="Q8_0", more_bits=None,
                    expert="MXFP4", other="Q8_0")
"""ggml-org's gpt-oss GGUFs: experts MXFP4 as trained, matrices Q8_0, router / biases / sinks / norms F32."""

PRESETS: dict[str, ModelShape] = {
    # A few MB; loads and runs on 2 CPU cores in milliseconds. Every row length is 256 so the same
    # Q4_K_M mix as the big presets applies; layers 2 and 3 get the Q6_K variant.
    "tiny-moe": ModelShape(
        arch="qwen3moe", n_layer=4, n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_ff=512, n_expert=8,
        n_expert_used=2, n_ff_exp=256, n_vocab=1024, n_ctx_train=32768, rope_base=1e7, rms_eps=1e-6, types=Q4_K_M,
    ),
    # Qwen3-Coder-30B-A3B-Instruct's geometry (config.json); ~18.6 GB as Q4_K_M.
    "qwen3-30b-a3b": ModelShape(
        arch="qwen3moe", n_layer=48, n_embd=2048, n_head=32, n_head_kv=4, head_dim=128, n_ff=6144, n_expert=128,
        n_expert_used=8, n_ff_exp=768, n_vocab=151936, n_ctx_train=262144, rope_base=1e7, rms_eps=1e-6, types=Q4_K_M,
    ),
    # Dense qwen3 with Qwen3-32B's geometry except n_ff 23296 (instead of 25600), so that its total
    # parameters (30.50 B) and file size match qwen3-30b-a3b: the MoE vs dense comparison at equal size.
    "dense-30b": ModelShape(
        arch="qwen3", n_layer=64, n_embd=5120, n_head=64, n_head_kv=8, head_dim=128, n_ff=23296, n_expert=0,
        n_expert_used=0, n_ff_exp=0, n_vocab=151936, n_ctx_train=40960, rope_base=1e6, rms_eps=1e-6, types=Q4_K_M,
    ),
    # Qwen3-235B-A22B (config.json: hidden_size 4096, num_hidden_layers 94, num_attention_heads 64,
    # num_key_value_heads 4, head_dim 128, moe_intermediate_size 1536, num_experts 128, num_experts_per_tok 8,
    # vocab_size 151936, max_position_embeddings 40960, rope_theta 1e6, rms_norm_eps 1e-6). Theory only
    # (~133 GiB as Q4_K_M).
    "qwen3-235b-a22b": ModelShape(
        arch="qwen3moe", n_layer=94, n_embd=4096, n_head=64, n_head_kv=4, head_dim=128, n_ff=12288, n_expert=128,
        n_expert_used=8, n_ff_exp=1536, n_vocab=151936, n_ctx_train=40960, rope_base=1e6, rms_eps=1e-6, types=Q4_K_M,
    ),
    # A few MB glm4moe: one dense layer, 8 routed experts (top-2) + 1 shared, sigmoid routing with
    # exp_probs_b, partial rotary (half the head), q/k/v biases and one NextN block, as GLM-4.5-Air.
    "tiny-glm4moe": ModelShape(
        arch="glm4moe", n_layer=4, n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_ff=512, n_expert=8,
        n_expert_used=2, n_ff_exp=256, n_vocab=1024, n_ctx_train=32768, rope_base=1e6, rms_eps=1e-5,
        types=Q4_K_M_FALLBACK, n_expert_shared=1, n_dense_lead=1, n_nextn=1, rope_dim=32, expert_bias=True,
    ),
    # GLM-4.5-Air (zai-org/GLM-4.5-Air config.json: hidden_size 4096, num_hidden_layers 46,
    # num_attention_heads 96, num_key_value_heads 8, head_dim 128, partial_rotary_factor 0.5 (rope 64),
    # intermediate_size 10944, moe_intermediate_size 1408, n_routed_experts 128, num_experts_per_tok 8,
    # n_shared_experts 1, first_k_dense_replace 1, num_nextn_predict_layers 1, vocab_size 151552,
    # max_position_embeddings 131072, rope_theta 1e6, rms_norm_eps 1e-5, attention_bias true,
    # use_qk_norm false). The NextN block has no embed_tokens / shared_head.head of its own (it uses the
    # trunk's). Numbers from the model card as recalled, checked against llama.cpp's glm4-moe.cpp
    # (46 layers = LLM_TYPE_106B_A12B); ~67 GiB as Q4_K_M-like.
    "glm-4.5-air": ModelShape(
        arch="glm4moe", n_layer=46, n_embd=4096, n_head=96, n_head_kv=8, head_dim=128, n_ff=10944, n_expert=128,
        n_expert_used=8, n_ff_exp=1408, n_vocab=151552, n_ctx_train=131072, rope_base=1e6, rms_eps=1e-5,
        types=Q4_K_M_FALLBACK, n_expert_shared=1, n_dense_lead=1, n_nextn=1, rope_dim=64, expert_bias=True,
    ),
    # A few MB deepseek2 (MLA): one dense layer, 8 routed experts (top-2) + 2 shared, kv_lora_rank 256,
    # no q_lora (as V2-Lite), rope 32 of a 96-wide K head, V head 64.
    "tiny-deepseek2": ModelShape(
        arch="deepseek2", n_layer=4, n_embd=256, n_head=4, n_head_kv=1, head_dim=96, n_ff=512, n_expert=8,
        n_expert_used=2, n_ff_exp=256, n_vocab=1024, n_ctx_train=32768, rope_base=1e4, rms_eps=1e-6,
        types=Q4_K_M_FALLBACK, n_expert_shared=2, n_dense_lead=1, rope_dim=32, kv_lora_rank=256, v_head_dim=64,
    ),
    # DeepSeek-V2-Lite (deepseek-ai/DeepSeek-V2-Lite config.json: hidden_size 2048, num_hidden_layers 27,
    # num_attention_heads 16, q_lora_rank null, kv_lora_rank 512, qk_nope_head_dim 128, qk_rope_head_dim 64,
    # v_head_dim 128, intermediate_size 10944, moe_intermediate_size 1408, n_routed_experts 64,
    # num_experts_per_tok 6, n_shared_experts 2, first_k_dense_replace 1, vocab_size 102400,
    # max_position_embeddings 163840, rope_theta 10000, rms_norm_eps 1e-6, scoring_func softmax).
    # GGUF: head_count_kv 1 (MLA), key_length 576, value_length 512. ~9.7 GiB as Q4_K_M-like.
    "deepseek-v2-lite": ModelShape(
        arch="deepseek2", n_layer=27, n_embd=2048, n_head=16, n_head_kv=1, head_dim=192, n_ff=10944, n_expert=64,
        n_expert_used=6, n_ff_exp=1408, n_vocab=102400, n_ctx_train=163840, rope_base=1e4, rms_eps=1e-6,
        types=Q4_K_M_FALLBACK, n_expert_shared=2, n_dense_lead=1, rope_dim=64, kv_lora_rank=512, v_head_dim=128,
    ),
    # DeepSeek-V3 (deepseek-ai/DeepSeek-V3 config.json: hidden_size 7168, num_hidden_layers 61,
    # num_attention_heads 128, q_lora_rank 1536, kv_lora_rank 512, qk_nope_head_dim 128, qk_rope_head_dim 64,
    # v_head_dim 128, intermediate_size 18432, moe_intermediate_size 2048, n_routed_experts 256,
    # num_experts_per_tok 8, n_shared_experts 1, first_k_dense_replace 3, vocab_size 129280,
    # max_position_embeddings 163840, rope_theta 10000, scoring_func sigmoid with e_score_correction_bias,
    # num_nextn_predict_layers 1, which convert_hf_to_gguf.py drops). Theory only (~377 GiB as Q4_K_M).
    "deepseek-v3": ModelShape(
        arch="deepseek2", n_layer=61, n_embd=7168, n_head=128, n_head_kv=1, head_dim=192, n_ff=18432, n_expert=256,
        n_expert_used=8, n_ff_exp=2048, n_vocab=129280, n_ctx_train=163840, rope_base=1e4, rms_eps=1e-6,
        types=Q4_K_M_FALLBACK, n_expert_shared=1, n_dense_lead=3, rope_dim=64, kv_lora_rank=512, q_lora_rank=1536,
        v_head_dim=128, expert_bias=True,
    ),
    # Kimi-K2 (moonshotai/Kimi-K2-Instruct config.json: DeepSeek-V3's architecture with num_attention_heads 64,
    # n_routed_experts 384, first_k_dense_replace 1, vocab_size 163840, max_position_embeddings 131072,
    # rope_theta 50000, no NextN layer). Theory only (~580 GiB as Q4_K_M).
    "kimi-k2": ModelShape(
        arch="deepseek2", n_layer=61, n_embd=7168, n_head=64, n_head_kv=1, head_dim=192, n_ff=18432, n_expert=384,
        n_expert_used=8, n_ff_exp=2048, n_vocab=163840, n_ctx_train=131072, rope_base=5e4, rms_eps=1e-6,
        types=Q4_K_M_FALLBACK, n_expert_shared=1, n_dense_lead=1, rope_dim=64, kv_lora_rank=512, q_lora_rank=1536,
        v_head_dim=128, expert_bias=True,
    ),
}

MXFP4_PRESETS: dict[str, ModelShape] = {
    # A few MB gpt-oss: 8 experts (top-2), SWA window 128 in even layers, sinks and biases, MXFP4 experts.
    "tiny-gpt-oss": ModelShape(
        arch="gpt-oss", n_layer=4, n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_ff=256, n_expert=8,
        n_expert_used=2, n_ff_exp=256, n_vocab=1024, n_ctx_train=32768, rope_base=150000.0, rms_eps=1e-5,
        types=MXFP4_MOE, swa_window=128, swa_pattern=2,
    ),
    # gpt-oss-120b (openai/gpt-oss-120b config.json: hidden_size 2880, num_hidden_layers 36,
    # num_attention_heads 64, num_key_value_heads 8, head_dim 64, intermediate_size 2880, num_local_experts 128,
    # num_experts_per_tok 4, sliding_window 128, layer_types alternating sliding/full from layer 0,
    # vocab_size 201088, max_position_embeddings 131072, rope_theta 150000, rms_norm_eps 1e-5).
    # 116.83 B params, 59.02 GiB: llama-bench's figures for ggml-org/gpt-oss-120b-GGUF.
    "gpt-oss-120b": ModelShape(
        arch="gpt-oss", n_layer=36, n_embd=2880, n_head=64, n_head_kv=8, head_dim=64, n_ff=2880, n_expert=128,
        n_expert_used=4, n_ff_exp=2880, n_vocab=201088, n_ctx_train=131072, rope_base=150000.0, rms_eps=1e-5,
        types=MXFP4_MOE, swa_window=128, swa_pattern=2,
    ),
    # gpt-oss-20b (openai/gpt-oss-20b config.json: as 120b with num_hidden_layers 24, num_local_experts 32).
    # 20.91 B params, 11.27 GiB: llama-bench's figures for ggml-org/gpt-oss-20b-GGUF.
    "gpt-oss-20b": ModelShape(
        arch="gpt-oss", n_layer=24, n_embd=2880, n_head=64, n_head_kv=8, head_dim=64, n_ff=2880, n_expert=32,
        n_expert_used=4, n_ff_exp=2880, n_vocab=201088, n_ctx_train=131072, rope_base=150000.0, rms_eps=1e-5,
        types=MXFP4_MOE, swa_window=128, swa_pattern=2,
    ),
}

ALL_PRESETS: dict[str, ModelShape] = {**PRESETS, **MXFP4_PRESETS}

THEORY_ONLY = ("qwen3-235b-a22b", "deepseek-v3", "kimi-k2")
"""Presets too large to synthesize here: shapes for the theory and the planner."""

_FIELDS = tuple(f.name for f in dataclasses.fields(ModelShape))


def preset(name: str) -> ModelShape:
    """A preset by name; an unknown name raises :class:`XoverError` listing the known ones."""
    try:
        return ALL_PRESETS[name]
    except KeyError:
        raise XoverError(f"unknown model preset {name!r}: choose one of {', '.join(ALL_PRESETS)}") from None


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
