"""Carrying measurements to another machine through the theory (issue 20): known answers on constructed
machines. A prediction, never a measurement: the ratio is the theory's, the measured value is kept beside it."""

import dataclasses

import pytest

from xover.analysis.theory import Offload, model_terms
from xover.analysis.translate import SETUPS, ratio, setups_for_budget, translate
from xover.domain.presets import preset
from xover.domain.profiles import builtin
from xover.domain.shapes import tensor_table

GIB = 1 << 30
TERMS = model_terms(tensor_table(preset("qwen3-30b-a3b")))


def test_the_same_machine_translates_to_itself():
    hw = builtin("h200")
    (t,) = translate(TERMS, hw, hw, Offload(n_cpu_moe=10), [(8192, 8.5, 100.0)], 200)
    assert (t.ttft_s, t.decode_tps) == pytest.approx((8.5, 100.0))
    assert t.total_s == pytest.approx(t.measured_total_s) == pytest.approx(8.5 + 2.0)


def test_a_slower_link_slows_offloaded_prefill_and_slower_host_memory_slows_decode():
    src = builtin("h200")
    assert src.gpu is not None
    slow_link = dataclasses.replace(
        src, gpu=dataclasses.replace(src.gpu, h2d_pinned_bytes_per_s=src.gpu.h2d_pinned_bytes_per_s / 4)
    )
    pinned = Offload(n_cpu_moe=23, ubatch=4096, pinned=True)
    r = ratio(TERMS, src, slow_link, pinned, 32768)
    assert r.ttft > 1.5 and r.decode == pytest.approx(1.0)  # decode reads experts on the CPU, not over the link
    slow_ram = dataclasses.replace(
        src, cpu=dataclasses.replace(src.cpu, mem_bw_bytes_per_s=src.cpu.mem_bw_bytes_per_s / 2)
    )
    r = ratio(TERMS, src, slow_ram, Offload(n_cpu_moe=23), 1024)
    assert r.decode < 0.8
    # nothing on the CPU but the token embeddings: the host hardly matters to decode
    assert ratio(TERMS, src, slow_ram, Offload(n_cpu_moe=0), 1024).decode == pytest.approx(1.0, rel=1e-3)


def test_the_setups_a_budget_emulates():
    assert [s.key for s in setups_for_budget(16 * GIB)] == ["rtx-4080+ddr4", "rtx-5080+ddr5"]
    assert [s.key for s in setups_for_budget(24 * GIB)] == ["rtx-3090+ddr4", "rtx-4090+ddr5"]
    assert [s.key for s in setups_for_budget(32 * GIB)] == ["rtx-5090+ddr5"]
    assert setups_for_budget(80 * GIB) == ()
    assert all("GB/s pinned" in s.describe() for s in SETUPS)


def test_each_translation_carries_the_target_limit_and_this_hosts_share_of_its_own():
    from xover.analysis.theory import predict_point

    src, tgt = builtin("h200"), SETUPS[0].hardware()
    config = Offload(n_cpu_moe=23)
    src_limit = predict_point(TERMS, src, config, 4096).limit_decode_tps
    tgt_limit = predict_point(TERMS, tgt, config, 4096).limit_decode_tps
    assert tgt_limit < src_limit  # a 2-channel desktop's RAM holds the same experts back more
    (t,) = translate(TERMS, src, tgt, config, [(4096, 5.0, src_limit / 10)], 200)
    assert t.source_decode_share == pytest.approx(0.1)
    assert t.decode_limit_tps == pytest.approx(tgt_limit)
    assert t.decode_tps < t.decode_limit_tps  # carrying a tenth of the limit stays under the target's limit
    assert t.limit_total_s == pytest.approx(t.ttft_s + 200 / tgt_limit)
