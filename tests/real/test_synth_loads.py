"""Synthetic models load and run in the real llama-bench, and llama.cpp agrees with the shape arithmetic."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from xover.gguf.presets import PRESETS, make_shape
from xover.gguf.shapes import ModelShape, footprint, tensor_table
from xover.gguf.synth import write_model
from xover.llamacpp.binaries import Binaries

pytestmark = pytest.mark.real

SHAPES = {
    "tiny-moe": PRESETS["tiny-moe"],
    "dense-small": make_shape("dense-30b", n_layer=2, n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_ff=512,
                              n_vocab=1024),
    # qwen3-30b-a3b's layer dimensions (2048 / 32x128 / 4 KV heads / experts of 768), cut to one layer
    "qwen-slice": make_shape("qwen3-30b-a3b", n_layer=1, n_expert=4, n_expert_used=2, n_vocab=1024),
}


@pytest.mark.parametrize("name", SHAPES)
def test_llama_bench_loads_and_runs(name: str, llama_bins: Binaries, tmp_path: Path) -> None:
    shape: ModelShape = SHAPES[name]
    model = write_model(shape, tmp_path / f"{name}.gguf").path
    start = time.perf_counter()
    proc = subprocess.run(
        [str(llama_bins.bench), "-m", str(model), "-p", "64", "-n", "16", "-r", "1", "-t", "2", "-o", "jsonl"],
        capture_output=True, text=True, timeout=120,
    )
    seconds = time.perf_counter() - start
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [(r["n_prompt"], r["n_gen"]) for r in records] == [(64, 0), (0, 16)]
    assert all(r["avg_ts"] > 0 for r in records)
    fp = footprint(tensor_table(shape))
    assert records[0]["model_size"] == fp.total_bytes
    assert records[0]["model_n_params"] == fp.total_params
    if name == "tiny-moe":
        assert seconds < 1.5, f"tiny-moe load + pp64 + tg16 took {seconds:.2f} s"
