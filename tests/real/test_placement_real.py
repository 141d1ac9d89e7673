"""The memory estimate behind the placement planner, against the buffer sizes the real llama.cpp logs.

llama-bench -v on the tiny-moe model (CPU build) logs ``CPU model buffer size``, ``CPU KV buffer size``
and ``CPU compute buffer size``; the model and KV estimates must agree within a few percent, the
compute buffer estimate (documented as rough) within 25 %. Weights are loaded without mmap and
without repacking (``-lm none --repack 0``) so that one plain CPU buffer holds them all.

The other architectures (tiny-gpt-oss: iSWA, two caches; tiny-glm4moe: a NextN block in the file, not
loaded; tiny-deepseek2: MLA, K only) must match to the logged precision (two decimals of MiB), cache by
cache and cell count by cell count; their compute buffer within 10 % (measured at 1024 / 4096 cells:
gpt-oss -0.3 / -0.2 %, glm4moe +7.9 / +5.1 %, deepseek2 +5.5 / +4.0 %).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from xover.analysis.theory import memory_estimate, model_terms
from xover.domain.presets import ALL_PRESETS, PRESETS
from xover.domain.shapes import tensor_table
from xover.llamacpp.process import spawn, stop

pytestmark = pytest.mark.real

_CACHE = re.compile(r"llama_kv_cache: size =\s+(?P<mib>[\d.]+) MiB \(\s*(?P<cells>\d+) cells,\s+(?P<layers>\d+) layers")
_COMPUTE_EXACT = re.compile(r"CPU compute buffer size is\s+(?P<mib>[\d.]+) MiB")

_BUFFER = re.compile(r"(?P<dev>\S+)\s+(?P<kind>model|KV|compute) buffer size =\s+(?P<mib>[\d.]+) MiB")


def parse_buffer_sizes(log: str) -> dict[str, float]:
    """``{"model": MiB, "KV": MiB, "compute": MiB}`` summed over devices, from llama.cpp's load log."""
    sizes: dict[str, float] = {}
    for m in _BUFFER.finditer(log):
        sizes[m["kind"]] = sizes.get(m["kind"], 0.0) + float(m["mib"])
    return sizes


def test_parse_buffer_sizes() -> None:
    log = (
        "load_tensors:          CPU model buffer size =     4.46 MiB\n"
        "llama_kv_cache:        CPU KV buffer size =     1.00 MiB\n"
        "sched_reserve:      CUDA0 compute buffer size =   342.01 MiB\n"
        "sched_reserve:  CUDA_Host compute buffer size =     8.51 MiB\n"
        "~llama_context:        CPU compute buffer size is   5.5137 MiB, matches expectation of   5.5137 MiB\n"
    )
    assert parse_buffer_sizes(log) == {"model": 4.46, "KV": 1.0, "compute": pytest.approx(350.52)}


def _bench_log(llama_bins, model: Path, n_ctx: int, ubatch: int, flash_attn: bool, log_path: Path) -> str:
    """Run llama-bench so that its context is exactly ``n_ctx`` (pp512 on top of n_ctx - 512) and return its log."""
    argv = [
        str(llama_bins.bench),
        "-m",
        str(model),
        "-p",
        "512",
        "-n",
        "0",
        "-d",
        str(n_ctx - 512),
        "-r",
        "1",
        "-t",
        "2",
        "-ub",
        str(ubatch),
        "-fa",
        "1" if flash_attn else "0",
        "-lm",
        "none",
        "--repack",
        "0",
        "-v",
    ]
    with log_path.open("w") as log:
        proc = spawn(argv, stdout=subprocess.DEVNULL, stderr=log)
        try:
            code = proc.wait(timeout=120)
        finally:
            stop(proc)
    text = log_path.read_text()
    assert code == 0, text[-2000:]
    return text


@pytest.mark.parametrize("n_ctx,ubatch,flash_attn", [(512, 512, True), (4096, 256, True), (4608, 512, False)])
def test_buffers_match_the_estimate(
    llama_bins, tiny_model: Path, tmp_path: Path, n_ctx: int, ubatch: int, flash_attn: bool
) -> None:
    logged = parse_buffer_sizes(_bench_log(llama_bins, tiny_model, n_ctx, ubatch, flash_attn, tmp_path / "bench.log"))
    est = memory_estimate(model_terms(tensor_table(PRESETS["tiny-moe"])), 0, n_ctx, ubatch, flash_attn, device="cpu")
    mib = 1 << 20
    assert logged["model"] == pytest.approx(est.model_bytes / mib, rel=0.03)
    assert logged["KV"] == pytest.approx(est.kv_bytes / mib, rel=0.03)
    assert logged["compute"] == pytest.approx(est.compute_bytes / mib, rel=0.25)


def _arch_model(name: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from xover.gguf.synth import write_model

    path = tmp_path_factory.mktemp("models") / f"{name}.gguf"
    write_model(ALL_PRESETS[name], path, seed=0)
    return path


# (preset, n_ctx, the caches llama.cpp must create: (cells, layers) each)
_ARCH_CASES = [
    ("tiny-gpt-oss", 1024, [(1024, 2), (768, 2)]),  # full layers 1, 3; SWA layers 0, 2: 128 + 512 -> 768 cells
    ("tiny-gpt-oss", 4096, [(4096, 2), (768, 2)]),
    ("tiny-glm4moe", 1024, [(1024, 4)]),  # the NextN block (layer 4) is filtered out
    ("tiny-glm4moe", 4096, [(4096, 4)]),
    ("tiny-deepseek2", 1024, [(1024, 4)]),  # MLA: K only, 256 + 32 per cell
    ("tiny-deepseek2", 4096, [(4096, 4)]),
]


@pytest.mark.parametrize("name,n_ctx,caches", _ARCH_CASES, ids=[f"{c[0]}-{c[1]}" for c in _ARCH_CASES])
def test_arch_buffers_match_llama_cpp(
    llama_bins,
    tmp_path_factory: pytest.TempPathFactory,
    tmp_path: Path,
    name: str,
    n_ctx: int,
    caches: list[tuple[int, int]],
) -> None:
    log = _bench_log(llama_bins, _arch_model(name, tmp_path_factory), n_ctx, 512, True, tmp_path / "bench.log")
    terms = model_terms(tensor_table(ALL_PRESETS[name]))
    est = memory_estimate(terms, 0, n_ctx, 512, True, device="cpu")
    mib = 1 << 20
    logged = parse_buffer_sizes(log)
    assert [(int(m["cells"]), int(m["layers"])) for m in _CACHE.finditer(log)] == caches
    assert logged["model"] == round(est.model_bytes / mib, 2)
    assert logged["KV"] == pytest.approx(round(est.kv_bytes / mib, 2), abs=0.011)  # two caches, each rounded
    assert [round(float(m["mib"]), 2) for m in _CACHE.finditer(log)] == [
        round(terms.kv_bytes_per_token * n_ctx / mib, 2),
        *([round(terms.kv_swa_bytes_per_cell * terms.swa_cells(n_ctx, 512) / mib, 2)] if terms.n_layer_swa else []),
    ]
    compute = float(_COMPUTE_EXACT.search(log)["mib"])  # type: ignore[index]
    assert est.compute_bytes / mib == pytest.approx(compute, rel=0.10)
