"""Engines as entries (issue 33): ik_llama.cpp beside mainline llama.cpp. Known answers from ik_llama.cpp's own
outputs, recorded from its CPU build of the ik-llama-cpp-python 0.1.5 sdist on the tiny-moe model
(tests/fixtures/ik_llama_cpp): its llama-bench's JSON array, its llama-server's final stream event; the argv each
engine's tools get; the build entry."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from xover.domain import llama_options as opts
from xover.domain.config import LlamaConfig
from xover.domain.sse import timings_from_json
from xover.llamacpp import bench, build
from xover.llamacpp.server import ServerLaunch

FIXTURES = Path(__file__).parent.parent / "fixtures" / "ik_llama_cpp"
IK = LlamaConfig("ik", (("n-cpu-moe", "2"), ("flash-attn", "off")), engine=opts.IK_LLAMA)


def test_ik_llama_bench_json_is_read_test_by_test_in_mainline_terms() -> None:
    """`llama-bench -p 64 -n 16 -gp 256,16 -r 2 --n-cpu-moe 2 -fa 0 -fmoe 1 -o json`: pp64, tg16 and tg16@pp256, the
    last decode at depth 256 (its depth prefill untimed, as mainline's -d)."""
    reader = bench.IkJsonRecords()
    records = [r for line in (FIXTURES / "llama-bench-o-json.txt").read_text().splitlines() if (r := reader.feed(line))]
    assert [(r["test"], r["n_prompt"], r["n_gen"], r["n_depth"]) for r in records] == [
        ("pp64", 64, 0, 0),
        ("tg16", 0, 16, 0),
        ("tg16@pp256", 0, 16, 256),
    ]
    assert {r["backends"] for r in records} == {"CPU"} and all(r["build_commit"] == "ik0.1.5" for r in records)
    gp = bench.result_from_record("k", records[2])
    assert gp.n_depth == 256 and gp.test_name == "tg16 @ d256"
    # tokens/s recomputed from the integer samples as llama-bench does, over the 16 decoded tokens only
    assert gp.samples_ts == pytest.approx([16e9 / ns for ns in records[2]["samples_ns"]])
    assert gp.samples_ts == pytest.approx(records[2]["samples_ts"], rel=1e-5)
    # the record check reads ik's fields: -fa 0 is its flash_attn false, and it reports no n_cpu_moe
    assert bench.record_mismatch(IK, records[0]) is None
    assert bench.record_mismatch(LlamaConfig("x", (("fused-moe", "0"),), engine=opts.IK_LLAMA), records[0]) == (
        "llama-bench reported fused_moe=True for a configuration with -fmoe 0"
    )


def test_each_engine_gets_its_own_llama_bench_argv() -> None:
    model, binary = Path("m.gguf"), Path("llama-bench")
    job = bench.BenchJob(IK, 256, 16, (0, 1024, 4096), 3)
    assert job.to_argv(binary, model) == [
        "llama-bench", "-m", "m.gguf", "-p", "256", "-n", "16", "-gp", "1024,16", "-gp", "4096,16", "-r", "3",
        "--n-cpu-moe", "2", "-fa", "0", "-o", "json", "-oe", "md",
    ]  # fmt: skip
    assert job.points() == [(256, 0, 0), (0, 16, 0), (0, 16, 1024), (0, 16, 4096)]
    main = bench.BenchJob(LlamaConfig("m", (("n-cpu-moe", "2"), ("flash-attn", "off"))), 256, 16, (0, 1024), 3)
    argv = main.to_argv(binary, model)
    assert argv[argv.index("-d") + 1] == "0,1024" and ["-ncmoe", "2", "-fa", "off"] == argv[11:15]
    assert argv[-5:] == ["-o", "jsonl", "-oe", "md", "--progress"]


def test_each_engine_gets_its_own_llama_server_argv() -> None:
    ik = ServerLaunch(
        LlamaConfig("ik", (("n-cpu-moe", "2"), ("fused-moe", "0"), ("run-time-repack", "1")), engine=opts.IK_LLAMA),
        Path("m.gguf"),
        4096,
        log_verbosity=4,
    )
    # no -fit (ik_llama.cpp has no --fit to turn off), no -lv; -np 1 --cache-ram 0 for cold measurements;
    # --log-disable, or every server writes llama.log into the working directory
    assert ik.to_argv(Path("llama-server"), 8080) == [
        "llama-server", "-m", "m.gguf", "-c", "4096", "-ngl", "99", "-np", "1", "--cache-ram", "0", "--log-disable",
        "-ncmoe", "2", "-no-fmoe", "-rtr", "--host", "127.0.0.1", "--port", "8080",
    ]  # fmt: skip
    mainline = ServerLaunch(LlamaConfig("m", (("n-cpu-moe", "2"),)), Path("m.gguf"), 4096, log_verbosity=4)
    argv = mainline.to_argv(Path("llama-server"), 8080)
    assert "-fit" in mainline.args() and "-lv" in argv and "--log-disable" not in argv


def test_ik_llama_server_proves_its_cached_part_from_the_tokens_it_evaluated() -> None:
    """ik_llama.cpp's timings carry no cache_n. A 440-token prompt whose first 380 tokens were in the slot: prompt_n
    60, tokens_evaluated 440 -> 380 cached; a cold prompt has prompt_n == tokens_evaluated -> 0 cached."""
    final = json.loads((FIXTURES / "server-final-event.json").read_text())
    assert "cache_n" not in final["timings"]
    t = timings_from_json(final["timings"], final["tokens_evaluated"])
    assert (t.cache_n, t.prompt_n) == (380, 60)
    cold = timings_from_json({**final["timings"], "prompt_n": 440}, 440)
    assert (cold.cache_n, cold.prompt_n) == (0, 440)
    # mainline's own cache_n wins; without the prompt's size nothing is derived
    assert timings_from_json({"cache_n": 5, "prompt_n": 60}, 440).cache_n == 5
    assert timings_from_json(final["timings"]).cache_n is None


def test_the_build_entry_of_each_engine() -> None:
    ik = build.engine_source(opts.IK_LLAMA)
    assert ik.pinned.package == "ik-llama-cpp-python" and ik.vendor == "vendor/ik_llama.cpp"
    assert ik.targets == ("llama-bench", "llama-server") and ik.server_dir == "examples/server"
    args = build.cmake_args_for("cpu", (), ik.pinned.identity, 0, opts.IK_LLAMA)
    assert "-DLLAMA_BUILD_EXAMPLES=ON" in args and not any(a.startswith("-DLLAMA_BUILD_COMMIT") for a in args)
    assert build.build_key(ik.pinned.identity, "cpu", args).startswith("ik0.1.5-cpu-")
    # mainline's key is unchanged by the table (cached builds stay valid)
    main = build.cmake_args_for("cpu", (), build.PINNED.commit, 0)
    assert build.build_key(build.PINNED.commit, "cpu", main) == build.build_key(build.PINNED.commit, "cpu", main)
    assert set(build.ENGINE_SOURCES) == set(opts.ENGINES) == set(opts.ENGINE_TRAITS)
    with pytest.raises(build.BuildError, match="unknown engine 'vllm': choose one of llama.cpp, ik_llama.cpp"):
        build.engine_source("vllm")


def test_the_sdist_build_info_script_is_written_into_an_unpacked_ik_tree(tmp_path: Path) -> None:
    """The ik-llama-cpp-python sdist leaves out common/cmake/build-info-gen-cpp.cmake, which the build runs."""
    tree = tmp_path / "ik"
    (tree / "common").mkdir(parents=True)
    build.engine_source(opts.IK_LLAMA).fixups(tree, "ik0.1.5")  # type: ignore[misc]
    script = (tree / "common" / "cmake" / "build-info-gen-cpp.cmake").read_text()
    assert 'set(BUILD_COMMIT "ik0.1.5")' in script and "build-info.cpp.in" in script


def test_a_configuration_on_an_engine_without_the_flag_is_refused_before_anything_runs() -> None:
    with pytest.raises(Exception, match="ik_llama.cpp has no no-host option .*run it on llama.cpp"):
        LlamaConfig("x", (("no-host", "1"),), engine=opts.IK_LLAMA)
    with pytest.raises(Exception, match="unknown engine 'vllm'"):
        LlamaConfig("x", engine="vllm")
