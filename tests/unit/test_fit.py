"""VRAM budgets and "fit" configurations in a study spec (issue 20): parsing, one-line errors, and the planner's
level for each fit on a real synthesized model (the planner's arithmetic is checked against llama.cpp's log in
tests/real/test_placement_real.py and studies/h200-*)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fakes.known import qwen3_budget_records
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


# ---- budget-aware tuning: a trial placed for its own ubatch and KV cache types (issue 32) ------------------------


def test_the_kv_cache_types_change_the_kv_buffer_as_llama_cpp_sizes_it() -> None:
    from xover.analysis.theory import model_terms
    from xover.domain.presets import preset as get_preset
    from xover.domain.shapes import tensor_table

    terms = model_terms(tensor_table(get_preset("qwen3-30b-a3b")))
    assert terms.with_cache_types("F16") == terms
    # q8_0: 34 bytes per 32 elements against f16's 64; K and V each half of the cache (head_dim_k == head_dim_v)
    q8 = terms.with_cache_types("Q8_0", "Q8_0")
    assert q8.kv_bytes_per_token * 64 == terms.kv_bytes_per_token * 34
    mixed = terms.with_cache_types("q8_0", "f16")
    assert mixed.kv_bytes_per_token * 2 == q8.kv_bytes_per_token + terms.kv_bytes_per_token


def test_budget_aware_placement_moves_the_level_with_the_ubatch_and_the_kv_cache_types() -> None:
    """The 16 GiB study's gap: fit@32k's level planned at -ub 512 has no room for -ub 4096's compute buffer. Placed
    for its own settings, a -ub 4096 trial goes to a higher level, a q8_0 cache to a lower one, and both together
    between; a setting no level can hold is refused in one line, and the search records it as failed."""
    from xover.domain.config import LlamaConfig
    from xover.measure.fit import placer

    ctx = 32768 + 1024
    terms, records = qwen3_budget_records(16 * GIB, ctx)
    (record,) = records
    first = int(record["n_cpu_moe"])
    place = placer(terms, records)
    assert place is not None
    base = LlamaConfig("fit", (("n-cpu-moe", str(first)),))

    def level(**values: str) -> int:
        return place(base.with_values(values), "fit").n_cpu_moe

    assert level() == first
    big_ub = level(**{"ubatch-size": "4096", "batch-size": "4096"})
    q8 = level(**{"cache-type-k": "q8_0", "cache-type-v": "q8_0"})
    both = level(**{"ubatch-size": "4096", "batch-size": "4096", "cache-type-k": "q8_0", "cache-type-v": "q8_0"})
    assert big_ub > first and q8 < first and q8 <= both <= big_ub, (first, big_ub, q8, both)
    # another configuration's trial is left alone
    assert place(base, "other") is base
    # a budget that holds every expert on the CPU at -ub 512 but not -ub 8192's compute buffer
    from xover.analysis.theory import memory_estimate

    tight = memory_estimate(terms, terms.n_layer, ctx, 512, True).total_bytes + GIB + (64 << 20)
    terms, records = qwen3_budget_records(tight, ctx)
    place = placer(terms, records)
    assert place is not None and place(base, "fit").n_cpu_moe == terms.n_layer
    with pytest.raises(XoverError, match=r"could not place under the budget: .* GiB at [0-9,]+ tokens of context"):
        place(base.with_values({"ubatch-size": "8192", "batch-size": "8192"}), "fit")


def test_a_trial_the_budget_cannot_place_is_a_failed_measurement_and_runs_nothing(tmp_path: Path) -> None:
    from xover.analysis import advise
    from xover.domain.config import LlamaConfig
    from xover.measure.advise import AdviseSpec, _Runner

    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + bytes(64))
    knobs = advise.default_knobs(2)
    runner = _Runner(AdviseSpec(model=model, knobs=knobs), None, tmp_path, (), lambda e: None)  # type: ignore[arg-type]

    def refuse(config: LlamaConfig, base: str) -> LlamaConfig:
        raise XoverError("could not place under the budget: 15.2 GiB of GPU buffers ...")

    sweep = runner.sweep((0,), 512, 16, 2)
    m = runner.measure_config_fn(LlamaConfig("fit", ()), sweep, advise.agentic_workload(200), refuse)(
        (("ubatch-size", "8192"),)
    )
    assert not m.ok and m.failure is not None and m.failure.startswith("could not place under the budget")


def test_the_compute_buffer_is_calibrated_from_the_load_llama_cpp_logged() -> None:
    """The planner's compute estimate is off both ways against llama-server (it counts a ubatch of logits that
    llama-server, reserving one output per slot, never allocates, and undercounts the MoE intermediates). Where the
    fit check logged a load, the per-token part is taken from that log: it reproduces the logged buffer and scales
    with the ubatch, the KQ mask recomputed for the context."""
    from xover.analysis.theory import compute_per_token, memory_estimate, model_terms
    from xover.domain.presets import preset as get_preset
    from xover.domain.shapes import tensor_table

    terms = model_terms(tensor_table(get_preset("qwen3-30b-a3b")))
    mib = 1 << 20
    # studies/h200-vram-budget: llama-server -ub 512 -c 8704 logged CUDA0 compute buffer size = 226.01 MiB
    logged = round(226.01 * mib)
    formula = memory_estimate(terms, 10, 8704, 512, True).compute_bytes
    assert formula > 300 * mib  # the planner's own estimate: 309 MiB, above the log
    per = compute_per_token(terms, logged, 512, 8704)
    again = memory_estimate(terms, 10, 8704, 512, True, compute_per_token=per, n_outputs=1).compute_bytes
    assert abs(again - logged) <= 1  # the server that logged it: one output row
    # -ub 4096 at 33,792 cells: 8x the activations, the mask of a 4096 x 33,792 tile (f16)
    mask_512, mask_4096 = 512 * 8704 * 2, 4096 * 33792 * 2
    big = memory_estimate(terms, 10, 33792, 4096, True, compute_per_token=per, n_outputs=1).compute_bytes
    assert abs(big - ((logged - mask_512) * 8 + mask_4096)) <= 8
    # llama-bench reserves a ubatch of logits, which the server's log never showed: at -ub 4096 they are the larger
    # peak (4096 x 151,936 x 4 bytes = 2,374 MiB), and the calibrated estimate keeps them. Known answers from the
    # H200 logs: llama-bench -ub 4096 -c 4224 asked for 2,732 MiB (studies/h200-16gib-qwen3-30b-a3b); llama-server
    # -ub 4096 -c 8704 logged 962 MiB (studies/h200-16gib-cached). The llama-bench estimate is within 400 MiB of
    # it (about 290 MiB under: the 1 GiB headroom absorbs it), the server's above it, by less than the headroom.
    logits = 4096 * terms.n_vocab * 4
    bench = memory_estimate(terms, 10, 4224, 4096, True, compute_per_token=per).compute_bytes
    assert bench >= logits and abs(bench - 2732 * mib) < 400 * mib
    served = memory_estimate(terms, 16, 8704, 4096, True, compute_per_token=per, n_outputs=1).compute_bytes
    assert 962 * mib <= served < 962 * mib + (1 << 30)


def test_a_trial_is_placed_with_the_compute_buffer_its_base_configuration_logged() -> None:
    from xover.domain.config import LlamaConfig
    from xover.measure.fit import calibration, placer

    ctx = 32768 + 1024
    terms, records = qwen3_budget_records(16 * GIB, ctx)
    (record,) = records
    n = int(record["n_cpu_moe"])
    base = LlamaConfig("fit", (("n-cpu-moe", str(n)),))
    trial = base.with_values({"ubatch-size": "4096", "batch-size": "4096"})
    planned = placer(terms, records)(trial, "fit").n_cpu_moe  # type: ignore[misc]
    assert calibration(terms, record) is None  # before the check: the planner's estimate
    # the check logged a compute buffer twice the planner's at -ub 512: a -ub 4096 trial needs more levels
    own = record["estimate"]["compute_bytes"]
    checked = {**record, "checks": [{"n_cpu_moe": n, "loaded": True, "served": True, "reason": None,
                                     "compute_bytes": 2 * own}], "measured_at": n}  # fmt: skip
    assert calibration(terms, checked) is not None
    heavier = placer(terms, [checked])(trial, "fit").n_cpu_moe  # type: ignore[misc]
    assert heavier > planned
    # a check that logged nothing (a CPU-only build) leaves the planner's estimate
    silent = {**checked, "checks": [{**checked["checks"][0], "compute_bytes": None}]}
    assert placer(terms, [silent])(trial, "fit").n_cpu_moe == planned  # type: ignore[misc]


def test_the_logged_compute_buffer_is_the_accelerators_not_the_hosts(tmp_path: Path) -> None:
    from xover.measure.fit import logged_compute_bytes

    log = tmp_path / "server.log"
    log.write_text(
        "load_tensors:   CPU_Mapped model buffer size =   166.92 MiB\n"
        "sched_reserve:      CUDA0 compute buffer size =   226.01 MiB\n"
        "sched_reserve:  CUDA_Host compute buffer size =    20.02 MiB\n"
    )
    assert logged_compute_bytes(log) == round(226.01 * (1 << 20))
    assert logged_compute_bytes(tmp_path / "missing.log") is None and logged_compute_bytes(None) is None


def _edge(edge: int) -> tuple[list[int], object]:
    """A card where every level from ``edge`` up serves, and the levels asked, in order."""
    asked: list[int] = []

    def serves(level: int) -> bool:
        asked.append(level)
        return level >= edge

    return asked, serves


@pytest.mark.parametrize("edge", range(0, 25))
def test_the_server_placement_finds_the_lowest_level_that_serves_and_proves_the_edge(edge: int) -> None:
    from xover.analysis.theory import lowest_serving

    asked, serves = _edge(edge)
    level, order = lowest_serving(serves, low=10, high=23, top=48)
    assert level == edge
    assert list(order) == asked and len(set(asked)) == len(asked)  # no level loaded twice
    assert edge in asked and (edge == 0 or edge - 1 in asked)  # it served, and the one below was refused
    assert len(asked) <= 8  # a bisection, not a walk over 24 levels


def test_a_good_planner_range_costs_a_few_loads() -> None:
    from xover.analysis.theory import lowest_serving

    # llama-bench's level 23, the server's plan 19, the server serves from 20 (the H200 16 GiB case, by shape)
    asked, serves = _edge(20)
    assert lowest_serving(serves, low=19, high=23, top=48) == (20, (23, 19, 21, 20))
    # the planner's least level serves: the edge is found just below it
    asked, serves = _edge(18)
    assert lowest_serving(serves, low=19, high=23, top=48) == (18, (23, 19, 18, 16, 17))


def test_where_llama_bench_s_level_is_refused_the_levels_above_are_tried() -> None:
    from xover.analysis.theory import lowest_serving

    asked, serves = _edge(26)
    assert lowest_serving(serves, low=19, high=23, top=48) == (26, (23, 24, 25, 26))
    asked, serves = _edge(40)
    assert lowest_serving(serves, low=19, high=23, top=48, above=4) == (None, (23, 24, 25, 26, 27))
    asked, serves = _edge(48)
    assert lowest_serving(serves, low=40, high=47, top=48) == (48, (47, 48))


def test_the_fit_section_shows_the_planner_s_llama_bench_s_and_the_server_s_level(tmp_path: Path) -> None:
    """Rebuilt from the store: a tuned variant placed by its server gets its own table with the three levels and
    every level asked; the base configuration's row keeps the planner's table as before."""
    from xover.report.blocks import blocks_markdown
    from xover.report.fit import fit_blocks
    from xover.results.read_model import load
    from xover.results.store import Store

    estimate = {"total_bytes": 14 * GIB, "model_bytes": 12 * GIB, "kv_bytes": GIB, "compute_bytes": GIB}
    base = {"config": "fit", "request": "fit", "n_ctx": 33280, "n_cpu_moe": 21, "budget_bytes": 16 * GIB,
            "headroom_bytes": GIB, "ubatch": 512, "estimate": estimate,
            "checks": [{"n_cpu_moe": 21, "loaded": True, "served": True, "reason": None},
                       {"n_cpu_moe": 20, "loaded": True, "served": False, "reason": "out of memory"}],
            "measured_at": 21}  # fmt: skip
    asked = [(23, True), (19, False), (21, True), (20, False)]
    tuned = {**base, "config": "fit tuned", "n_cpu_moe": 23, "ubatch": 4096, "measured_at": 21,
             "placed_by": "server", "bench_level": 23, "server_plan": 19,
             "checks": [{"n_cpu_moe": n, "loaded": ok, "served": ok, "reason": None if ok else "cudaMalloc failed"}
                        for n, ok in asked]}  # fmt: skip
    with Store(tmp_path) as store:
        store.add_artifact(None, "fit-check", [base])
        store.add_artifact(None, "fit-check-tuned", [tuned])
    text = blocks_markdown(fit_blocks(load(tmp_path)))
    assert "Tuned variants: placed by their own llama-server" in text
    (row,) = [line for line in text.splitlines() if line.startswith("| fit tuned ")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells == ["fit tuned", "33,280", "16.0 GiB", "4096", "19", "23",
                     "23: serves; 19: does not load; 21: serves; 20: does not load", "21"]  # fmt: skip
    firsts = [line.strip("|").split("|")[0].strip() for line in text.splitlines() if line.startswith("|")]
    assert firsts.count("fit") == 1 and firsts.count("fit tuned") == 1  # the base row stays in the planner's table
