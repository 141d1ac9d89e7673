"""A study under a VRAM budget with "fit" configurations, end to end on the real CPU build (issue 20). The budget's
holder runs on the fake CUDA runtime (tests/fakes/fake_cudart.c): the CPU build ignores it, but everything xover
does with a budget is exercised: the hold, the planner's level per fit, llama.cpp's check at that level and one
below (llama-server loads and answers one request), provenance and the report's budget line."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from xover.results.read_model import load, vram_budgets

pytestmark = pytest.mark.real

GIB = 1 << 30


def _budgeted_study(
    spec: Path, out: Path, llama_bins, fake_cudart: Path, timeout_s: float
) -> subprocess.CompletedProcess[str]:
    """``xover study SPEC -o OUT`` on the real CPU build, its budget held on a fake 16 GiB card with 8 GiB free."""
    env = {
        **os.environ,
        "XOVER_CUDART": str(fake_cudart),
        "FAKE_CUDA_FREE": str(8 * GIB),
        "FAKE_CUDA_TOTAL": str(16 * GIB),
    }
    argv = [sys.executable, "-m", "xover", "study", str(spec), "-o", str(out), "-q"]
    argv += ["--llama-bin-dir", str(llama_bins.bench.parent)]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout_s)


def test_a_budgeted_study_with_fit_configurations(
    tiny_model: Path, llama_bins, fake_cudart: Path, tmp_path: Path
) -> None:
    from xover.analysis.theory import memory_estimate, model_terms, plan_placement
    from xover.gguf.inspect import model_table
    from xover.llamacpp.server import context_size

    terms = model_terms(model_table(str(tiny_model))[0])
    ctx = context_size(2048, 16)
    budget = memory_estimate(terms, 2, ctx, 512, True).total_bytes + GIB  # holds 2 layers' experts out, not 1
    spec = tmp_path / "fit.toml"
    spec.write_text(f"""
[model]
path = "{tiny_model}"
[study]
lengths = ["1k", "2k"]
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
[[config]]
name = "short"
n-cpu-moe = "fit@1k"
""")
    out = tmp_path / "st"
    # rounds 3 to 8 (the defaults): fit and ncmoe=0 run alike on a CPU build, so how many rounds their open question
    # earns is the noise's to decide; the timeout is a hang guard for the most (a busy core slows llama.cpp 10x)
    r = _budgeted_study(spec, out, llama_bins, fake_cudart, timeout_s=900)
    assert r.returncode == 0, r.stderr[-3000:]
    data = load(out)
    (fits,) = data.artifact_bodies("fit")
    short_ctx = context_size(1024, 16)
    (short,) = plan_placement(terms, budget, (short_ctx,), 512, flash_attn=True)
    assert short.n_cpu_moe is not None and short.n_cpu_moe < 2  # a shorter context: less to move
    assert [(f["config"], f["n_cpu_moe"], f["n_ctx"], f["budget_bytes"]) for f in fits] == [
        ("fit", 2, ctx, budget),
        ("short", short.n_cpu_moe, short_ctx, budget),
    ]
    (checks,) = data.artifact_bodies("fit-check")
    assert [(c["n_cpu_moe"], c["loaded"], c["served"]) for c in checks[0]["checks"]] == [
        (2, True, True),
        (1, True, True),
    ]
    assert all(c["measured_at"] == c["n_cpu_moe"] for c in checks)
    # each check's load log names the buffers (-lv 4), where a CUDA build's compute buffer calibrates the planner
    fit_logs = sorted((out / "logs").glob("server-fitcheck-*.log"))
    assert fit_logs and all("compute buffer size" in p.read_text() for p in fit_logs)
    # llama.cpp's own --fit answered (a CPU build: no device to fit, so nothing moves)
    assert checks[0]["llama_fit"]["n_ctx"] == ctx and checks[0]["llama_fit"]["cpu_expert_layers"] == []
    (b,) = vram_budgets(data)
    assert b.budget == budget and b.held == 8 * GIB - budget and b.free_after == budget
    report = (out / "report.md").read_text()
    assert f"{budget / GIB:.0f} GiB VRAM budget on GPU 0 (16 GiB): xover held the rest" in report
    assert "| fit | fit | 2,560 | 1.0 GiB | 512 | 2 |" in report and report.count("loads and serves") >= 3
    # the fit configs were measured at the planner's level under their own names; "short", placed for a 1K context
    # at the level ncmoe=0 already is, asks llama.cpp the same: it is measured once, as ncmoe=0, and said so
    lengths = {(label, s.length) for label, s in data.cold_samples()}
    assert short.n_cpu_moe == 0
    assert lengths == {("fit", 1024), ("fit", 2048), ("ncmoe=0", 1024), ("ncmoe=0", 2048)}
    assert "- short asks llama.cpp the same as ncmoe=0: measured once, as ncmoe=0." in report


def test_under_a_budget_tuning_places_each_trial_for_its_own_ubatch(
    tiny_model: Path, llama_bins, fake_cudart: Path, tmp_path: Path
) -> None:
    """A fit configuration's tuning trials under a budget: a larger ubatch needs a larger compute buffer, so the
    trial with -ub 2048 runs at the level that holds it (here every layer's experts on the CPU) while the
    defaults run at the planner's level for -ub 512. Real llama-bench on the CPU build; the fake CUDA runtime
    holds the budget."""
    from xover.analysis.theory import memory_estimate, model_terms, plan_placement
    from xover.gguf.inspect import model_table
    from xover.llamacpp.server import context_size
    from xover.results.read_model import load as load_store

    terms = model_terms(model_table(str(tiny_model))[0])
    ctx = context_size(1024, 16)
    budget = memory_estimate(terms, terms.n_layer, ctx, 2048, True).total_bytes + GIB
    (small,) = plan_placement(terms, budget, (ctx,), 512, flash_attn=True)
    (large,) = plan_placement(terms, budget, (ctx,), 2048, flash_attn=True)
    assert small.n_cpu_moe is not None and large.n_cpu_moe is not None and large.n_cpu_moe > small.n_cpu_moe
    spec = tmp_path / "tune.toml"
    spec.write_text(f"""
[model]
path = "{tiny_model}"
[study]
lengths = ["1k"]
response-tokens = [16]
repetitions = 1
vram-budget = "{budget}"
skip = ["bench", "cache", "session"]
tune-knobs = ["ubatch-size"]
tune-values = {{ ubatch-size = ["2048"] }}
tune-depths = []
[[config]]
name = "fit"
n-cpu-moe = "fit"
""")
    out = tmp_path / "st"
    r = _budgeted_study(spec, out, llama_bins, fake_cudart, timeout_s=900)
    assert r.returncode == 0, r.stderr[-3000:]
    trials = {c.get("ubatch-size") or "512": c.get("n-cpu-moe") for c in load_store(out / "tune").configs}
    assert trials["512"] == str(small.n_cpu_moe) and trials["2048"] == str(large.n_cpu_moe)
    (body,) = [b for b in load(out).artifact_bodies("tune")]
    assert body["placed_trials"] is True


def test_a_tuned_variant_is_placed_by_real_llama_server_loads(tiny_model: Path, llama_bins, tmp_path: Path) -> None:
    """The server placement of a tuned fit variant on the real llama-server: each level asked is a real load at
    the variant's settings (-ub 2048) and the full context, proven by a served request that fills the ubatch. On the
    CPU build every level serves (there is no GPU memory to run out of), so the bisection goes down to level 0 from
    llama-bench's level, in fewer loads than a walk over the layers."""
    from xover.analysis.theory import memory_estimate, model_terms
    from xover.domain.artifacts import FitRecord
    from xover.domain.config import LlamaConfig
    from xover.domain.study_spec import spec_from_dict
    from xover.gguf.inspect import model_table
    from xover.llamacpp.server import context_size
    from xover.measure import fit

    terms = model_terms(model_table(str(tiny_model))[0])
    ctx = context_size(1024, 16)
    budget = memory_estimate(terms, terms.n_layer, ctx, 2048, True).total_bytes + GIB
    spec = spec_from_dict(
        {
            "model": {"path": str(tiny_model)},
            "study": {"lengths": ["1k"], "response-tokens": [16], "vram-budget": str(budget)},
            "config": [{"name": "fit", "n-cpu-moe": "fit"}],
        }
    )
    spec, records = fit.resolve_fits(spec, terms)
    variant = LlamaConfig("fit tuned").with_values({"ubatch-size": "2048", "batch-size": "2048"})
    variants, refits = fit.refit_variants(spec, terms, records, (variant,))
    bench_level = refits[0]["n_cpu_moe"]
    assert bench_level >= 2
    notes: list[str] = []
    (entry,) = fit.place_by_server(spec, variants, tiny_model, llama_bins, refits, terms, tmp_path, notes.append)
    record = FitRecord.from_body(entry)
    assert record.by_server and record.bench_level == bench_level and record.level == 0
    assert record.checks[0].n_cpu_moe == bench_level and all(c.served for c in record.checks)
    assert record.checks[-1].n_cpu_moe == 0
    assert len(record.checks) < bench_level + 1 or bench_level <= 2
    logs = sorted(tmp_path.glob("server-fitcheck-*.log"))  # each a real llama-server that loaded the model
    assert len(logs) == len(record.checks), logs
    for log in logs:  # at the variant's ubatch (llama.cpp caps it at the context)
        (ubatch,) = re.findall(r"llama_context: n_ubatch\s+= (\d+)", log.read_text(errors="replace"))
        assert int(ubatch) == min(2048, ctx)
    assert "placed by llama-server at 0" in notes[0]
