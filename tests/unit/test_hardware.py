"""Hardware profiles: the table, detection parsers, TOML overrides and where each number came from."""

from __future__ import annotations

import pytest

from xover.domain import profiles as H
from xover.errors import XoverError
from xover.hardware import detect as D


def test_builtin_profiles_are_sane() -> None:
    for key in H.PROFILES:
        hw = H.builtin(key)
        assert hw.cpu.flops_per_s > 0 and hw.cpu.mem_bw_bytes_per_s > 0
        if hw.gpu:
            g = hw.gpu
            assert g.fp16_flops_per_s >= g.quant_flops_per_s > 0  # the limit bounds what llama.cpp reaches
            assert g.mem_bw_bytes_per_s > hw.cpu.mem_bw_bytes_per_s
            assert g.h2d_pinned_bytes_per_s > g.h2d_pageable_bytes_per_s
            assert g.backend in ("CUDA", "HIP")
    assert H.builtin("cpu").gpu is None
    assert H.builtin("H200").gpu.mem_bw_bytes_per_s == 4.8e12  # type: ignore[union-attr]
    assert H.builtin("h200").source("gpu.mem_bw_bytes_per_s") == "built-in"
    with pytest.raises(XoverError, match="unknown hardware profile"):
        H.builtin("tpu")


@pytest.mark.parametrize(
    "name,key",
    [
        ("NVIDIA H200", "h200"),
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("NVIDIA A100-SXM4-80GB", "a100"),
        ("NVIDIA L40S", "l40s"),
        ("NVIDIA GeForce RTX 4090", "rtx-4090"),
        ("NVIDIA GeForce RTX 3090", "rtx-3090"),
        ("NVIDIA GeForce RTX 5090", "rtx-5090"),
        ("AMD Radeon RX 7900 XTX", "rx-7900-xtx"),
        ("AMD Instinct MI300X", "mi300x"),
        ("AMD Instinct MI210", "mi210"),
        ("Tesla T4", None),
    ],
)
def test_match_profile(name: str, key: str | None) -> None:
    assert H.match_profile(name) == key


def test_detection_parsers() -> None:
    gpu = H.parse_nvidia_smi("NVIDIA H200, 143771, 143156\n")
    assert gpu == H.DetectedGpu("NVIDIA H200", "CUDA", 143771 * H.MIB, 143156 * H.MIB)
    assert H.parse_nvidia_smi("NVIDIA GeForce RTX 4090, [N/A], [N/A]").total_bytes is None  # type: ignore[union-attr]
    assert H.parse_nvidia_smi("") is None
    # the H200 lease of 2026-12-03: the budget's holder, xover's own process, a llama-bench starting
    apps = H.parse_compute_apps("905, 126764\n884, 518\n8654, [N/A]\n")
    assert apps == [(905, 126764 * H.MIB), (884, 518 * H.MIB)]
    assert H.parse_compute_apps("") == []
    rocm = "============ Product Info ============\nGPU[0]\t\t: Card Series: \t\tAMD Instinct MI300X OAM\nGPU[0]\t\t: Card SKU: \tD65209\n"
    assert H.parse_rocm_smi(rocm).name == "AMD Instinct MI300X OAM"  # type: ignore[union-attr]
    assert H.parse_rocm_smi("no cards") is None
    assert (
        H.parse_cpuinfo("processor\t: 0\nmodel name\t: AMD EPYC 9654 96-Core Processor\n")
        == "AMD EPYC 9654 96-Core Processor"
    )
    assert H.parse_cpuinfo("nothing") is None


def test_parse_bytes() -> None:
    assert H.parse_bytes("16GiB") == 16 << 30
    assert H.parse_bytes("16G") == 16 << 30
    assert H.parse_bytes("24 GB") == 24_000_000_000
    assert H.parse_bytes("15000MiB") == 15000 << 20
    assert H.parse_bytes("1.5GiB") == 3 << 29
    for bad in ("lots", "16 parsecs", ""):
        with pytest.raises(XoverError, match="amount of memory"):
            H.parse_bytes(bad)


def test_toml_overrides_record_their_source() -> None:
    hw = H.apply_toml(H.builtin("h200"), {"gpu": {"h2d_pageable_bytes_per_s": 25e9}, "cpu": {"cores": 32}}, "my.toml")
    assert hw.gpu.h2d_pageable_bytes_per_s == 25e9  # type: ignore[union-attr]
    assert hw.cpu.cores == 32 and isinstance(hw.cpu.cores, int)
    assert hw.source("gpu.h2d_pageable_bytes_per_s") == "override:my.toml"
    assert hw.source("gpu.mem_bw_bytes_per_s") == "built-in"
    assert hw.name == "h200+my"
    based = H.apply_toml(H.builtin("cpu"), {"base": "rtx-4090", "name": "desk"}, "d.toml")
    assert based.gpu.name == "NVIDIA GeForce RTX 4090" and based.name == "desk"  # type: ignore[union-attr]
    cpu_only = H.apply_toml(H.builtin("h200"), {"gpu": False}, "c.toml")
    assert cpu_only.gpu is None and cpu_only.source("gpu") == "override:c.toml"
    for bad, message in (
        ({"gpu": {"speed": 1}}, "not a hardware field"),
        ({"gpu": {"mem_bw_bytes_per_s": -1}}, "positive number"),
        ({"cpu": {"cores": True}}, "positive number"),
        ({"disk": {}}, "unknown key"),
        ({"gpu": 3}, "must be a \\[gpu\\] table"),
    ):
        with pytest.raises(XoverError, match=message):
            H.apply_toml(H.builtin("h200"), bad, "bad.toml")
    with pytest.raises(XoverError, match="must set every field"):
        H.apply_toml(H.builtin("cpu"), {"gpu": {"mem_bw_bytes_per_s": 1e12}}, "partial.toml")


def test_round_trip_through_dict() -> None:
    hw = H.apply_toml(H.builtin("rtx-4090"), {"cpu": {"flops_per_s": 2e12}}, "x.toml")
    assert H.hardware_from_dict(hw.to_dict()) == hw
    assert H.hardware_from_dict(H.builtin("cpu").to_dict()) == H.builtin("cpu")


def test_measure_cpu_is_quick_and_positive() -> None:
    flops, bw = D.measure_cpu(budget_s=0.2, copy_bytes=16 * H.MIB)
    assert flops > 1e8 and bw > 1e8


def test_detect_cpu_here() -> None:
    name, cores = D.detect_cpu()
    assert cores >= 1 and (name is None or name)
