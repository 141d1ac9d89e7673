"""Issue 19: the gpt-oss, glm4moe and deepseek2 shapes against the published parameter counts and llama.cpp's rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from xover.domain.presets import ALL_PRESETS, MXFP4_PRESETS, THEORY_ONLY, preset
from xover.domain.shapes import footprint, kv_cache_bytes, kv_swa_cells, tensor_table
from xover.gguf.inspect import arch_features, inspect_gguf, render_text
from xover.gguf.synth import write_model

# (total, active) as published on the model cards; active without the embedding matrix. Tolerance: 2% on the
# total, 8% on the active count (cards round to 0.1 B or to whole billions, and GLM's "12B" leaves out the
# 0.62 B output head that a token also reads).
PUBLISHED = {
    "gpt-oss-120b": (116.83e9, 5.13e9),  # 116.83 B: llama-bench on ggml-org's GGUF; card: 117B / 5.1B
    "gpt-oss-20b": (20.91e9, 3.61e9),  # 20.91 B: llama-bench; card: 21B / 3.6B
    "glm-4.5-air": (106e9 + 2.35e9, 12e9),  # card: 106B / 12B, plus the NextN block the GGUF carries
    "deepseek-v2-lite": (15.7e9, 2.4e9),
    "qwen3-235b-a22b": (235e9, 22e9),
    "deepseek-v3": (671e9, 37e9),  # the GGUF drops the 14B MTP module (685B with it)
    "kimi-k2": (1.03e12, 32e9),
}


@pytest.mark.parametrize("name", PUBLISHED)
def test_published_parameter_counts(name: str) -> None:
    total, active = PUBLISHED[name]
    f = footprint(tensor_table(preset(name)))
    assert f.total_params == pytest.approx(total, rel=0.02)
    assert f.active_params_no_embd == pytest.approx(active, rel=0.08)


def test_gpt_oss_matches_ggml_org_exactly() -> None:
    """llama-bench's model_size and model_n_params for ggml-org/gpt-oss-{120b,20b}-GGUF (59.02 GiB, 116.83 B;
    11.27 GiB, 20.91 B): MXFP4 experts, Q8_0 matrices, F32 router, biases, sinks and norms."""
    big, small = (footprint(tensor_table(preset(n))) for n in ("gpt-oss-120b", "gpt-oss-20b"))
    assert big.total_params == 116_829_156_672 and round(big.total_bytes / 2**30, 2) == 59.02
    assert small.total_params == 20_914_757_184 and round(small.total_bytes / 2**30, 2) == 11.27
    assert big.expert_bytes == 36 * 128 * 3 * 2880 * 2880 * 17 // 32 + 36 * 128 * 3 * 2880 * 4  # + expert biases


def test_gpt_oss_swa_and_kv() -> None:
    hp = preset("gpt-oss-120b").hparams()
    assert hp.swa_layers == tuple(range(0, 36, 2)) and hp.swa_window == 128 and hp.full_attention_layers == 18
    per_layer = 2 * 8 * 64 * 2  # K + V, 8 KV heads x 64, f16
    f = footprint(tensor_table(preset("gpt-oss-120b")))
    assert f.kv_bytes_per_token_f16 == 18 * per_layer
    assert f.kv_swa_bytes_per_cell_f16 == 18 * per_layer
    assert kv_swa_cells(hp, 32768) == 768  # pad256(128 + 512)
    assert kv_swa_cells(hp, 32768, swa_full=True) == 32768
    assert kv_swa_cells(hp, 256) == 256
    assert kv_cache_bytes(hp, 32768) == 18 * per_layer * (32768 + 768)


def test_mla_kv_is_compressed_k_only() -> None:
    """deepseek2 caches one row of kv_lora_rank + rope per layer and no V (src/llama-kv-cache.cpp: has_v = !is_mla)."""
    for name, layers in (("deepseek-v2-lite", 27), ("deepseek-v3", 61), ("kimi-k2", 61)):
        hp = preset(name).hparams()
        assert hp.is_mla and (hp.head_dim_k, hp.head_dim_v, hp.n_head_kv) == (576, 512, 1)
        f = footprint(tensor_table(preset(name)))
        assert f.kv_bytes_per_token_f16 == layers * 576 * 2
        assert f.kv_bytes_per_token_q8_0 == layers * 576 * 34 // 32


def test_shared_experts_and_dense_layers_stay_on_the_gpu() -> None:
    for name, dense, shared in (("glm-4.5-air", (0,), 1), ("deepseek-v2-lite", (0,), 2), ("deepseek-v3", (0, 1, 2), 1)):
        shape = preset(name)
        f = footprint(tensor_table(shape))
        assert f.dense_ffn_layers == dense
        assert f.shared_expert_bytes > 0 and shape.hparams().n_expert_shared == shared
        assert f.expert_bytes_per_layer[: len(dense)] == (0,) * len(dense)
        assert f.ncmoe[len(dense)].cpu_expert_bytes == 0  # the dense layers have nothing to move
        last = f.ncmoe[-1]
        assert last.cpu_expert_bytes == f.expert_bytes  # the trunk's experts (NextN blocks are never loaded)
        assert last.gpu_bytes >= f.shared_expert_bytes
        assert last.cpu_expert_bytes + last.gpu_bytes + f.input_embd_bytes + f.nextn_bytes == f.total_bytes


def test_glm_nextn_is_in_the_file_but_not_active_or_on_the_gpu() -> None:
    shape = preset("glm-4.5-air")
    table = tensor_table(shape)
    f = footprint(table)
    assert shape.block_count == 47 and table.hparams.n_layer == 46 and table.hparams.n_layer_nextn == 1
    assert table.get("blk.46.nextn.eh_proj.weight") is not None and table.get("blk.46.ffn_up_exps.weight")
    assert f.nextn_bytes == sum(t.nbytes for t in table.tensors if t.layer == 46)
    assert len(f.expert_bytes_per_layer) == 46
    assert f.ncmoe[0].gpu_bytes == f.total_bytes - f.input_embd_bytes - f.nextn_bytes
    assert f.kv_bytes_per_token_f16 == 46 * 2 * 8 * 128 * 2


def test_type_mixes() -> None:
    table = tensor_table(preset("deepseek-v2-lite"))
    types = {t.name: t.ggml_type for t in table.tensors}
    assert types["blk.1.ffn_down_exps.weight"] == "Q8_0"  # rows of 1408: Q6_K (more bits) falls back to Q8_0
    assert types["blk.4.ffn_down_exps.weight"] == "Q5_0"  # Q4_K falls back to Q5_0
    assert types["blk.1.attn_k_b.weight"] == "Q5_0"  # rows of qk_nope 128
    assert types["blk.1.ffn_down_shexp.weight"] in ("Q4_K", "Q6_K")  # rows of 2816 = 11 x 256
    gpt = {t.name: t.ggml_type for t in tensor_table(preset("gpt-oss-20b")).tensors}
    assert gpt["blk.0.ffn_up_exps.weight"] == "MXFP4" and gpt["blk.0.attn_q.weight"] == "Q8_0"
    assert gpt["blk.0.attn_sinks.weight"] == gpt["blk.0.ffn_up_exps.bias"] == gpt["blk.0.ffn_gate_inp.weight"] == "F32"


def test_theory_only_presets_give_tables() -> None:
    for name in THEORY_ONLY:
        assert footprint(tensor_table(ALL_PRESETS[name])).total_params > 200e9
    assert set(MXFP4_PRESETS) == {"tiny-gpt-oss", "gpt-oss-120b", "gpt-oss-20b"}


@pytest.mark.parametrize("name", ["tiny-gpt-oss", "tiny-glm4moe", "tiny-deepseek2"])
def test_inspect_shows_the_features(name: str, tmp_path: Path) -> None:
    report = inspect_gguf(write_model(preset(name), tmp_path / "m.gguf").path)
    text = render_text(report)
    features = report.to_dict()["features"]
    assert features == arch_features(report.hparams, report.footprint)
    assert features["n_cpu_moe"]["first_moe_layer"] == preset(name).n_dense_lead
    if name == "tiny-gpt-oss":
        assert "sliding window of 128 tokens in 2 of 4 layers (0, 2)" in text
        assert features["swa"] == {"window": 128, "layers": [0, 2], "full_attention_layers": 2}
        assert features["mla"] is None and features["shared_experts"] is None
    elif name == "tiny-glm4moe":
        assert "plus 1 shared" in text and "layer 0: dense FFN" in text and "NextN/MTP" in text
        assert "shared experts and dense layers stay on the GPU" in text
        assert features["dense_layers"] == [0] and features["nextn"]["layers"] == 1
    else:
        assert "MLA: kv_lora_rank 256, no q_lora" in text and "(MLA: compressed K only)" in text
        assert features["mla"]["cache_row"] == 256 + 32 and features["shared_experts"]["count"] == 2


@pytest.mark.parametrize(
    ("name", "overrides", "message"),
    [
        ("tiny-glm4moe", {"expert_bias": False}, "requires exp_probs_b"),
        ("tiny-gpt-oss", {"swa_window": 0}, "needs a sliding window"),
        ("tiny-gpt-oss", {"n_expert_shared": 1}, "no shared experts"),
        ("tiny-deepseek2", {"n_head_kv": 2}, "n_head_kv 1"),
        ("tiny-moe", {"kv_lora_rank": 64}, "MLA fields"),
        ("tiny-moe", {"swa_window": 128}, "no sliding-window attention"),
    ],
)
def test_arch_rules_say_what_to_change(name: str, overrides: dict, message: str) -> None:
    from xover.domain.presets import make_shape
    from xover.errors import XoverError

    with pytest.raises(XoverError, match=message):
        make_shape(name, **overrides)
