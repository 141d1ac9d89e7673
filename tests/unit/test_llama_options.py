"""The llama.cpp option table (xover.domain.llama_options): every option round-trips through the study spec,
its spellings are llama.cpp's, and what xover passes each tool is spelled as the table says."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from xover.analysis import theory
from xover.domain import llama_options as opts
from xover.domain.records import BenchConfig
from xover.domain.study_spec import SHARED_FLAGS, TUNE_KNOBS, config_from_table
from xover.llamacpp import bench
from xover.llamacpp.server import ServerSpec
from xover.measure import bench as benchrun
from xover.measure.ttft import TtftPlan

LLAMA_SRC = Path.home() / ".cache" / "xover" / "src" / "llama.cpp-0c1e570"
SAMPLE = {"int": 3, "choice": None, "str": "q8_0", "list": ["10.0.0.1:50052", "10.0.0.2:50053"]}
SAMPLE_BY_NAME = {"override-tensor": ["blk\\.[0-3]\\.ffn_.*_exps=CPU", "output=CPU"], "tensor-split": "1/3"}


def _value(option: opts.LlamaOption) -> object:
    if option.name in SAMPLE_BY_NAME:
        return SAMPLE_BY_NAME[option.name]
    return option.choices[1] if option.kind == "choice" else SAMPLE[option.kind]


def _text(value: object) -> str:
    """What the tools get for a spec value: a list as one comma-separated value."""
    return ",".join(value) if isinstance(value, list) else str(value)


def test_names_short_names_and_flags_are_unique() -> None:
    for attr in ("name", "short", "bench_flag"):
        values = [getattr(o, attr) for o in opts.OPTIONS if getattr(o, attr) is not None]
        assert len(values) == len(set(values)), attr
    spellings = [s for o in opts.OPTIONS for s in o.spellings]
    assert len(spellings) == len(set(spellings))


@pytest.mark.parametrize("option", [o for o in opts.OPTIONS if o.shared_flag], ids=lambda o: o.name)
def test_every_shared_option_round_trips_through_the_spec(option: opts.LlamaOption) -> None:
    value = _value(option)
    config = config_from_table({"name": "x", option.name: value}, 0)
    assert config.flags == ((option.shared_flag, _text(value)),)
    bench_value = option.bench_value(_text(value))  # -ot's items joined by ";" for llama-bench, "," for llama-server
    assert config.bench_config().fields == ((option.bench_flag, bench_value),)
    assert config.server_args_list() == opts.BY_BENCH_FLAG[option.bench_flag].server_args(bench_value)
    assert config.server_args_list() == (option.server_flag, _text(value))
    assert theory.config_from_flags(config.bench_config().fields) == theory.config_from_flags(
        args=config.server_args_list()
    )


def test_the_spec_takes_every_option_with_one_flag_for_both_tools() -> None:
    assert set(SHARED_FLAGS) == {o.name for o in opts.OPTIONS if not o.env and o.kind != "switch"}
    config = config_from_table({"name": "x", "no-op-offload": True}, 0)
    assert config.bench_config().fields == (("-nopo", "1"),)
    assert config.server_args_list() == ("--no-op-offload",)
    with pytest.raises(Exception, match="flash-attn must be one of on, off, auto"):
        config_from_table({"name": "x", "flash-attn": "yes"}, 0)


def test_search_values_and_tuning_knobs() -> None:
    assert [(o.name, v) for o, v in opts.searched(cpu_count=8)] == [
        ("load-mode", ("none",)),
        ("ubatch-size", ("1024", "2048", "4096")),
        ("batch-size", ("4096",)),
        ("no-op-offload", ("1",)),
        ("GGML_OP_OFFLOAD_MIN_BATCH", ("1024",)),
        ("threads", ("4", "8")),
    ]
    assert dict((o.name, v) for o, v in opts.tuned(cpu_count=1))["threads"] == ("1",)
    assert TUNE_KNOBS == tuple((o.name, o.short) for o, _ in opts.tuned(cpu_count=1))
    for option in opts.OPTIONS:
        for value in (*option.search, *option.tuned_values):
            assert value != option.default, option.name
            assert not option.choices or value in option.choices, option.name


def test_record_values() -> None:
    assert opts.FLASH_ATTN.record_value("auto") == -1 and opts.NO_OP_OFFLOAD.record_value("1") == 1
    assert opts.LOAD_MODE.record_value("none") is None and opts.UBATCH_SIZE.record_value("256") == 256
    assert bench._RECORD_FIELD == {
        "-ncmoe": "n_cpu_moe",
        "-ub": "n_ubatch",
        "-b": "n_batch",
        "-t": "n_threads",
        "-nopo": "no_op_offload",
        "-fa": "flash_attn",
    }
    assert (
        bench.record_mismatch(
            BenchConfig("x", (("-nopo", "1"), ("-lm", "none"))), {"no_op_offload": 1, "load_mode": "auto"}
        )
        is None
    )


def test_what_xover_passes_is_spelled_as_the_table_says() -> None:
    configs = benchrun.combinations(
        ncmoe=(12,),
        load_mode=("none",),
        batch=(4096,),
        ubatch=(2048,),
        flash_attn=("on",),
        no_op_offload=(0, 1),
        threads=(4,),
    )
    argv = bench.BenchJob(configs[1], 512, 128, (0,), 2).to_argv(Path("llama-bench"), Path("m.gguf"))
    bench_flags = [a for a in argv if a.startswith("-") and not re.fullmatch(r"-\d+", a)]
    known = {s for o in opts.OPTIONS for s in o.bench}
    assert {"-ncmoe", "-lm", "-b", "-ub", "-fa", "-nopo", "-t"} <= set(bench_flags)
    assert set(bench_flags) - known == {"-m", "-p", "-n", "-d", "-r", "-o", "-oe", "--progress"}
    for flag in bench.RESERVED_FLAGS:
        option = opts.by_spelling(flag)
        assert option is None or flag in option.bench, flag

    server_known = {s for o in opts.OPTIONS for s in (*o.server, *o.server_off)}
    spec = ServerSpec(Path("m.gguf"), "x", 4096, n_cpu_moe=12, threads=4, flash_attn="on")
    assert {"--n-cpu-moe", "-t", "-fa", "-ngl"} <= set(spec.args()) and {
        "--n-cpu-moe",
        "-t",
        "-fa",
        "-ngl",
    } <= server_known
    assert [opts.server_config(c).args for c in configs] == [
        ("-ncmoe", "12", "-lm", "none", "-b", "4096", "-ub", "2048", "-fa", "on", "--op-offload", "-t", "4"),
        ("-ncmoe", "12", "-lm", "none", "-b", "4096", "-ub", "2048", "-fa", "on", "--no-op-offload", "-t", "4"),
    ]


def test_ttft_server_configurations() -> None:
    from xover.cli.ttft import _specs

    configs = benchrun.combinations(
        ncmoe=(12,),
        load_mode=("none",),
        batch=(4096,),
        ubatch=(2048,),
        flash_attn=("on",),
        no_op_offload=(1,),
        threads=(4,),
        env=(("GGML_OP_OFFLOAD_MIN_BATCH", ("64",)),),
    )
    plan = TtftPlan(lengths=(1024,), reps=1, response_tokens=8, mode="cold", text=False, seed=1, max_retries=0)
    [spec] = _specs(Path("/m.gguf"), [opts.server_config(c) for c in configs], plan, ("--jinja",), True, 4)
    assert spec.args() == (
        "-m",
        "/m.gguf",
        "-c",
        "1536",
        "-ngl",
        "99",
        "--n-cpu-moe",
        "12",
        "-t",
        "4",
        "-fa",
        "on",
        "-np",
        "1",
        "--cache-ram",
        "0",
        "-fit",
        "off",
        "-lm",
        "none",
        "-b",
        "4096",
        "-ub",
        "2048",
        "--no-op-offload",
        "--jinja",
    )
    assert spec.env == (("GGML_OP_OFFLOAD_MIN_BATCH", "64"),)
    assert opts.take(("-lm", "none", "-t", "4", "--x"), (opts.THREADS,)) == ({"threads": "4"}, ("-lm", "none", "--x"))


def test_theory_reads_every_spelling() -> None:
    for option, value, field, expected in (
        (opts.N_CPU_MOE, "7", "n_cpu_moe", 7),
        (opts.UBATCH_SIZE, "256", "ubatch", 256),
        (opts.LOAD_MODE, "none", "pinned", True),
    ):
        for spelling in option.spellings:
            assert getattr(theory.config_from_flags([(spelling, value)]), field) == expected, spelling
            assert getattr(theory.config_from_flags(args=[spelling, value]), field) == expected, spelling
    for spelling in opts.NO_OP_OFFLOAD.spellings:
        assert not theory.config_from_flags(args=[spelling]).op_offload
    assert theory.config_from_flags(env=[(opts.OP_OFFLOAD_MIN_BATCH.name, "64")]).op_offload_min_batch == 64


@pytest.mark.skipif(not LLAMA_SRC.is_dir(), reason="the pinned llama.cpp tree is not checked out")
def test_spellings_are_llama_cpps() -> None:
    bench_src = (LLAMA_SRC / "tools" / "llama-bench" / "llama-bench.cpp").read_text()
    server_src = (LLAMA_SRC / "common" / "arg.cpp").read_text()
    for option in opts.OPTIONS:
        if option.env:
            assert f'"{option.name}"' in (LLAMA_SRC / "ggml" / "src" / "ggml-vulkan" / "ggml-vulkan.cpp").read_text()
            continue
        for spelling in option.bench:
            assert f'arg == "{spelling}"' in bench_src, spelling
        for spelling in (*option.server, *option.server_off):
            assert re.search(rf'{{[^}}]*"{re.escape(spelling)}"', server_src), spelling
        if option.record_field:
            assert f'"{option.record_field}"' in bench_src, option.record_field


def test_advise_knobs_are_the_tables_options() -> None:
    from xover.analysis import advise

    knobs = advise.study_knobs(cpu_count=4, gpu_build=True, longest=32768)
    for k in knobs:
        option = opts.BY_NAME[k.name]
        assert (k.flag, k.short, k.default, k.gpu_only, k.env) == (
            option.bench_flag,
            option.short,
            option.default,
            option.gpu_only,
            option.env,
        )
        assert k.record_field == (None if option.record_values else option.record_field)
    assert [k.name for k in advise.default_knobs(4)] == [o.name for o, _ in opts.searched(4)]
    assert dict((k.name, k.candidates) for k in knobs)["ubatch-size"] == ("1024", "2048", "4096", "8192")
    config = advise.llama_config(knobs, (("no-op-offload", "1"), ("GGML_OP_OFFLOAD_MIN_BATCH", "64")), 3, "x")
    assert config.bench_config().fields == (("-ncmoe", "3"), ("-nopo", "1"))
    assert config.env == (("GGML_OP_OFFLOAD_MIN_BATCH", "64"),)
