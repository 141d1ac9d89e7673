"""A study under a VRAM budget with "fit" configurations, end to end on the real CPU build (issue 20). The budget's
holder runs on the fake CUDA runtime (tests/fakes/fake_cudart.c): the CPU build ignores it, but everything xover
does with a budget is exercised: the hold, the planner's level per fit, llama.cpp's check at that level and one
below (llama-server loads and answers one request), provenance and the report's budget line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from xover.results.read_model import load, vram_budgets

pytestmark = pytest.mark.real

GIB = 1 << 30


def test_a_budgeted_study_with_fit_configurations(
    tiny_model: Path, llama_bins, fake_cudart: Path, tmp_path: Path
) -> None:
    from xover.analysis.theory import memory_estimate, model_terms
    from xover.gguf.inspect import model_table
    from xover.llamacpp.server import context_size

    terms = model_terms(model_table(str(tiny_model))[0])
    ctx = context_size(1024, 16)
    budget = memory_estimate(terms, 2, ctx, 512, True).total_bytes + GIB  # holds 2 layers' experts out, not 1
    spec = tmp_path / "fit.toml"
    spec.write_text(f"""
[model]
path = "{tiny_model}"
[study]
lengths = ["1k"]
response-tokens = [16]
repetitions = 1
vram-budget = "{budget}"
tune = false
skip = ["bench", "cache", "session"]
[[config]]
name = "fit"
n-cpu-moe = "fit"
[[config]]
name = "ncmoe=0"
n-cpu-moe = 0
""")
    env = {
        **os.environ,
        "XOVER_CUDART": str(fake_cudart),
        "FAKE_CUDA_FREE": str(8 * GIB),
        "FAKE_CUDA_TOTAL": str(16 * GIB),
    }
    out = tmp_path / "st"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "xover",
            "study",
            str(spec),
            "-o",
            str(out),
            "-q",
            "--llama-bin-dir",
            str(llama_bins.bench.parent),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    data = load(out)
    (fits,) = data.artifact_bodies("fit")
    assert [(f["config"], f["n_cpu_moe"], f["n_ctx"], f["budget_bytes"]) for f in fits] == [("fit", 2, ctx, budget)]
    (checks,) = data.artifact_bodies("fit-check")
    assert [(c["n_cpu_moe"], c["loaded"], c["served"]) for c in checks[0]["checks"]] == [
        (2, True, True),
        (1, True, True),
    ]
    (b,) = vram_budgets(data)
    assert b.budget == budget and b.held == 8 * GIB - budget and b.free_after == budget
    report = (out / "report.md").read_text()
    assert f"{budget / GIB:.0f} GiB VRAM budget on GPU 0 (16 GiB): xover held the rest" in report
    assert "| fit | fit | 1,536 | 1.0 GiB | 2 |" in report and report.count("loads and serves") == 2
    # the fit config was measured at the planner's level under its own name
    assert {label for label, _ in data.cold_samples()} == {"fit", "ncmoe=0"}
