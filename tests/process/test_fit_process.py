"""The tests of tests/unit/test_fit.py that start a process (a subprocess, xover's CLI or a fake llama.cpp binary):
tests/unit starts none (its conftest.py refuses)."""

from __future__ import annotations

from pathlib import Path

from fakes.known import qwen3_budget_records
from xover.domain.study_spec import spec_from_dict

GIB = 1 << 30


# ---- budget-aware tuning: a trial placed for its own ubatch and KV cache types (issue 32) ------------------------


def test_a_level_a_gpu_build_served_on_the_cpu_is_no_fit(tmp_path: Path) -> None:
    """The fit check's llama-server is checked against its build's backend like every other: a CUDA build (the
    folder's libggml-cuda says so) whose log names no CUDA device served the level on the CPU, so the level is not
    a fit, with the cause. The fake server logs no device."""
    import asyncio

    from fakes.llama_server import write_bin_dir
    from xover.domain.config import LlamaConfig
    from xover.llamacpp.binaries import resolve
    from xover.measure.fit import _check_level

    folder = write_bin_dir(tmp_path / "bin")
    (folder / "libggml-cuda.so").write_text("")
    bins = resolve(folder)
    assert bins.backend == "cuda"
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    check = asyncio.run(_check_level(bins, model, LlamaConfig("c"), 12, 4096, tmp_path, 30.0))
    assert (check.loaded, check.served) == (True, False)
    assert check.reason is not None and check.reason.startswith(
        "llama-server of the cuda build ran on the CPU: no CUDA device found"
    )


def test_a_tuned_variant_is_placed_where_its_own_server_serves(tmp_path: Path) -> None:
    """Known answer, faults injected: the fake llama-server refuses to load below --n-cpu-moe 19 (a card too small
    for more experts) and at 19 loads but fails its first request (as the cuBLAS workspace did on the H200). The
    tuned variant (-ub 4096, planned by llama-bench's arithmetic, its ubatch of logits and the headroom) is placed by
    server processes: a few loads, the edge proven (20 serves, 19 is rejected), every level asked stored with its
    reason; llama-bench is then not run for it, since it needs a higher level. Today's code measured it at 23."""
    from fakes.llama_server import fake_config, write_bin_dir
    from xover.domain.artifacts import FitRecord
    from xover.llamacpp.binaries import resolve
    from xover.measure import fit
    from xover.measure.tune import SUFFIX

    terms, records = qwen3_budget_records(16 * GIB, 33280)
    variant = fake_config("fit" + SUFFIX, 5000, 50, "--fake-refuse-below", "19", "--fake-die-below", "20").with_values(
        {"ubatch-size": "4096", "batch-size": "4096"}
    )
    spec = spec_from_dict(
        {"model": {"preset": "qwen3-30b-a3b"}, "study": {"lengths": [1024]}, "config": [{"name": "fit"}]}
    )
    variants, refits = fit.refit_variants(spec, terms, records, (variant,))
    (bench_level,) = (r["n_cpu_moe"] for r in refits)
    assert bench_level > 20  # llama-bench's placement of -ub 4096 wastes levels the server has room for
    notes: list[str] = []
    folder = write_bin_dir(tmp_path / "bin")
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    (entry,) = fit.place_by_server(spec, variants, model, resolve(folder), refits, terms, tmp_path, notes.append)
    record = FitRecord.from_body(entry)
    assert record.by_server and record.level == 20 and record.bench_level == bench_level
    asked = {c.n_cpu_moe: c for c in record.checks}
    assert asked[20].served and not asked[19].served and asked[19].loaded  # loads, then dies at its first request
    refused = [c for c in record.checks if c.n_cpu_moe < 19]
    assert refused and all(not c.loaded and "unable to allocate CUDA0 buffer" in (c.reason or "") for c in refused)
    assert all(c.served == (c.n_cpu_moe >= 20) for c in record.checks)
    assert record.checks[0].n_cpu_moe == bench_level  # llama-bench's level is asked first
    assert len(record.checks) <= 5, [(c.n_cpu_moe, c.served) for c in record.checks]
    assert record.server_plan is not None and record.server_plan <= bench_level
    assert "placed by llama-server at 20" in notes[0]
    assert fit.apply_checks(variants, [entry])[0].n_cpu_moe == 20
    assert list(fit.not_benched([record])) == [variant.name]
