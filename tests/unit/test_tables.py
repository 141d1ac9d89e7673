"""Markdown tables and exports rendered from constructed records with known answers."""

from __future__ import annotations

import csv
import dataclasses
import io
import json

from xover.domain.config import LlamaConfig
from xover.domain.records import BenchResult, Failure
from xover.report import export, tables
from xover.results.read_model import BenchData, StoredFailure, StoredResult

C12 = LlamaConfig("", (("n-cpu-moe", "12"), ("threads", "8"), ("GGML_OP_OFFLOAD_MIN_BATCH", "64")))
C18 = LlamaConfig("", (("n-cpu-moe", "18"), ("threads", "8"), ("GGML_OP_OFFLOAD_MIN_BATCH", "64")))
RECORD = {
    "build_commit": "0c1e570",
    "build_number": 0,
    "backends": "CUDA",
    "cpu_info": "AMD EPYC",
    "gpu_info": "NVIDIA H200",
    "model_filename": "/m/qwen3-30b-a3b.gguf",
    "model_type": "qwen3moe 30B.A3B Q4_K - Medium",
    "model_size": 18_556_686_336,
    "model_n_params": 30_532_122_624,
    "n_threads": 8,
}


def result(
    config: LlamaConfig, n_prompt: int, n_gen: int, depth: int, avg: float, sd: float, samples: int = 3
) -> BenchResult:
    return BenchResult(
        config_key=config.key,
        n_prompt=n_prompt,
        n_gen=n_gen,
        n_depth=depth,
        samples_ns=tuple(range(1, samples + 1)),
        samples_ts=(avg,) * samples,
        avg_ts=avg,
        stddev_ts=sd,
        record={**RECORD, "n_prompt": n_prompt, "n_gen": n_gen, "n_depth": depth},
    )


RESULTS = [
    result(C12, 512, 0, 4000, 2100.004, 12.345),
    result(C12, 0, 128, 4000, 72.125, 0.5),
    result(C12, 512, 0, 1000, 4300.0, 1.0),
    result(C12, 0, 128, 1000, 80.0, 0.25),
    result(C18, 512, 0, 1000, 780.5, 3.0),
]


def test_cells_use_llama_bench_precision() -> None:
    # "%.2f ± %.2f", rounding the binary double as C's printf does (72.125 is exact: half to even)
    assert tables.cell(RESULTS[0]) == "2100.00 ± 12.35"
    assert tables.cell(RESULTS[1]) == "72.12 ± 0.50"


def test_labels_name_what_differs_and_common_flags_what_does_not() -> None:
    assert tables.short_labels([C12, C18]) == ["ncmoe=12", "ncmoe=18"]
    # settings in table order: GGML_OP_OFFLOAD_MIN_BATCH comes before threads
    assert tables.common_flags([C12, C18]) == "GGML_OP_OFFLOAD_MIN_BATCH=64 -t 8"
    assert tables.short_labels([C12]) == ["ncmoe=12 GGML_OP_OFFLOAD_MIN_BATCH=64 t=8"]
    bare = LlamaConfig("", (("n-cpu-moe", "12"),))
    extra = LlamaConfig("", (("n-cpu-moe", "12"),), bench_args=("-nkvo", "1"))
    assert tables.short_labels([bare, extra]) == ["(no extra args)", "-- -nkvo 1"]
    assert tables.short_labels([bare, C18]) == [
        "ncmoe=12 GGML_OP_OFFLOAD_MIN_BATCH=default t=default",
        "ncmoe=18 GGML_OP_OFFLOAD_MIN_BATCH=64 t=8",
    ]
    assert tables.short_labels([LlamaConfig("", ())]) == ["default"]


HEADER = (
    "- model: qwen3-30b-a3b.gguf (qwen3moe 30B.A3B Q4_K - Medium, 17.28 GiB, 30.53 B params)\n"
    "- build: llama.cpp 0c1e570 (0), backend CUDA\n"
    "- machine: AMD EPYC, NVIDIA H200\n"
    "- common flags: GGML_OP_OFFLOAD_MIN_BATCH=64 -t 8; t/s as mean ± sample sd over 3 repetitions\n"
    "\n"
    "| test          |        ncmoe=12 |      ncmoe=18 |\n"
    "| ------------- | --------------: | ------------: |\n"
    "| pp512 @ d1000 |  4300.00 ± 1.00 | 780.50 ± 3.00 |\n"
)


def test_table_reads_across_configurations_in_llama_bench_row_order() -> None:
    text = tables.render_bench_table([C12, C18], RESULTS)
    assert text == HEADER + (
        "| tg128 @ d1000 |    80.00 ± 0.25 |             - |\n"
        "| pp512 @ d4000 | 2100.00 ± 12.35 |             - |\n"
        "| tg128 @ d4000 |    72.12 ± 0.50 |             - |\n"
    )


def test_failed_configuration_is_marked_and_explained() -> None:
    oom = Failure(
        C18.key,
        "bench",
        "ncmoe=18: pp512,tg128 @ d1000,4000 x3",
        "llama-bench exited with code 1 after 1 of 4 tests: out of memory",
    )
    text = tables.render_bench_table([C12, C18], RESULTS, [oom])
    assert "| tg128 @ d4000 |    72.12 ± 0.50 |        failed |\n" in text
    assert text.endswith("\n- ncmoe=18 failed: llama-bench exited with code 1 after 1 of 4 tests: out of memory\n")
    # a configuration whose failure left no missing row (it stopped before its last depth) is still explained
    assert tables.render_bench_table([C18], [RESULTS[4]], [oom]).endswith(
        f"- {tables.short_labels([C18])[0]} failed: {oom.reason}\n"
    )


def test_latest_measurement_of_a_point_wins() -> None:
    again = result(C12, 512, 0, 1000, 4400.0, 2.0)
    text = tables.render_bench_table([C12], [*RESULTS, again])
    assert "4400.00 ± 2.00 |" in text and "4300.00" not in text


def test_mixed_builds_are_flagged() -> None:
    other = BenchResult(**{**RESULTS[4].__dict__, "record": {**RESULTS[4].record, "build_commit": "abcdef0"}})
    text = tables.render_bench_table([C12, C18], [*RESULTS[:4], other])
    assert (
        "llama.cpp 0c1e570 (0), backend CUDA; llama.cpp abcdef0 (0), backend CUDA (results from different builds"
        in text
    )


def test_no_results_says_so() -> None:
    assert "(no results)" in tables.render_bench_table([C12], [])


# ---- exports --------------------------------------------------------------------------------------


DATA = BenchData(
    configs=(C12, C18),
    results=tuple(StoredResult(1, "qwen3:1:abc", r) for r in RESULTS),
    failures=(StoredFailure(1, "qwen3:1:abc", Failure(C18.key, "bench", "p", "timed out", "tail")),),
    model_names={"qwen3:1:abc": "qwen3-30b-a3b.gguf"},
)


def test_markdown_export_is_the_table_per_model() -> None:
    assert export.render(DATA, "md") == tables.render_bench_table(
        [C12, C18], RESULTS, [DATA.failures[0].failure], "qwen3-30b-a3b.gguf"
    )


def test_failures_repaired_by_a_later_run_are_not_shown() -> None:
    later = tuple(StoredResult(2, "qwen3:1:abc", r) for r in (result(C18, 0, 128, 1000, 90, 1),))
    repaired = dataclasses.replace(DATA, results=DATA.results + later)
    assert export.standing_failures(DATA) == list(DATA.failures)
    assert export.standing_failures(repaired) == []
    assert "failed" not in export.render(repaired, "md")
    assert "- ncmoe=18 failed: timed out" in export.render(DATA, "md")


def test_csv_export_has_one_row_per_test_with_raw_samples() -> None:
    rows = list(csv.DictReader(io.StringIO(export.render(DATA, "csv"))))
    assert len(rows) == 5
    first = rows[0]
    assert (first["config"], first["test"], first["n_depth"], first["repetitions"]) == (
        "ncmoe=12",
        "pp512 @ d4000",
        "4000",
        "3",
    )
    assert float(first["avg_ts"]) == 2100.004 and first["samples_ns"] == "1 2 3" and first["n_threads"] == "8"
    assert first["build_commit"] == "0c1e570" and first["model"] == "qwen3-30b-a3b.gguf"


def test_jsonl_export_keeps_everything_and_failures() -> None:
    lines = [json.loads(x) for x in export.render(DATA, "jsonl").splitlines()]
    assert [x["type"] for x in lines] == ["bench_result"] * 5 + ["failure"]
    r = lines[0]
    assert r["config"]["label"] == "ncmoe=12" and r["config"]["key"] == C12.key
    assert r["config"]["settings"] == {"n-cpu-moe": "12", "GGML_OP_OFFLOAD_MIN_BATCH": "64", "threads": "8"}
    assert r["config"]["llama_bench_args"] == ["-ncmoe", "12", "-t", "8"]
    assert r["config"]["env"] == [["GGML_OP_OFFLOAD_MIN_BATCH", "64"]]
    assert r["samples_ns"] == [1, 2, 3] and r["record"]["backends"] == "CUDA"
    assert lines[-1]["reason"] == "timed out" and lines[-1]["stderr_tail"] == "tail"
