"""Shape arithmetic against numbers worked out by hand from the llama.cpp tensor lists."""

from __future__ import annotations

import dataclasses
import re

import pytest

from xover.domain.presets import PRESETS, make_shape, preset
from xover.domain.shapes import (
    Footprint,
    Hyperparams,
    TensorInfo,
    TensorTable,
    TypeMix,
    footprint,
    kv_bytes_per_token,
    tensor_infos,
    tensor_nbytes,
    tensor_table,
    use_more_bits,
)
from xover.errors import XoverError

Q4_K = 144 / 256  # bytes per element
Q6_K = 210 / 256


def fp(name: str) -> Footprint:
    return footprint(tensor_table(PRESETS[name]))


# ------------------------------------------------------------------ qwen3-30b-a3b


QWEN_MORE_BITS = [*range(0, 6), *range(8, 42, 3), *range(42, 48)]  # n/8 = 6; (i - 6) % 3 == 2; i >= 42


def test_use_more_bits_matches_llama_quant_rule() -> None:
    assert [i for i in range(48) if use_more_bits(i, 48)] == QWEN_MORE_BITS
    assert len(QWEN_MORE_BITS) == 24
    assert [i for i in range(4) if use_more_bits(i, 4)] == [2, 3]  # n/8 = 0: (i % 3 == 2) or i >= 3


def test_qwen3_30b_a3b_params() -> None:
    f = fp("qwen3-30b-a3b")
    expert = 48 * 128 * 3 * 2048 * 768
    embd = 2048 * 151936
    per_layer = (
        2 * 2048
        + 2 * 128  # attn_norm, ffn_norm, attn_q_norm, attn_k_norm
        + 2048 * 4096 * 2  # attn_q, attn_output (32 heads x 128)
        + 2048 * 512 * 2  # attn_k, attn_v (4 KV heads x 128)
        + 2048 * 128  # ffn_gate_inp
    )
    total = expert + 48 * per_layer + 2 * embd + 2048
    assert f.expert_params == expert == 28_991_029_248
    assert f.total_params == total == 30_532_122_624
    active_experts = expert * 8 // 128
    assert f.active_params == total - expert - embd + 2048 + active_experts == 3_041_869_824
    assert f.active_params_no_embd == f.active_params - 2048
    assert f.active_params_full_embd == f.active_params - 2048 + embd == 3_353_032_704


def test_qwen3_30b_a3b_bytes() -> None:
    f = fp("qwen3-30b-a3b")
    gate_up = 2 * 2048 * 768 * 128 * Q4_K  # per layer, Q4_K
    down4, down6 = 768 * 2048 * 128 * Q4_K, 768 * 2048 * 128 * Q6_K
    assert (down4, down6) == (113_246_208, 165_150_720)
    expert = 48 * gate_up + 24 * down4 + 24 * down6
    assert f.expert_bytes == expert == 17_553_162_240
    f32 = (2 * 2048 + 2 * 128 + 2048 * 128) * 4
    attn4 = (2048 * 4096 * 2 + 2048 * 512 * 2) * Q4_K
    v_extra = 2048 * 512 * (Q6_K - Q4_K)
    embd, output = 2048 * 151936 * Q4_K, 2048 * 151936 * Q6_K
    assert (embd, output) == (175_030_272, 255_252_480)
    total = expert + 48 * (f32 + attn4) + 24 * v_extra + embd + output + 2048 * 4
    assert f.total_bytes == total == 18_550_716_416
    assert f.input_embd_bytes == embd
    row = embd // 151936
    assert f.bytes_per_token == total - expert - embd + row + expert * 8 // 128
    assert f.expert_bytes_per_layer[0] == gate_up + down6 == 391_643_136
    assert f.expert_bytes_per_layer[6] == gate_up + down4 == 339_738_624


def test_qwen3_30b_a3b_kv_cache() -> None:
    f = fp("qwen3-30b-a3b")
    assert f.kv_bytes_per_token_f16 == 2 * 48 * 4 * 128 * 2 == 98304
    assert f.kv_bytes_per_token_q8_0 == 2 * 48 * 4 * 128 * 34 // 32 == 52224


def test_qwen3_30b_a3b_ncmoe_table() -> None:
    f = fp("qwen3-30b-a3b")
    rows = f.ncmoe
    more, less = 391_643_136, 339_738_624  # expert bytes of a Q6_K-down layer / a Q4_K-down layer
    on_gpu = f.total_bytes - f.input_embd_bytes
    assert [r.n_cpu_moe for r in rows] == list(range(49))
    assert rows[0].cpu_expert_bytes == 0 and rows[0].gpu_bytes == on_gpu
    assert rows[6].cpu_expert_bytes == 6 * more
    assert rows[7].cpu_expert_bytes == 6 * more + less
    assert rows[48].cpu_expert_bytes == f.expert_bytes == 24 * more + 24 * less
    assert all(r.cpu_expert_bytes + r.gpu_bytes == on_gpu for r in rows)
    assert rows[48].gpu_bytes == on_gpu - f.expert_bytes == 822_523_904


def test_qwen3moe_tensor_list_matches_loader() -> None:
    tensors = {t.name: t for t in tensor_infos(PRESETS["qwen3-30b-a3b"])}
    assert len(tensors) == 3 + 48 * 12
    assert tensors["token_embd.weight"].ne == (2048, 151936)
    assert tensors["output.weight"].ne == (2048, 151936)
    assert tensors["output_norm.weight"].ne == (2048,)
    expect = {
        "attn_norm": ((2048,), "F32"),
        "attn_q": ((2048, 4096), "Q4_K"),
        "attn_k": ((2048, 512), "Q4_K"),
        "attn_v": ((2048, 512), "Q6_K"),  # layer 0 uses more bits
        "attn_output": ((4096, 2048), "Q4_K"),
        "attn_q_norm": ((128,), "F32"),
        "attn_k_norm": ((128,), "F32"),
        "ffn_norm": ((2048,), "F32"),
        "ffn_gate_inp": ((2048, 128), "F32"),
        "ffn_gate_exps": ((2048, 768, 128), "Q4_K"),
        "ffn_up_exps": ((2048, 768, 128), "Q4_K"),
        "ffn_down_exps": ((768, 2048, 128), "Q6_K"),
    }
    for role, (ne, ggml_type) in expect.items():
        t = tensors[f"blk.0.{role}.weight"]
        assert (t.ne, t.ggml_type) == (ne, ggml_type), role
    assert tensors["blk.6.ffn_down_exps.weight"].ggml_type == "Q4_K"
    assert tensors["blk.6.attn_v.weight"].ggml_type == "Q4_K"


# ------------------------------------------------------------------ tiny-moe


def test_tiny_moe_numbers() -> None:
    f = fp("tiny-moe")
    embd, expert_layer = 256 * 1024, 3 * 256 * 256 * 8
    dense_layer = 2 * 256 + 2 * 64 + 2 * 256 * 256 + 2 * 256 * 128 + 256 * 8  # norms, attention, router
    assert f.total_params == 2 * embd + 256 + 4 * (expert_layer + dense_layer) == 7_613_184
    assert f.active_params == f.total_params - 4 * expert_layer * 6 // 8 - embd + 256 == 2_632_704
    # bytes: layers 2 and 3 take Q6_K for attn_v and ffn_down_exps
    f32 = (2 * 256 + 2 * 64 + 256 * 8) * 4
    attn4 = (2 * 256 * 256 + 2 * 256 * 128) * Q4_K
    experts4 = 3 * 256 * 256 * 8 * Q4_K
    extra6 = 256 * 128 * (Q6_K - Q4_K) + 256 * 256 * 8 * (Q6_K - Q4_K)
    total = embd * Q4_K + embd * Q6_K + 256 * 4 + 4 * (f32 + attn4 + experts4) + 2 * extra6
    assert f.total_bytes == total == 4_675_072
    assert f.expert_bytes == 4 * experts4 + 2 * 256 * 256 * 8 * (Q6_K - Q4_K) == 3_809_280
    assert f.bytes_per_token == total - f.expert_bytes - embd * Q4_K + 144 + f.expert_bytes // 4 == 1_670_800
    assert f.kv_bytes_per_token_f16 == 2 * 4 * 2 * 64 * 2 == 2048
    assert f.kv_bytes_per_token_q8_0 == 2 * 4 * 2 * 64 * 34 // 32 == 1088
    assert f.ncmoe[1].cpu_expert_bytes == experts4 == 884_736
    assert f.ncmoe[4].gpu_bytes == total - embd * Q4_K - f.expert_bytes


# ------------------------------------------------------------------ dense-30b


def test_dense_30b_numbers() -> None:
    f = fp("dense-30b")
    embd = 5120 * 151936
    per_layer = 2 * 5120 + 2 * 128 + 2 * 5120 * 8192 + 2 * 5120 * 1024 + 3 * 5120 * 23296
    assert f.total_params == 64 * per_layer + 2 * embd + 5120 == 30_497_199_104
    assert f.expert_params == f.expert_bytes == 0
    assert f.active_params == f.total_params - embd + 5120
    assert f.kv_bytes_per_token_f16 == 2 * 64 * 8 * 128 * 2 == 262_144
    assert {(r.cpu_expert_bytes, r.gpu_bytes) for r in f.ncmoe} == {(0, f.total_bytes - f.input_embd_bytes)}
    names = {t.name for t in tensor_infos(PRESETS["dense-30b"])}
    assert {"blk.63.ffn_gate.weight", "blk.63.ffn_up.weight", "blk.63.ffn_down.weight"} <= names
    assert not any("exps" in n or "gate_inp" in n for n in names)
    assert abs(f.total_params / fp("qwen3-30b-a3b").total_params - 1) < 0.002  # same size as the MoE


# ------------------------------------------------------------------ general arithmetic


def _hp(**kw: int) -> Hyperparams:
    base = dict(
        arch="x",
        n_layer=2,
        n_embd=64,
        n_head=2,
        n_head_kv=1,
        head_dim_k=32,
        head_dim_v=32,
        n_expert=4,
        n_expert_used=1,
        n_vocab=100,
        n_ctx_train=1024,
    )
    return Hyperparams(**{**base, **kw})  # type: ignore[arg-type]


def _t(name: str, ne: tuple[int, ...], ggml_type: str = "F32") -> TensorInfo:
    return TensorInfo(name, ne, ggml_type, tensor_nbytes(ne, ggml_type))


def test_expert_pattern_follows_llama_cpp_regex() -> None:
    assert _t("blk.3.ffn_gate_up_exps.weight", (64, 8, 4)).is_expert
    assert _t("blk.3.ffn_down_chexps.weight", (64, 8, 4)).is_expert
    assert _t("blk.3.ffn_up_exps.bias", (8, 4)).is_expert
    assert not _t("blk.3.ffn_gate_shexp.weight", (64, 8)).is_expert
    assert not _t("blk.3.ffn_gate_inp.weight", (64, 4)).is_expert
    assert _t("blk.12.attn_q.weight", (64, 64)).layer == 12
    assert _t("output.weight", (64, 100)).layer is None


def test_tied_embeddings_are_read_whole_and_duplicated_on_gpu() -> None:
    tensors = (
        _t("token_embd.weight", (64, 100)),
        _t("blk.0.ffn_gate_up_exps.weight", (64, 16, 4)),
        _t("blk.1.ffn_gate_up_exps.weight", (64, 16, 4)),
        _t("blk.1.ffn_gate_shexp.weight", (64, 8)),
    )
    f = footprint(TensorTable(_hp(), tensors))
    embd, exp_layer, shexp = 6400 * 4, 64 * 16 * 4 * 4, 64 * 8 * 4
    assert f.tied_embeddings
    assert f.bytes_per_token == embd + shexp + 2 * exp_layer // 4
    assert f.active_params == 6400 + 512 + 2 * 64 * 16
    assert f.ncmoe[0].gpu_bytes == embd + 2 * exp_layer + shexp  # the output layer's copy of token_embd
    assert f.ncmoe[2].gpu_bytes == embd + shexp
    assert f.expert_bytes_per_layer == (exp_layer, exp_layer)


def test_kv_bytes_per_token() -> None:
    assert kv_bytes_per_token(_hp(), "F16") == 2 * 1 * 64 * 2
    assert kv_bytes_per_token(_hp(), "Q8_0") == 2 * 1 * 64 * 34 // 32
    assert kv_bytes_per_token(_hp(head_dim_k=40, head_dim_v=40), "Q8_0") is None  # rows of 40: no q8_0 cache
    assert kv_bytes_per_token(_hp(head_dim_k=192, head_dim_v=128), "F16") == 2 * (192 + 128) * 2


def test_type_mix_roles() -> None:
    mix = TypeMix()
    assert mix.for_role("ffn_down_exps", 0, 48) == "Q6_K"
    assert mix.for_role("ffn_down_exps", 6, 48) == "Q4_K"
    assert mix.for_role("ffn_gate_exps", 0, 48) == "Q4_K"
    assert mix.for_role("attn_k_norm", 0, 48) == "F32"
    assert TypeMix(more_bits=None).for_role("attn_v", 0, 48) == "Q4_K"


# ------------------------------------------------------------------ validation


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"n_expert_used": 9}, "n_expert_used 9 exceeds n_expert 8"),
        ({"n_embd": 200}, "multiple of 256"),
        ({"n_ff_exp": 100}, "n_ff_exp"),
        ({"head_dim": 48}, "n_head * head_dim"),
        ({"n_head_kv": 3}, "multiple of n_head_kv"),
        ({"n_vocab": 100}, "n_vocab 100 is too small"),
        ({"n_layer": 0}, "n_layer must be"),
        ({"n_layer": "4"}, "n_layer must be"),
        ({"arch": "llama"}, "arch 'llama' is not supported"),
        ({"types": {"attn_q": "Q9_K"}}, "not a ggml type"),
        ({"types": {"attn_qq": "Q8_0"}}, "unknown tensor role 'attn_qq'"),
        ({"n_layers": 2}, "unknown shape option 'n_layers'"),
    ],
)
def test_make_shape_rejects_with_one_line_saying_what_to_change(overrides: dict, message: str) -> None:
    with pytest.raises(XoverError, match=re.escape(message)) as info:
        make_shape("tiny-moe", **overrides)
    assert "\n" not in str(info.value)


def test_make_shape_overrides_and_small_block_types() -> None:
    shape = make_shape(
        "tiny-moe",
        n_layer=2,
        n_embd=64,
        head_dim=16,
        n_ff_exp=64,
        types={
            k: "Q8_0"
            for k in (
                "token_embd",
                "output",
                "attn_q",
                "attn_k",
                "attn_v",
                "attn_output",
                "ffn_gate",
                "ffn_up",
                "ffn_down",
                "more_bits",
            )
        },
    )
    assert shape.n_layer == 2 and shape.types.attn_q == "Q8_0"
    assert PRESETS["tiny-moe"].n_layer == 4  # presets untouched
    assert make_shape(PRESETS["tiny-moe"]) == PRESETS["tiny-moe"]
    with pytest.raises(XoverError, match="unknown model preset 'nope'"):
        preset("nope")


def test_presets_are_valid_and_hashable() -> None:
    for shape in PRESETS.values():
        assert make_shape(shape) == shape
        hash(shape)
        assert dataclasses.asdict(shape)["types"]["token_embd"] == "Q4_K"
