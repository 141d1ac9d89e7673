"""The llama.cpp option table (xover.domain.llama_options) and the one configuration model derived through it
(xover.domain.config.LlamaConfig): every option round-trips through the study spec, its spellings are llama.cpp's,
each kind of option (valued, list, switch with and without an "off" spelling, environment variable) is spelled for
each tool as the table says, and everything that translates a configuration reads the table."""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest

from xover.analysis import theory
from xover.domain import llama_options as opts
from xover.domain.config import LlamaConfig, from_bench_record, from_server_record, matrix
from xover.domain.study_spec import TUNE_KNOBS, config_from_table
from xover.errors import XoverError
from xover.llamacpp import bench
from xover.llamacpp.server import ServerLaunch
from xover.measure.ttft import TtftPlan, launches

LLAMA_SRC = Path.home() / ".cache" / "xover" / "src" / "llama.cpp-0c1e570"
IK_SRC = Path.home() / ".cache" / "xover" / "src" / "ik_llama.cpp-ik0.1.5"  # `xover llama build --engine ik_llama.cpp`
SAMPLE = {"int": 3, "choice": None, "str": "q8_0", "switch": True, "list": ["10.0.0.1:50052", "10.0.0.2:50053"]}
SAMPLE_BY_NAME = {"override-tensor": ["blk\\.[0-3]\\.ffn_.*_exps=CPU", "output=CPU"], "tensor-split": "1/3"}


def _value(option: opts.LlamaOption) -> object:
    if option.name in SAMPLE_BY_NAME:
        return SAMPLE_BY_NAME[option.name]
    return option.choices[1] if option.kind == "choice" else SAMPLE[option.kind]


def _text(value: object) -> str:
    """The setting a spec value becomes: a list as one comma-separated value, a switch 1 or 0."""
    if isinstance(value, bool):
        return str(int(value))
    return ",".join(value) if isinstance(value, list) else str(value)


def test_names_short_names_and_flags_are_unique() -> None:
    for attr in ("name", "short", "bench_flag"):
        values = [getattr(o, attr) for o in opts.OPTIONS if getattr(o, attr) is not None]
        assert len(values) == len(set(values)), attr
    spellings = [s for o in opts.OPTIONS for s in (*o.spellings, *o.server_off)]
    assert len(spellings) == len(set(spellings))
    decls = [d for o in opts.OPTIONS for d in o.cli]
    assert len(decls) == len(set(decls))


@pytest.mark.parametrize("option", [o for o in opts.OPTIONS if not o.env and o.bench], ids=lambda o: o.name)
def test_every_option_round_trips_through_the_spec(option: opts.LlamaOption) -> None:
    value = _value(option)
    engine = option.engines[0]  # an engine's own option (ik_llama.cpp's -fmoe) is given on that engine
    config = config_from_table({"name": "x", "engine": engine, option.name: value}, 0)
    assert config.settings == ((option.name, _text(value)),)
    assert config.bench_argv() == option.bench_args(_text(value))
    assert config.server_argv() == option.server_args(_text(value))
    if engine != opts.ENGINE:
        return  # the legacy readers below are for stores written before engines existed
    # what llama-bench was given reads back as the same configuration (the store's legacy reader uses this)
    assert from_bench_record("x", [config.bench_argv()], (), ()).settings == config.settings
    old_server = ["-m", "m.gguf", "-c", "512", "-np", "1", "--cache-ram", "0", "-fit", "off", *config.server_argv()]
    assert from_server_record("x", old_server, ()).settings == (
        config.settings if option.kind != "switch" or option.server_off or value else ()
    )


def test_a_server_only_option_is_served_and_refused_by_llama_bench_in_one_line() -> None:
    config = config_from_table({"name": "x", "threads": 4, "threads-batch": 16}, 0)
    assert config.server_argv() == ("-t", "4", "-tb", "16")
    assert from_server_record("x", ["-m", "m.gguf", *config.server_argv()], ()).settings == config.settings
    with pytest.raises(XoverError, match="llama-bench has no option threads-batch: leave it out"):
        config.bench_argv()
    assert opts.THREADS_BATCH not in opts.SWEPT and not opts.THREADS_BATCH.tuned_values


def test_an_environment_option_is_a_setting_passed_in_the_environment() -> None:
    config = config_from_table({"name": "x", "env": {"GGML_OP_OFFLOAD_MIN_BATCH": 64, "OTHER": "y"}}, 0)
    assert config.settings == (("GGML_OP_OFFLOAD_MIN_BATCH", "64"),) and config.env == (("OTHER", "y"),)
    assert config.bench_argv() == () and config.server_argv() == ()
    assert config.environment() == (("GGML_OP_OFFLOAD_MIN_BATCH", "64"), ("OTHER", "y"))


def test_each_kind_of_switch_is_spelled_for_each_tool() -> None:
    # with an "off" spelling for llama-server
    on, off = (LlamaConfig("x", (("no-op-offload", v),)) for v in ("1", "0"))
    assert (on.bench_argv(), on.server_argv()) == (("-nopo", "1"), ("--no-op-offload",))
    assert (off.bench_argv(), off.server_argv()) == (("-nopo", "0"), ("--op-offload",))
    # without one: off is llama-server's default, so nothing is passed
    on, off = (LlamaConfig("x", (("no-host", v),)) for v in ("1", "0"))
    assert (on.bench_argv(), on.server_argv()) == (("--no-host", "1"), ("--no-host",))
    assert (off.bench_argv(), off.server_argv()) == (("--no-host", "0"), ())
    # on by default, with an off spelling
    off = LlamaConfig("x", (("repack", "0"),))
    assert (off.bench_argv(), off.server_argv()) == (("--repack", "0"), ("-nr",))
    with pytest.raises(XoverError, match="no-host must be true or false"):
        config_from_table({"name": "x", "no-host": "yes"}, 0)
    with pytest.raises(XoverError, match="flash-attn must be one of on, off, auto"):
        config_from_table({"name": "x", "flash-attn": "yes"}, 0)


def test_no_host_is_one_table_entry_seen_everywhere() -> None:
    """Adding --no-host (llama-server's bare flag, llama-bench's 0|1) was one entry in the table: it reaches both
    tools' arguments, the study spec, llama-bench's record check, the export's columns, the tuning stage's knobs
    and the sweep options of `xover bench` and `xover ttft`, with nothing else written for it."""
    from xover.analysis import advise
    from xover.cli import bench as bench_cli
    from xover.cli import ttft as ttft_cli
    from xover.report import export

    config = config_from_table({"name": "x", "n-cpu-moe": 20, "no-host": True}, 0)
    job = bench.BenchJob(config, 512, 32, (0,), 2)
    argv = job.to_argv(Path("llama-bench"), Path("m.gguf"))
    assert argv[argv.index("--no-host") + 1] == "1"
    assert ServerLaunch(config, Path("m.gguf"), 4096).args()[-3:] == ("-ncmoe", "20", "--no-host")
    assert bench.record_mismatch(config, {"no_host": True, "n_cpu_moe": 20}) is None
    assert "no_host=False" in (bench.record_mismatch(config, {"no_host": False, "n_cpu_moe": 20}) or "")
    assert "no_host" in export._RECORD_COLUMNS
    knobs = {k.name: k for k in advise.study_knobs(cpu_count=4, gpu_build=True, longest=4096)}
    assert knobs["no-host"].candidates == ("1",) and knobs["no-host"].short == "nohost"
    assert "no-host" not in {k.name for k in advise.study_knobs(cpu_count=4, gpu_build=False, longest=4096)}
    tuned = advise.apply_setting(LlamaConfig("x"), tuple(knobs.values()), (("no-host", "1"),), "x tuned")
    assert tuned.server_argv() == ("--no-host",) and advise.setting_label(
        tuple(knobs.values()), (("no-host", "1"),)
    ) == ("nohost=1")
    for command in (bench_cli.bench, ttft_cli.ttft):
        assert "--no-host" in {d for p in command.params if isinstance(p, click.Option) for d in p.opts}
    assert bench.RESERVED_FLAGS["--no-host"] == "--no-host"


def test_an_engine_that_lacks_an_option_is_refused_before_anything_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(XoverError, match="unknown engine 'other'; use one of llama.cpp"):
        config_from_table({"name": "x", "engine": "other"}, 0)
    # an engine the table lists no option of: each setting is refused in one line, naming the option
    monkeypatch.setattr(opts, "ENGINES", (*opts.ENGINES, "other"))
    assert LlamaConfig("x", engine="other").settings == ()
    with pytest.raises(XoverError, match=r"\[\[config\]\] 'x': other has no no-host option"):
        config_from_table({"name": "x", "engine": "other", "no-host": True}, 0)


def test_the_identity_is_the_configuration_not_its_name_order_or_measurement() -> None:
    a = LlamaConfig("a", (("ubatch-size", "2048"), ("n-cpu-moe", "12")))
    b = LlamaConfig("b", (("n-cpu-moe", "12"), ("ubatch-size", "2048")))
    assert a.key == b.key and a.settings == (("n-cpu-moe", "12"), ("ubatch-size", "2048"))
    assert a.key != a.with_values({"ubatch-size": "4096"}).key
    assert a.key != a.with_env({"XOVER_RECHECK": "1"}).key
    assert a.key != LlamaConfig("a", a.settings, engine=opts.ENGINE, server_args=("--jinja",)).key
    launch = ServerLaunch(a, Path("/models/q.gguf"), 8192)
    moved = ServerLaunch(a, Path("/elsewhere/q.gguf"), 4096, cold_cache=False, own_args=("--cache-reuse", "256"))
    assert launch.config.key == moved.config.key  # xover's own flags are not part of it
    with pytest.raises(XoverError, match="unknown llama.cpp option 'ubatch'"):
        LlamaConfig("x", (("ubatch", "1"),))


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
    every_engine = {(o.name, o.short) for e in opts.ENGINES for o, _ in opts.tuned(cpu_count=1, engine=e)}
    assert set(TUNE_KNOBS) == every_engine
    # each engine searches its own knobs: ik_llama.cpp's fused MoE and run-time repacking, not mainline's -lm
    ik = {o.name: v for o, v in opts.tuned(cpu_count=1, engine=opts.IK_LLAMA)}
    assert ik["fused-moe"] == ("0",) and ik["run-time-repack"] == ("1",) and ik["flash-attn"] == ("off",)
    assert "load-mode" not in ik and "fused-moe" not in {o.name for o, _ in opts.tuned(cpu_count=1)}
    for option in opts.OPTIONS:
        for value in (*option.search, *option.tuned_values):
            assert value != option.default, option.name
            assert not option.choices or value in option.choices, option.name


def test_record_values_and_the_record_check() -> None:
    assert opts.FLASH_ATTN.record_value("auto") == -1 and opts.NO_OP_OFFLOAD.record_value("1") == 1
    assert opts.LOAD_MODE.record_value("none") is None and opts.UBATCH_SIZE.record_value("256") == 256
    checked = {o.name: o.record_field for o in opts.OPTIONS if o.checked}
    assert checked == {
        "n-cpu-moe": "n_cpu_moe",
        "ubatch-size": "n_ubatch",
        "batch-size": "n_batch",
        "no-op-offload": "no_op_offload",
        "no-host": "no_host",
        "repack": "repack",
        "threads": "n_threads",
        "poll": "poll",
        "flash-attn": "flash_attn",
        # ik_llama.cpp's own, in its llama-bench's JSON fields
        "fused-moe": "fused_moe",
        "run-time-repack": "repack",
        "no-offload-only-active-experts": "no_ooae",
        "attention-max-batch": "attn_max_batch",
    }
    # ik_llama.cpp's llama-bench reports no n_cpu_moe (its --n-cpu-moe is a tensor override there), and its -fa is a
    # boolean: the check follows the engine's form of each option
    ik = LlamaConfig("ik", (("n-cpu-moe", "4"), ("flash-attn", "off")), engine=opts.IK_LLAMA)
    assert bench.record_mismatch(ik, {"n_cpu_moe": 0, "flash_attn": False}) is None
    assert (
        bench.record_mismatch(ik, {"flash_attn": True})
        == "llama-bench reported flash_attn=True for a configuration with -fa 0"
    )
    config = LlamaConfig("x", (("no-op-offload", "1"), ("load-mode", "none")))
    assert bench.record_mismatch(config, {"no_op_offload": 1, "load_mode": "auto"}) is None
    assert bench.record_mismatch(config, {"no_op_offload": 0}) == (
        "llama-bench reported no_op_offload=0 for a configuration with -nopo 1"
    )
    assert opts.record_fields()[:2] == ("n_cpu_moe", "n_gpu_layers")


def test_what_xover_passes_is_spelled_as_the_table_says() -> None:
    sweeps = [
        (opts.N_CPU_MOE, ("12",)),
        (opts.LOAD_MODE, ("none",)),
        (opts.UBATCH_SIZE, ("2048",)),
        (opts.BATCH_SIZE, ("4096",)),
        (opts.NO_OP_OFFLOAD, ("0", "1")),
        (opts.THREADS, ("4",)),
        (opts.FLASH_ATTN, ("on",)),
    ]
    configs = matrix(sweeps)
    assert [c.name for c in configs] == ["nopo=0", "nopo=1"]
    argv = bench.BenchJob(configs[1], 512, 128, (0,), 2).to_argv(Path("llama-bench"), Path("m.gguf"))
    bench_flags = [a for a in argv if a.startswith("-") and not re.fullmatch(r"-\d+", a)]
    known = {s for o in opts.OPTIONS for s in o.bench}
    assert {"-ncmoe", "-lm", "-b", "-ub", "-fa", "-nopo", "-t"} <= set(bench_flags)
    assert set(bench_flags) - known == {"-m", "-p", "-n", "-d", "-r", "-o", "-oe", "--progress"}
    for flag in bench.RESERVED_FLAGS:
        option = opts.by_spelling(flag)
        assert option is None or flag in option.bench, flag
    assert {"-lm", "-b", "-ub", "-t", "-nopo", "-ncmoe", "-fa"} <= set(bench.RESERVED_FLAGS)
    assert [c.server_argv() for c in configs] == [
        ("-ncmoe", "12", "-lm", "none", "-ub", "2048", "-b", "4096", "--op-offload", "-t", "4", "-fa", "on"),
        ("-ncmoe", "12", "-lm", "none", "-ub", "2048", "-b", "4096", "--no-op-offload", "-t", "4", "-fa", "on"),
    ]


def test_rpc_comes_before_the_overrides_that_name_its_devices() -> None:
    config = config_from_table(
        {"name": "x", "override-tensor": ["blk\\.[23]\\.ffn_.*_exps=RPC0[{rpc0}]"], "rpc-local": 1}, 0
    ).with_rpc(("127.0.0.1:50052",))
    argv = config.bench_argv()
    assert argv.index("--rpc") < argv.index("-ot") and argv[argv.index("-ot") + 1].endswith("RPC0[127.0.0.1:50052]")


def test_ttft_server_launches() -> None:
    sweeps = [
        (opts.N_CPU_MOE, ("12",)),
        (opts.LOAD_MODE, ("none",)),
        (opts.UBATCH_SIZE, ("2048",)),
        (opts.BATCH_SIZE, ("4096",)),
        (opts.NO_OP_OFFLOAD, ("1",)),
        (opts.THREADS, ("4",)),
        (opts.FLASH_ATTN, ("on",)),
    ]
    plan = TtftPlan(lengths=(1024,), reps=1, response_tokens=8, mode="cold", text=False, seed=1, max_retries=0)
    env = (("GGML_OP_OFFLOAD_MIN_BATCH", ("64",)),)
    [launch] = launches(Path("/m.gguf"), sweeps, env, ("--jinja", "-ngl", "99"), plan, True, 4)
    assert launch.args() == (
        "-m",
        "/m.gguf",
        "-c",
        "1536",
        "-np",
        "1",
        "--cache-ram",
        "0",
        "-fit",
        "off",
        "-ncmoe",
        "12",
        "-ngl",
        "99",
        "-lm",
        "none",
        "-ub",
        "2048",
        "-b",
        "4096",
        "--no-op-offload",
        "-t",
        "4",
        "-fa",
        "on",
        "--jinja",
    )
    assert launch.env == (("GGML_OP_OFFLOAD_MIN_BATCH", "64"),)
    assert ServerLaunch(LlamaConfig("x"), Path("/m.gguf"), 512).args()[4:6] == ("-ngl", "99")  # xover's own


def test_the_theory_reads_a_configuration_through_the_table() -> None:
    config = LlamaConfig(
        "x", (("n-cpu-moe", "18"), ("no-op-offload", "1"), ("ubatch-size", "256"), ("GGML_OP_OFFLOAD_MIN_BATCH", "64"))
    )
    assert theory.offload_of(config) == theory.Offload(18, op_offload=False, ubatch=256, op_offload_min_batch=64)
    assert theory.offload_of(LlamaConfig("x", (("load-mode", "none"),))).pinned
    assert theory.offload_of(LlamaConfig("x", server_args=("--no-mmap",))).pinned
    assert theory.offload_of(LlamaConfig("x")) == theory.Offload()
    # ik_llama.cpp loads its CPU experts into the GPU's pinned host buffer whatever the load mode (its log in the H200
    # engines study: "buffer type overriden to CUDA_Host"), so op offload copies them at the pinned rate
    assert theory.offload_of(LlamaConfig("x", engine="ik_llama.cpp")) == theory.Offload(pinned=True)


@pytest.mark.skipif(not LLAMA_SRC.is_dir(), reason="the pinned llama.cpp tree is not checked out")
def test_spellings_are_llama_cpps() -> None:
    bench_src = (LLAMA_SRC / "tools" / "llama-bench" / "llama-bench.cpp").read_text()
    server_src = (LLAMA_SRC / "common" / "arg.cpp").read_text()
    for option in (o.for_engine(opts.ENGINE) for o in opts.OPTIONS if opts.ENGINE in o.engines):
        if option.env:  # read by the ggml of every backend it names (getenv("NAME"))
            for backend in option.backends or ("cuda",):
                folder = LLAMA_SRC / "ggml" / "src" / f"ggml-{'cuda' if backend == 'hip' else backend}"
                text = "".join(p.read_text() for p in folder.glob("*.[cm]*") if p.is_file())
                assert f'getenv("{option.name}")' in text, (option.name, backend)
            continue
        for spelling in option.bench:
            assert f'arg == "{spelling}"' in bench_src, spelling
        for spelling in (*option.server, *option.server_off):
            assert re.search(rf'{{[^}}]*"{re.escape(spelling)}"', server_src), spelling
        if option.record_field:
            assert f'"{option.record_field}"' in bench_src, option.record_field


@pytest.mark.skipif(not IK_SRC.is_dir(), reason="the pinned ik_llama.cpp tree is not unpacked")
def test_ik_llama_cpp_spellings_are_its_own() -> None:
    """Each option ik_llama.cpp takes, in its form (its llama-bench's ``--n-cpu-moe``, ``-fa 0|1``, ``-fmoe``...),
    is spelled as that engine's llama-bench and common/common.cpp (its llama-server's arguments) parse it, and its
    record field is one its llama-bench writes."""
    bench_src = (IK_SRC / "examples" / "llama-bench" / "llama-bench.cpp").read_text()
    server_src = (IK_SRC / "common" / "common.cpp").read_text()
    taken = [o.for_engine(opts.IK_LLAMA) for o in opts.OPTIONS if opts.IK_LLAMA in o.engines]
    assert {o.name for o in taken} >= {"n-cpu-moe", "ubatch-size", "flash-attn", "fused-moe", "run-time-repack"}
    for option in taken:
        for spelling in option.bench:
            assert f'arg == "{spelling}"' in bench_src, spelling
        for spelling in (*option.server, *option.server_off):
            assert f'arg == "{spelling}"' in server_src or f'|| arg == "{spelling}"' in server_src, spelling
        if option.record_field:
            assert f'"{option.record_field}"' in bench_src, option.record_field
    # what mainline has and ik_llama.cpp lacks is refused in one line, before anything runs
    for name in ("load-mode", "no-op-offload", "no-host", "repack", "poll", "rpc"):
        with pytest.raises(XoverError, match=f"ik_llama.cpp has no {name} option"):
            LlamaConfig("x", ((name, "1" if opts.BY_NAME[name].kind == "switch" else "none"),), engine=opts.IK_LLAMA)


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
        assert (k.record_field, k.record_values) == (option.record_field, option.record_values)
    assert [k.name for k in advise.default_knobs(4)] == [o.name for o, _ in opts.searched(4)]
    assert dict((k.name, k.candidates) for k in knobs)["ubatch-size"] == ("1024", "2048", "4096", "8192")
    config = advise.llama_config(knobs, (("no-op-offload", "1"), ("GGML_OP_OFFLOAD_MIN_BATCH", "64")), 3, "x")
    assert config.bench_argv() == ("-ncmoe", "3", "-nopo", "1")
    assert config.environment() == (("GGML_OP_OFFLOAD_MIN_BATCH", "64"),)
    knobs = advise.with_values_to_try(advise.default_knobs(4), "flash-attn", ("on",))
    assert knobs[-1].name == "flash-attn" and knobs[-1].candidates == ("on",)


def test_pass_through_arguments_may_not_set_what_the_table_knows() -> None:
    with pytest.raises(XoverError, match="server-args sets threads, an option xover knows: write it as the key"):
        config_from_table({"name": "x", "server-args": ["-t", "8"]}, 0)
    assert config_from_table({"name": "x", "server-args": ["--jinja"]}, 0).server_args == ("--jinja",)
    assert opts.parse_args(["-ngl", "99", "--mlock", "-nopo", "1"], "bench") == (
        {"n-gpu-layers": "99", "no-op-offload": "1"},
        ("--mlock",),
    )
    assert opts.parse_args(["--no-op-offload", "--jinja", "-nr"], "server") == (
        {"no-op-offload": "1", "repack": "0"},
        ("--jinja",),
    )
