"""VRAM budgets and "fit" configurations in a study spec (issue 20): parsing, one-line errors, and the planner's
level for each fit on a real synthesized model (the planner's arithmetic is checked against llama.cpp's log in
tests/real/test_placement_real.py and studies/h200-*)."""

from __future__ import annotations

from pathlib import Path

import pytest

from xover.domain.study_spec import fit_context, spec_from_dict
from xover.errors import XoverError
from xover.measure.fit import check_line, has_fits, resolve_fits

GIB = 1 << 30


def doc(**study: object) -> dict:
    return {
        "model": {"preset": "tiny-moe"},
        "study": {"lengths": ["1k", "4k"], **study},
        "config": [
            {"name": "fit@1k", "n-cpu-moe": "fit@1k"},
            {"name": "fit", "n-cpu-moe": "fit"},
            {"name": "ncmoe=2", "n-cpu-moe": 2},
        ],
    }


def test_fit_values_and_the_budget_parse() -> None:
    spec = spec_from_dict(doc(**{"vram-budget": "16GiB"}))
    assert spec.vram_budget == 16 * GIB
    assert [c.get("n-cpu-moe") for c in spec.configs] == ["fit@1024", "fit", "2"]
    assert [fit_context(c.get("n-cpu-moe")) for c in spec.configs] == [1024, True, None]
    assert has_fits(spec) and not has_fits(spec_from_dict({**doc(), "config": doc()["config"][2:]}))


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("most", "n-cpu-moe must be a non-negative integer, 'fit' or 'fit@LENGTH' (e.g. 'fit@8k'), got 'most'"),
        ("fit@lots", "got 'fit@lots'"),
    ],
)
def test_bad_fit_values_are_one_line_errors(value: str, message: str) -> None:
    bad = doc()
    bad["config"][0]["n-cpu-moe"] = value
    with pytest.raises(XoverError, match=message.replace("(", r"\(").replace(")", r"\)")):
        spec_from_dict(bad)


def test_a_budget_below_256_mib_is_refused() -> None:
    with pytest.raises(XoverError, match="vram-budget must be an amount of GPU memory of at least 256 MiB"):
        spec_from_dict(doc(**{"vram-budget": "100MiB"}))


def test_the_planner_resolves_each_fit_to_a_level(tmp_path: Path) -> None:
    from xover.domain.presets import PRESETS, make_shape
    from xover.gguf.synth import write_model

    # a model large enough that a small budget forces experts out: tiny-moe's shape with 16 wide experts
    shape = make_shape(PRESETS["tiny-moe"], n_layer=8, n_expert=16, n_ff_exp=2048)
    model = write_model(shape, tmp_path / "m.gguf").path
    from xover.analysis.theory import memory_estimate, model_terms
    from xover.gguf.inspect import model_table

    terms = model_terms(model_table(str(model))[0])
    base = spec_from_dict(doc())
    # the budget that holds n=3 at the study's context (4K prompt + 200 + margin) but not n=2
    from xover.llamacpp.server import context_size

    ctx = context_size(4096, 200)
    budget = memory_estimate(terms, 3, ctx, 512, True).total_bytes + GIB
    spec = spec_from_dict(doc(**{"vram-budget": str(budget)}))
    resolved, records = resolve_fits(spec, terms)
    by_name = {c.name: c.get("n-cpu-moe") for c in resolved.configs}
    assert by_name["fit"] == "3" and by_name["ncmoe=2"] == "2"
    assert int(by_name["fit@1k"]) <= 3  # a shorter context never needs more offload
    (r,) = [r for r in records if r["config"] == "fit"]
    assert r["n_ctx"] == ctx and r["budget_bytes"] == budget and r["headroom_bytes"] == GIB
    assert r["estimate"]["total_bytes"] + r["headroom_bytes"] <= budget
    assert len(records) == 2 and base.vram_budget is None


def test_the_check_line_names_what_llama_cpp_did() -> None:
    entry = {
        "config": "fit@8k",
        "request": "fit@8192",
        "n_ctx": 8704,
        "n_cpu_moe": 9,
        "checks": [
            {"n_cpu_moe": 9, "loaded": True, "served": True, "reason": None},
            {"n_cpu_moe": 8, "loaded": True, "served": False, "reason": "stream broke after 0 tokens"},
        ],
    }
    assert check_line(entry) == (
        "fit@8k (fit@8192) at 8,704 tokens: --n-cpu-moe 9 serves; --n-cpu-moe 8 loads but "
        "fails its first request (stream broke after 0 tokens): llama.cpp confirms the edge"
    )
    entry["checks"][1] = {"n_cpu_moe": 8, "loaded": True, "served": True, "reason": None}
    assert check_line(entry).endswith("the planner is conservative here: one level less also serves")


def test_a_fit_at_a_length_measures_only_what_its_context_holds() -> None:
    import dataclasses

    spec = spec_from_dict(doc(**{"vram-budget": "16GiB"}))
    spec = dataclasses.replace(spec, lengths=(1024, 4096, 8192, 32768), response_tokens=(200,), bench_depths=None)
    placed = dataclasses.replace(spec.configs[0], max_context=8704)  # fit@8k: context_size(8192, 200)
    assert spec.lengths_for(placed) == (1024, 4096, 8192)
    assert spec.bench_depths_for(placed) == (1024, 4096, 8192)  # pp512 @ d8192: a context of 8,704, just held
    assert spec.bench_depths_for(dataclasses.replace(placed, max_context=8703)) == (1024, 4096)
    free = dataclasses.replace(placed, max_context=None)
    assert spec.lengths_for(free) == spec.lengths and spec.bench_depths_for(free) == spec.lengths


@pytest.mark.parametrize(("value", "seconds"), [(120, 120.0), ("90s", 90.0), ("2min", 120.0), (" 1.5 m ", 90.0)])
def test_max_ttft_parses(value: object, seconds: float) -> None:
    assert spec_from_dict(doc(**{"max-ttft": value})).max_ttft_s == seconds


@pytest.mark.parametrize("value", ["soon", "-5", 0])
def test_a_bad_max_ttft_is_a_one_line_error(value: object) -> None:
    with pytest.raises(XoverError, match=r"max-ttft"):
        spec_from_dict(doc(**{"max-ttft": value}))


def test_decode_tokens_sets_what_each_cold_request_generates_and_defaults_to_the_longest_response() -> None:
    assert spec_from_dict(doc(**{"response-tokens": [64, 200]})).generated_tokens == 200
    spec = spec_from_dict(doc(**{"response-tokens": [200], "decode-tokens": 32}))
    assert (spec.decode_tokens, spec.generated_tokens, spec.response_tokens) == (32, 32, (200,))


@pytest.mark.parametrize("value", [0, 201, "32", True])
def test_a_bad_decode_tokens_is_a_one_line_error(value: object) -> None:
    with pytest.raises(XoverError, match=r"decode-tokens") as e:
        spec_from_dict(doc(**{"response-tokens": [200], "decode-tokens": value}))
    assert "\n" not in str(e.value)


def test_the_cache_lab_runs_at_the_longest_length_a_fit_level_holds() -> None:
    import dataclasses

    spec = spec_from_dict(doc(**{"vram-budget": "16GiB"}))
    spec = dataclasses.replace(spec, lengths=(1024, 4096, 8192, 32768))

    def lab(L: int) -> int:
        return L + 40  # the lab's longest request and its response

    placed = dataclasses.replace(spec.configs[0], max_context=8232)
    assert spec.cache_length_for(placed, lab) == 8192
    assert spec.cache_length_for(dataclasses.replace(placed, max_context=8231), lab) == 4096
    assert spec.cache_length_for(dataclasses.replace(placed, max_context=1000), lab) is None
    assert spec.cache_length_for(dataclasses.replace(placed, max_context=None), lab) == 32768
    asked = dataclasses.replace(spec, cache_length=32768)  # an explicit cache-length is not shortened
    assert asked.cache_length_for(placed, lab) is None
    assert asked.cache_length_for(dataclasses.replace(placed, max_context=None), lab) == 32768
