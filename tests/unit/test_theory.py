"""Known-answer tests of the theory: every formula on shapes whose answers are computed by hand."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest

from xover.analysis import theory as T
from xover.domain.config import LlamaConfig
from xover.domain.presets import PRESETS
from xover.domain.profiles import CpuSpec, GpuSpec, Hardware, builtin
from xover.domain.shapes import Hyperparams, TensorInfo, TensorTable, tensor_nbytes, tensor_table
from xover.errors import XoverError

MIB = 1 << 20


def _t(name: str, ne: tuple[int, ...], ggml_type: str = "F16") -> TensorInfo:
    return TensorInfo(name, ne, ggml_type, tensor_nbytes(ne, ggml_type))


# Two layers, 4 experts of which 1 is used; everything F16 (2 bytes per weight), so figures are exact:
# dense matmul params: output 256*512 + attn_q 256*256 = 196608 (393216 bytes on the GPU);
# experts: 256*128*4 = 131072 params, 262144 bytes per layer; one embedding row: 512 bytes;
# KV cache: 2 layers * 2 KV heads * (64 + 64) * 2 bytes = 1024 bytes per token.
HAND = TensorTable(
    hparams=Hyperparams(
        arch="qwen3moe",
        n_layer=2,
        n_embd=256,
        n_head=4,
        n_head_kv=2,
        head_dim_k=64,
        head_dim_v=64,
        n_expert=4,
        n_expert_used=1,
        n_vocab=512,
        n_ctx_train=4096,
    ),
    tensors=(
        _t("token_embd.weight", (256, 512)),
        _t("output.weight", (256, 512)),
        _t("blk.0.attn_q.weight", (256, 256)),
        _t("blk.0.ffn_up_exps.weight", (256, 128, 4)),
        _t("blk.1.ffn_up_exps.weight", (256, 128, 4)),
    ),
)
TERMS = T.model_terms(HAND)

# Round rates: GPU 1 TFLOP/s (2 at peak), 1 GB/s; CPU 1 GFLOP/s, 1 TB/s (compute-bound); link 120 MB/s.
HW = Hardware(
    name="hand",
    gpu=GpuSpec(
        name="gpu",
        backend="CUDA",
        fp16_flops_per_s=2e12,
        quant_flops_per_s=1e12,
        mem_bw_bytes_per_s=1e9,
        mem_bytes=1 << 30,
        h2d_pinned_bytes_per_s=1.2e8,
        h2d_pageable_bytes_per_s=0.6e8,
    ),
    cpu=CpuSpec(name="cpu", cores=1, flops_per_s=1e9, mem_bw_bytes_per_s=1e12),
)
QWEN = T.model_terms(tensor_table(PRESETS["qwen3-30b-a3b"]))
TINY = T.model_terms(tensor_table(PRESETS["tiny-moe"]))


def test_model_terms_by_hand() -> None:
    assert TERMS.dense_params == 196608
    assert TERMS.dense_gpu_bytes == 393216
    assert TERMS.expert_params_layer == (131072, 131072)
    assert TERMS.expert_bytes_layer == (262144, 262144)
    assert TERMS.expert_copy_tensors_layer == ((262144,), (262144,))
    assert TERMS.embd_row_bytes == 512
    assert TERMS.kv_bytes_per_token == 1024
    assert TERMS.active_fraction == 0.25
    assert TERMS.gpu_weight_bytes(1) == 393216 + 262144


def test_coverage_formula() -> None:
    assert T.coverage(1, 128, 8) == pytest.approx(0.0625)  # one token reads k/E of the experts
    assert T.coverage(512, 128, 8) == pytest.approx(1 - (120 / 128) ** 512)
    assert 1 - T.coverage(512, 128, 8) < 1e-14  # essentially every expert
    assert T.coverage(2, 4, 1) == pytest.approx(1 - 0.75**2)
    assert T.coverage(7, 0, 0) == 1.0  # dense: the whole FFN
    with pytest.raises(XoverError):
        T.coverage(0, 128, 8)


def test_copied_bytes_counts_used_experts_and_padding() -> None:
    assert T.copied_bytes(4000, 4, 1.0) == 4000  # every expert, one run ending at the last: no padding
    assert T.copied_bytes(4000, 4, 0.0) == 0
    # half the experts: 2000 bytes, plus (E-1) c (1-c) = 0.75 runs of min(1000, 512) padding
    assert T.copied_bytes(4000, 4, 0.5) == pytest.approx(2000 + 0.75 * 512)
    full = T.expert_transfer_bytes(QWEN, 18, 512)
    assert full == pytest.approx(T.cpu_expert_bytes(QWEN, 18), rel=1e-9)  # a 512-token ubatch copies all
    assert T.expert_transfer_bytes(QWEN, 18, 1) < 0.07 * full  # one token: ~k/E (+ padding)


def test_decode_intensity_by_hand() -> None:
    d = T.decode_intensity(TERMS, 0)
    assert d.weight_bytes == 393216 + 512 + 262144 // 2  # dense + one embedding row + k/E of 2 layers' experts
    assert d.weight_flops == 2 * (196608 + 65536)
    assert d.weight_intensity == pytest.approx(524288 / 524800)  # F16: 2 FLOP per 2 bytes, ~1
    deep = T.decode_intensity(TERMS, 1000)
    assert deep.kv_bytes == 1024 * 1000
    # attention: 4 n_layer n_head head_dim n = 4 * 2 * 4 * 64 * 1000
    assert deep.attention_flops == 4 * 2 * 4 * 64 * 1000
    assert "1.00 FLOP/byte" in T.decode_intensity_note(TERMS)
    # quantized weights: Q4_K_M-like ~5 bits per weight -> ~3.2 FLOP/byte whatever the size
    assert T.decode_intensity(QWEN, 0).weight_intensity == pytest.approx(16 / 5.05, rel=0.01)
    assert T.decode_intensity(TINY, 0).weight_intensity == pytest.approx(
        T.decode_intensity(QWEN, 0).weight_intensity, rel=0.1
    )


def test_prefill_intensity_grows_with_the_ubatch() -> None:
    one, big = T.prefill_intensity(QWEN, 1), T.prefill_intensity(QWEN, 512)
    assert one.coverage == pytest.approx(0.0625)
    assert one.intensity == pytest.approx(T.decode_intensity(QWEN, 0).intensity, rel=0.01)
    assert big.intensity > 50 * one.intensity
    ridge = T.Ridge("r", 1e12, 1e10)  # 100 FLOP/byte
    b = T.compute_bound_ubatch(QWEN, ridge)
    assert b is not None
    assert T.prefill_intensity(QWEN, b).intensity >= 100 > T.prefill_intensity(QWEN, b - 1).intensity
    h200 = {r.name: r for r in T.ridges(builtin("h200"))}
    assert h200["GPU fp16 peak"].flop_per_byte == pytest.approx(989e12 / 4.8e12)


def test_quadratic_attention_64x_entries_8x_storage() -> None:
    short, long_ = T.attention_row(QWEN, 4096), T.attention_row(QWEN, 32768)
    assert long_.score_entries / short.score_entries == 64
    assert long_.kv_bytes / short.kv_bytes == 8
    assert short.score_entries == 48 * 32 * 4096 * 4096
    assert long_.attention_share > short.attention_share
    # one ubatch of the whole prompt: B x L scores per head and layer, 4 n_layer n_head head_dim each
    assert T.prefill_attention_flops(TERMS, 512, 512) == 4 * 2 * 4 * 64 * 512 * 512
    # two ubatches of 256: 256 * 256 + 256 * 512 score pairs
    assert T.prefill_attention_flops(TERMS, 512, 256) == 4 * 2 * 4 * 64 * (256 * 256 + 256 * 512)
    # flash attention off: f32 n_head x ubatch x n_kv per layer; on: the f16 ubatch x n_kv mask
    assert long_.fa_off_scores_bytes == 32 * 512 * 32768 * 4
    assert long_.mask_bytes_fa_on == 512 * 32768 * 2


def test_decode_time_by_hand() -> None:
    cfg = T.Offload(n_cpu_moe=1)
    p = T.predict_point(TERMS, HW, cfg, 1000)
    gpu = (393216 + 262144 / 4) / 1e9  # dense + k/E of layer 1's experts, bandwidth-bound
    cpu = max(2 * 131072 / 4 / 1e9, (512 + 262144 / 4) / 1e12)  # the CPU is compute-bound here
    per_key = max(4 * 2 * 4 * 64 / 1e12, 1024 / 1e9)
    assert 1 / p.decode_tps == pytest.approx(gpu + cpu + 1001 * per_key)
    # R tokens at depths L .. L+R-1
    expected_decode = sum(gpu + cpu + (1000 + j + 1) * per_key for j in range(200))
    assert p.total_s == pytest.approx(p.ttft_s + expected_decode)
    assert p.prefill_tps == pytest.approx(1000 / p.ttft_s)


def _loop_prefill(costs: T._Costs, length: int, depth: int) -> float:
    """The same prefill, one ubatch at a time."""
    s, pos, B = 0.0, depth, costs.cfg.ubatch
    while pos < depth + length:
        b = min(B, depth + length - pos)
        pos += b
        s += costs.ubatch_s(b) + pos * costs.attn_per_key_s(b)
    return s


@pytest.mark.parametrize("length,depth,ubatch", [(1, 0, 512), (1000, 0, 512), (1024, 4096, 256), (5000, 77, 512)])
def test_closed_form_prefill_matches_a_loop(length: int, depth: int, ubatch: int) -> None:
    c = T._costs(QWEN, builtin("h200"), T.Offload(n_cpu_moe=12, ubatch=ubatch), "prediction")
    assert c.prefill_s(length, depth) == pytest.approx(_loop_prefill(c, length, depth), rel=1e-12)


def test_op_offload_crossover_by_hand() -> None:
    # CPU experts of layer 0: with op offload a ubatch copies ~262144 bytes at 120 MB/s (pinned) and computes them on
    # the GPU (bandwidth-bound, 262144 / 1e9 s); without, the CPU computes 2 L k/E 131072 FLOPs at 1 GFLOP/s.
    # Equal at L = (262144/1.2e8 + 262144/1e9) / (65536/1e9) = 37.33: op offload wins from 38 tokens.
    on, off = T.Offload(n_cpu_moe=1, pinned=True), T.Offload(n_cpu_moe=1, op_offload=False, pinned=True)
    (pair,) = T.predicted_pairs(TERMS, HW, [on, off], [64, 1024])
    assert [c.length for c in pair.crossings] == [38.0]
    # from pageable memory (60 MB/s) the copy takes twice as long: (262144/6e7 + 262144/1e9) / 65536e-9 = 70.67
    pageable = [dataclasses.replace(c, pinned=False) for c in (on, off)]
    assert [c.length for c in T.predicted_pairs(TERMS, HW, pageable, [64, 1024])[0].crossings] == [71.0]
    assert pair.crossings[0].extrapolated  # below the shortest length asked for
    assert pair.faster_long == "nopo=0"
    # below GGML_OP_OFFLOAD_MIN_BATCH both compute on the CPU: identical
    assert T.predict_point(TERMS, HW, on, 31).ttft_s == T.predict_point(TERMS, HW, off, 31).ttft_s
    # decode batches are one token: op offload changes nothing
    assert T.predict_point(TERMS, HW, on, 512).decode_tps == T.predict_point(TERMS, HW, off, 512).decode_tps


def test_pinned_copies_faster_and_more_offload_is_slower() -> None:
    h200 = builtin("h200")
    pageable = T.predict_point(QWEN, h200, T.Offload(n_cpu_moe=18), 4096)
    pinned = T.predict_point(QWEN, h200, T.Offload(n_cpu_moe=18, pinned=True), 4096)
    assert pinned.prefill_tps > pageable.prefill_tps
    assert pinned.decode_tps == pageable.decode_tps
    tps = [T.predict_point(QWEN, h200, T.Offload(n_cpu_moe=n), 4096) for n in (0, 12, 18, 24)]
    assert all(a.decode_tps > b.decode_tps and a.prefill_tps > b.prefill_tps for a, b in itertools.pairwise(tps))


def test_cpu_only_moves_nothing() -> None:
    cpu = builtin("cpu")
    a = T.predict_point(TINY, cpu, T.Offload(n_cpu_moe=0), 2048)
    b = T.predict_point(TINY, cpu, T.Offload(n_cpu_moe=4, op_offload=False), 2048)
    assert a == dataclasses.replace(b)
    pairs = T.predicted_pairs(TINY, cpu, [T.Offload(n_cpu_moe=0), T.Offload(n_cpu_moe=4)], [1024])
    assert pairs[0].crossings == ()


def test_roofline_limit_bounds_the_prediction() -> None:
    h200 = builtin("h200")
    for cfg in (T.Offload(), T.Offload(n_cpu_moe=18), T.Offload(n_cpu_moe=18, op_offload=False)):
        for depth in (0, 1000, 32000):
            lim = T.roofline_limit(QWEN, h200, cfg, depth)
            c = T._costs(QWEN, h200, cfg, "prediction")
            assert lim.prefill_tps >= 512 / c.prefill_s(512, depth)
            assert lim.decode_tps >= 1 / c.decode_s(depth)
    # decode at ncmoe 0 is bandwidth-bound: the limit is the bytes over the bandwidth (the embedding row
    # comes from host memory)
    lim0 = T.roofline_limit(QWEN, h200, T.Offload(), 0)
    expected = (QWEN.dense_gpu_bytes + sum(QWEN.expert_bytes_layer) / 16) / 4.8e12 + QWEN.embd_row_bytes / 92e9
    assert 1 / lim0.decode_tps == pytest.approx(expected + max(T.attention_flops(QWEN, 1, 1) / 989e12, 98304 / 4.8e12))
    with pytest.raises(XoverError):
        T.roofline_limit(QWEN, h200, T.Offload(n_cpu_moe=49), 0)


def test_memory_estimate_matches_llama_cpp_cpu_logs() -> None:
    # llama-bench -lm none --repack 0 on tiny-moe (CPU build): model 4.46 MiB; KV 1.00 / 9.00 MiB;
    # compute 5.51 MiB (FA on, n_ctx 512), 8.01 MiB (FA off, 512), 48.01 MiB (FA off, 4608)
    on = T.memory_estimate(TINY, 0, 512, 512, flash_attn=True, device="cpu")
    assert on.model_bytes == TINY.total_bytes
    assert on.kv_bytes == 1 * MIB
    assert on.compute_bytes / MIB == pytest.approx(5.51, rel=0.01)
    assert T.memory_estimate(TINY, 0, 512, 512, flash_attn=False, device="cpu").compute_bytes / MIB == pytest.approx(
        8.01, rel=0.01
    )
    off = T.memory_estimate(TINY, 0, 4608, 512, flash_attn=False, device="cpu")
    assert off.kv_bytes == 9 * MIB
    assert off.compute_bytes / MIB == pytest.approx(48.01, rel=0.01)
    # CUDA on an H200, qwen3-30b-a3b shape, n_ctx 512: CUDA0 model buffer 11197.43 MiB at -ncmoe 18,
    # 17524.43 MiB at 0; KV 48 MiB; compute 342 MiB (the estimate is rough: 12 % under)
    assert T.memory_estimate(QWEN, 18, 512).model_bytes / MIB == pytest.approx(
        11197.43, abs=0.05
    )  # + tensor alignment padding
    gpu0 = T.memory_estimate(QWEN, 0, 512)
    assert gpu0.model_bytes / MIB == pytest.approx(17524.43, abs=0.05)
    assert gpu0.kv_bytes == 48 * MIB
    assert gpu0.compute_bytes / MIB == pytest.approx(342, rel=0.15)
    assert T.memory_estimate(QWEN, 0, 500).kv_bytes == 48 * MIB  # n_ctx rounds up to 256


def test_placement_picks_the_smallest_ncmoe_that_fits() -> None:
    budget = 16 << 30
    rows = T.plan_placement(QWEN, budget, [4096, 32768, 262144], headroom_bytes=512 * MIB)
    for row in rows[:2]:
        n = row.n_cpu_moe
        assert n is not None and n > 0
        assert T.memory_estimate(QWEN, n, row.n_ctx).total_bytes + 512 * MIB <= budget
        assert T.memory_estimate(QWEN, n - 1, row.n_ctx).total_bytes + 512 * MIB > budget
    assert rows[1].n_cpu_moe > rows[0].n_cpu_moe  # a longer context needs more experts out
    assert rows[2].n_cpu_moe is None  # 262144 tokens of f16 KV (24 GiB) cannot fit 16 GiB
    assert T.plan_placement(QWEN, 40 << 30, [4096])[0].n_cpu_moe == 0


def test_offload_of_a_configuration_and_labels() -> None:
    bench = T.offload_of(
        LlamaConfig(
            "b",
            settings=(
                ("n-cpu-moe", "18"),
                ("no-op-offload", "1"),
                ("ubatch-size", "256"),
                ("GGML_OP_OFFLOAD_MIN_BATCH", "64"),
            ),
        )
    )
    assert bench == T.Offload(n_cpu_moe=18, op_offload=False, ubatch=256, op_offload_min_batch=64)
    # --no-mmap passed through to llama-server pins host weights as -lm none does
    server = T.offload_of(
        LlamaConfig("s", settings=(("n-cpu-moe", "12"), ("no-op-offload", "1")), server_args=("--jinja", "--no-mmap"))
    )
    assert server == T.Offload(n_cpu_moe=12, op_offload=False, pinned=True)
    pinned = LlamaConfig("p", settings=(("load-mode", "none"), ("n-gpu-layers", "-1")))
    assert T.offload_of(pinned) == T.Offload(pinned=True)
    with pytest.raises(XoverError):
        T.offload_of(LlamaConfig("x", settings=(("n-cpu-moe", "x"),)))
    labels = T.config_labels([T.Offload(n_cpu_moe=12), T.Offload(n_cpu_moe=18, op_offload=False)])
    assert labels == ["ncmoe=12 nopo=0", "ncmoe=18 nopo=1"]
    assert T.config_labels([T.Offload(n_cpu_moe=18)]) == ["ncmoe=18"]


def _prediction() -> dict:
    configs = (T.Offload(n_cpu_moe=12), T.Offload(n_cpu_moe=18))
    return T.build_prediction(
        T.TheoryInputs(
            QWEN,
            builtin("h200"),
            configs,
            (1024, 4096),
            {"name": "qwen"},
            "2026-11-30T00:00:00+0000",
            1,
            vram_budget_bytes=24 << 30,
        )
    )


def test_prediction_schema_and_lookup() -> None:
    pred = _prediction()
    assert pred["schema"] == T.PREDICTION_SCHEMA and pred["created_unix_ns"] == 1
    assert [c["label"] for c in pred["configs"]] == ["ncmoe=12", "ncmoe=18"]
    point = pred["configs"][1]["points"][0]
    assert point["length"] == 1024 and point["fits"] is True
    assert set(T.METRICS) <= set(point)
    assert T.predicted_value(pred, "ncmoe=18", 1024, "ttft_s") == point["ttft_s"]
    assert T.predicted_value(pred, T.Offload(n_cpu_moe=18), 1024, "decode_tps") == point["decode_tps"]
    between = T.predicted_value(pred, "ncmoe=18", 1000, "pp_tps")  # a bench depth nobody asked for: interpolated
    exact = T.predict_point(QWEN, builtin("h200"), T.Offload(n_cpu_moe=18), 1000).pp_tps
    assert between == pytest.approx(exact, rel=0.01)
    assert T.predicted_value(pred, "ncmoe=24", 1024, "ttft_s") is None
    assert T.predicted_value(pred, "ncmoe=18", 10**7, "ttft_s") is None
    with pytest.raises(XoverError):
        T.predicted_value(pred, "ncmoe=18", 1024, "speed")
    with pytest.raises(XoverError):
        T.predicted_value({"schema": "other"}, "ncmoe=18", 1024, "ttft_s")
    assert pred["crossovers"] == [
        {
            "a": "ncmoe=12",
            "b": "ncmoe=18",
            "lengths": [],
            "faster_short": "ncmoe=12",
            "faster_long": "ncmoe=12",
            "max_length": 16384,
        }
    ]
    assert any("uniform expert routing" in a for a in pred["assumptions"])


def test_theory_report_on_cpu_only() -> None:
    report = T.theory_report(
        T.TheoryInputs(
            TINY,
            builtin("cpu"),
            (T.Offload(n_cpu_moe=0), T.Offload(n_cpu_moe=2)),
            (1024, 4096),
            {"name": "tiny"},
            "now",
            0,
            vram_budget_bytes=1 << 30,
        )
    )
    assert report["schema"] == T.THEORY_SCHEMA
    assert report["placement"] is None  # no GPU to place on
    assert report["experts"]["coverage"]["1"] == pytest.approx(2 / 8)
    assert [r["n_cpu_moe"] for r in report["experts"]["rows"]] == [0, 2]
    assert report["experts"]["rows"][1]["copy_s_pinned"] is None
    assert report["experts"]["mmq_tile_padding"] == {}  # no GPU kernels, no tiles
    gpu = T.theory_report(
        T.TheoryInputs(TINY, builtin("h200"), (T.Offload(n_cpu_moe=0),), (1024,), {"name": "tiny"}, "now", 0)
    )
    # tiny-moe: 2 of 8 experts; at 512 tokens each expert gets ~128 (one or two tiles of 128)
    assert gpu["experts"]["mmq_tile_padding"]["512"] == pytest.approx(T.expert_tile_padding(512, 8, 2))
    assert gpu["experts"]["mmq_tile_padding"]["1"] == 1.0
    assert math.isclose(
        report["attention"]["rows"][1]["score_entries"] / report["attention"]["rows"][0]["score_entries"], 16
    )
    assert report["prediction"]["crossovers"][0]["lengths"] == []


def test_mmq_tile_padding_of_expert_matmuls() -> None:
    from xover.analysis.theory import expert_tile_padding, mmq_tile

    # llama.cpp's tile choice: the first of its tiles (mmq-config-ampere.cuh: 8..48, 64, 80, 96, 112, 128) giving
    # the fewest tiles. Was "any multiple of 8" (100 -> 104, 130 -> 72): the pinned source has no 56/72/88/104/120.
    assert [mmq_tile(b) for b in (9, 100, 128, 130, 512, 4096)] == [16, 112, 128, 80, 128, 128]
    # rows not a multiple of 128 (gpt-oss's 2880) leave 8, 16, 32, 64, 128
    assert [mmq_tile(b, fallback=True) for b in (9, 24, 100, 130, 512)] == [16, 32, 128, 128, 128]
    # 512 tokens, 8 of 128 experts: ~32 tokens per expert, one 128-column tile each -> 4x the useful columns
    assert expert_tile_padding(512, 128, 8) == pytest.approx(4.0, rel=1e-6)
    # 1024: 64 per expert in one tile -> 2x; 4096: 256 +- 15.5 per expert -> 2 or 3 tiles -> ~1.24x
    assert expert_tile_padding(1024, 128, 8) == pytest.approx(2.0, rel=1e-3)
    assert 1.2 < expert_tile_padding(4096, 128, 8) < 1.3
    # dense models and vector-kernel batches pay nothing
    assert expert_tile_padding(512, 0, 0) == 1.0 and expert_tile_padding(8, 128, 8) == 1.0


def test_predictions_count_the_padding_and_limits_do_not() -> None:
    from xover.analysis.theory import Offload, model_terms, predict_point
    from xover.domain.presets import preset
    from xover.domain.profiles import builtin
    from xover.domain.shapes import tensor_table

    terms = model_terms(tensor_table(preset("qwen3-30b-a3b")))
    h200, rdna = builtin("h200"), builtin("rx-7900-xtx")
    ub512, ub4096 = Offload(n_cpu_moe=0, ubatch=512), Offload(n_cpu_moe=0, ubatch=4096)
    # at -ub 4096 the padding is 1.24x instead of 4x: prefill predicted faster on the H200, not on RDNA3
    fast = (
        predict_point(terms, h200, ub4096, 16384, 1).prefill_tps
        / predict_point(terms, h200, ub512, 16384, 1).prefill_tps
    )
    assert fast > 1.5
    same = (
        predict_point(terms, rdna, ub4096, 16384, 1).prefill_tps
        / predict_point(terms, rdna, ub512, 16384, 1).prefill_tps
    )
    assert same < 1.2


# --------------------------------------------------------------------------------------------------
# other architectures (issue 19)


def _terms(name: str):  # type: ignore[no-untyped-def]
    from xover.analysis.theory import model_terms
    from xover.domain.presets import preset
    from xover.domain.shapes import tensor_table

    return model_terms(tensor_table(preset(name)))


def test_gpt_oss_swa_bounds_kv_and_attention() -> None:
    t = _terms("gpt-oss-120b")
    assert (t.n_layer_full, t.n_layer_swa, t.swa_window) == (18, 18, 128)
    assert t.kv_bytes_per_token == t.kv_swa_bytes_per_cell == 18 * 8 * 64 * 2 * 2
    # the SWA cache stops at window + ubatch, padded to 256 (llama-kv-cache-iswa.cpp): 768 cells
    assert t.swa_cells(8192, 512) == 768 and t.swa_cells(512, 512) == 512
    assert t.kv_cache_bytes(32768) == 36864 * (32768 + 768)
    # one decoded token at 32K: the full layers read 32K keys, the SWA layers at most window + 1
    full_only = 2.0 * 18 * 64 * 128 * 32768
    assert T.attention_flops(t, 1, 32768) == full_only + 2.0 * 18 * 64 * 128 * 129
    assert T.decode_intensity(t, 32768).kv_bytes == 36864 * (32768 + 129)
    # prefill: the SWA part of 8 ubatches of 512 is capped at 640 keys each, summed in closed form
    swa = T.prefill_attention_flops(t, 4096, 512) - 2.0 * 18 * 64 * 128 * 512 * 512 * 36
    assert swa == pytest.approx(2.0 * 18 * 64 * 128 * 512 * (512 + 640 * 7))
    # MXFP4 experts have MMQ kernels; 2880 rows are not a multiple of 128: the reduced tile set
    assert t.expert_mmq and t.expert_mmq_fallback


def test_swa_prefill_and_decode_costs_match_a_loop() -> None:
    from xover.analysis.theory import Offload, _costs
    from xover.domain.profiles import builtin

    t = _terms("gpt-oss-20b")
    c = _costs(t, builtin("h200"), Offload(ubatch=512), "prediction")
    looped = sum(
        c.ubatch_s(512) + e * c.attn_per_key_s(512) + min(e, 128 + 512) * c.swa_per_key_s(512)
        for e in range(512, 4097, 512)
    )
    looped += c.ubatch_s(100) + 4196 * c.attn_per_key_s(100) + min(4196, 228) * c.swa_per_key_s(100)
    assert c.prefill_s(4196) == pytest.approx(looped, rel=1e-12)
    assert c.decode_sum_s(100, 300) == pytest.approx(sum(c.decode_s(d) for d in range(100, 400)), rel=1e-12)


def test_mla_attention_is_absorbed_and_kv_compressed() -> None:
    t = _terms("deepseek-v3")
    assert t.is_mla and (t.head_dim_k, t.head_dim_v, t.n_head_kv) == (576, 512, 1)
    assert t.kv_bytes_per_token == 61 * 576 * 2 and t.kv_swa_bytes_per_cell == 0
    assert T.attention_flops(t, 1, 1000) == 2.0 * 61 * 128 * (576 + 512) * 1000
    assert t.dense_ffn_layers == 3 and t.shared_expert_bytes > 0 and t.expert_bytes_layer[:3] == (0, 0, 0)


def test_glm_nextn_is_not_loaded_and_shared_experts_stay_on_the_gpu() -> None:
    from xover.domain.presets import preset
    from xover.domain.shapes import nextn_bytes, tensor_table, total_bytes

    table = tensor_table(preset("glm-4.5-air"))
    t = _terms("glm-4.5-air")
    assert t.nextn_bytes == nextn_bytes(table) > 0 and t.total_bytes == total_bytes(table)
    cpu = T.memory_estimate(t, 0, 4096, device="cpu")
    assert cpu.model_bytes == total_bytes(table) - nextn_bytes(table)
    # every expert on the CPU: the shared experts and the dense layer 0 stay on the GPU
    gpu = T.memory_estimate(t, t.n_layer, 4096)
    assert gpu.model_bytes == t.dense_gpu_bytes and t.shared_expert_bytes < t.dense_gpu_bytes
    # --n-cpu-moe 1 moves nothing (layer 0 is dense)
    assert T.memory_estimate(t, 1, 4096).model_bytes == T.memory_estimate(t, 0, 4096).model_bytes
    arch = T.architecture_terms(t)
    assert arch["dense_ffn_layers"] == 1 and arch["ubatch_bytes_per_cpu_layer"] == pytest.approx(
        t.expert_bytes_layer[1], rel=1e-3
    )


def test_planner_on_the_new_presets() -> None:
    gib = 1 << 30
    for name, expected in (
        ("gpt-oss-120b", (23, 24)),
        ("gpt-oss-20b", (0, 0)),
        ("glm-4.5-air", (34, 37)),
        ("qwen3-235b-a22b", (83, 86)),
    ):
        plan = T.plan_placement(_terms(name), 24 * gib, (8192, 32768))
        assert tuple(p.n_cpu_moe for p in plan) == expected, name
