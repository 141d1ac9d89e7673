"""Synthetic models load and run in the real llama-bench, and llama.cpp agrees with the shape arithmetic."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from xover.domain.presets import ALL_PRESETS, PRESETS, make_shape
from xover.domain.shapes import ModelShape, footprint, tensor_table
from xover.gguf.synth import write_model
from xover.llamacpp import process
from xover.llamacpp.binaries import Binaries

pytestmark = pytest.mark.real

SHAPES = {
    "tiny-moe": PRESETS["tiny-moe"],
    "dense-small": make_shape(
        "dense-30b", n_layer=2, n_embd=256, n_head=4, n_head_kv=2, head_dim=64, n_ff=512, n_vocab=1024
    ),
    # qwen3-30b-a3b's layer dimensions (2048 / 32x128 / 4 KV heads / experts of 768), cut to one layer
    "qwen-slice": make_shape("qwen3-30b-a3b", n_layer=1, n_expert=4, n_expert_used=2, n_vocab=1024),
    # issue 19: one tiny variant per added architecture (SWA + sinks + MXFP4; shared experts + dense lead +
    # NextN; MLA)
    "tiny-gpt-oss": ALL_PRESETS["tiny-gpt-oss"],
    "tiny-glm4moe": ALL_PRESETS["tiny-glm4moe"],
    "tiny-deepseek2": ALL_PRESETS["tiny-deepseek2"],
}


@pytest.mark.parametrize("name", SHAPES)
def test_llama_bench_loads_and_runs(name: str, llama_bins: Binaries, tmp_path: Path) -> None:
    shape: ModelShape = SHAPES[name]
    model = write_model(shape, tmp_path / f"{name}.gguf").path
    # how long it takes is benchmarks/tiny_model_run.py's target, not an assertion (it flaked on a loaded machine)
    proc = subprocess.run(
        [str(llama_bins.bench), "-m", str(model), "-p", "64", "-n", "16", "-r", "1", "-t", "2", "-o", "jsonl"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [(r["n_prompt"], r["n_gen"]) for r in records] == [(64, 0), (0, 16)]
    assert all(r["avg_ts"] > 0 for r in records)
    fp = footprint(tensor_table(shape))
    assert records[0]["model_size"] == fp.total_bytes
    assert records[0]["model_n_params"] == fp.total_params


NEW_ARCHS = ("tiny-gpt-oss", "tiny-glm4moe", "tiny-deepseek2")


@pytest.mark.parametrize("name", NEW_ARCHS)
def test_inspect_json_matches_llama_bench_exactly(name: str, llama_bins: Binaries, tmp_path: Path) -> None:
    """``xover inspect --json`` (header only) against llama-bench's model_size and model_n_params."""
    model = write_model(SHAPES[name], tmp_path / f"{name}.gguf").path
    inspect = subprocess.run(
        [sys.executable, "-m", "xover", "inspect", "--json", str(model)], capture_output=True, text=True, timeout=120
    )
    assert inspect.returncode == 0, inspect.stderr[-2000:]
    report = json.loads(inspect.stdout)
    proc = subprocess.run(
        [str(llama_bins.bench), "-m", str(model), "-p", "512", "-n", "16", "-r", "1", "-t", "2", "-o", "jsonl"],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert [(r["n_prompt"], r["n_gen"]) for r in records] == [(512, 0), (0, 16)]
    for r in records:
        assert r["model_size"] == report["footprint"]["total_bytes"]
        assert r["model_n_params"] == report["footprint"]["total_params"]
        assert r["avg_ts"] > 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("name", NEW_ARCHS)
def test_llama_server_loads_and_completes(name: str, llama_bins: Binaries, tmp_path: Path) -> None:
    model = write_model(SHAPES[name], tmp_path / f"{name}.gguf").path
    port = _free_port()
    log_path = tmp_path / "server.log"
    with log_path.open("w") as log:
        proc = process.spawn(
            [
                str(llama_bins.server),
                "-m",
                str(model),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "-c",
                "2048",
                "-np",
                "1",
                "-t",
                "2",
                "--cache-ram",
                "0",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            deadline = time.monotonic() + 90
            while True:
                assert proc.poll() is None, log_path.read_text()[-2000:]
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                assert time.monotonic() < deadline, "server never became healthy"
                time.sleep(0.1)
            body = {"prompt": list(range(300, 600)), "n_predict": 8, "ignore_eos": True, "cache_prompt": False}
            req = urllib.request.Request(
                f"http://127.0.0.1:{port}/completion",
                data=json.dumps(body).encode(),
                headers={"Content-Type": "application/json"},
            )
            with urllib.request.urlopen(req, timeout=60) as r:
                answer = json.loads(r.read())
            assert answer["timings"]["prompt_n"] == 300 and answer["timings"]["predicted_n"] == 8
        finally:
            process.stop(proc)
