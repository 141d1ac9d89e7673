"""llama-bench output parsing, argv building, sweep planning and failure classification.

The lines below were captured once from the real CPU llama-bench (llama.cpp 0c1e570) running
``-m tiny-moe.gguf -p 64 -n 16 -d 0,256 -r 2 -t 1 -o jsonl -oe md --progress``.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from fakes.known import VERBOSE_STDERR
from xover.cli import options
from xover.domain import llama_options as opts
from xover.domain.config import LlamaConfig
from xover.errors import XoverError
from xover.llamacpp import bench
from xover.llamacpp.bench import BenchJob, Exited, MarkdownLine, OtherLine, ProgressLine, RecordLine
from xover.measure import bench as benchrun

# stdout: one JSON object per test (the 3rd test of the run: pp64 @ d256)
PP_D256 = (
    '{"build_commit": "0c1e570", "build_number": 0, "cpu_info": "AMD EPYC", "gpu_info": "", "backends": "CPU", '
    '"model_filename": "tiny-moe.gguf", "model_type": "qwen3moe ?B Q4_K - Medium", "model_size": 4675072, '
    '"model_n_params": 7613184, "n_batch": 2048, "n_ubatch": 512, "n_threads": 1, "cpu_mask": "0x0", '
    '"cpu_strict": false, "poll": 50, "type_k": "f16", "type_v": "f16", "n_gpu_layers": -1, "n_cpu_moe": 0, '
    '"split_mode": "layer", "main_gpu": 0, "no_kv_offload": false, "flash_attn": -1, "devices": "auto", '
    '"tensor_split": "0.00", "tensor_buft_overrides": "none", "load_mode": "auto", "lazy_mode": "auto", '
    '"embeddings": false, "no_op_offload": 0, "no_host": false, "repack": true, "fit_target": 0, "fit_min_ctx": 0, '
    '"n_prompt": 64, "n_gen": 0, "n_depth": 256, "test_time": "2026-11-30T17:17:48Z", "avg_ns": 14083715, '
    '"stddev_ns": 361911, "avg_ts": 4545.755943, "stddev_ts": 116.800434, '
    '"samples_ns": [ 14339598, 13827833 ],"samples_ts": [ 4463.17, 4628.35 ]}'
)
TG_D256 = PP_D256.replace('"n_prompt": 64, "n_gen": 0', '"n_prompt": 0, "n_gen": 16').replace(
    '"avg_ns": 14083715, "stddev_ns": 361911, "avg_ts": 4545.755943, "stddev_ts": 116.800434, '
    '"samples_ns": [ 14339598, 13827833 ],"samples_ts": [ 4463.17, 4628.35 ]',
    '"avg_ns": 8278592, "stddev_ns": 183613, "avg_ts": 1933.170936, "stddev_ts": 42.865886, '
    '"samples_ns": [ 8408395, 8148790 ],"samples_ts": [ 1902.86, 1963.48 ]',
)

# stderr of the same run (progress and -oe md interleaved), for tests 3 and 4
STDERR = """\
| model                          |       size |     params | backend    | threads |            test |                  t/s |
| ------------------------------ | ---------: | ---------: | ---------- | ------: | --------------: | -------------------: |
llama-bench: benchmark 3/4: starting
llama-bench: benchmark 3/4: warmup prompt run
llama-bench: benchmark 3/4: depth run 1/2
llama-bench: benchmark 3/4: prompt run 1/2
llama-bench: benchmark 3/4: depth run 2/2 (cached)
llama-bench: benchmark 3/4: prompt run 2/2
| qwen3moe ?B Q4_K - Medium      |   4.46 MiB |     7.61 M | CPU        |       1 |     pp64 @ d256 |     4545.76 ± 116.80 |
llama-bench: benchmark 4/4: starting
llama-bench: benchmark 4/4: warmup generation run
llama-bench: benchmark 4/4: depth run 1/2 (cached)
llama-bench: benchmark 4/4: generation run 1/2

build: 0c1e570 (0)"""

# stderr of failures seen on the real binary
BAD_ARG_STDERR = "error: invalid parameter for argument: --bogus"
GOMP_STDERR = "llama-bench: benchmark 1/2: starting\nllama-bench: benchmark 1/2: warmup prompt run\n\nlibgomp: Thread creation failed: Resource temporarily unavailable"
NO_MODEL_STDERR = "llama_bench: error: failed to load model '/nonexist.gguf'"


# ---- line parsing ---------------------------------------------------------------------------------


def test_what_flash_attention_auto_ran_as_is_read_from_the_log() -> None:
    # llama.cpp 0c1e570, llama-bench -v: resolve_fused_ops' lines when a context is made with -fa auto
    assert bench.resolved_setting("resolve_fused_ops: Flash Attention enabled") == ("flash_attn", "1")
    assert bench.resolved_setting("resolve_fused_ops: Flash Attention not supported, set to disabled\n") == (
        "flash_attn",
        "0",
    )
    assert bench.resolved_setting("llama_context: flash_attn            = auto") is None
    assert bench.resolved_setting("resolve_fused_ops: resolving fused Gated Delta Net support:") is None


def test_progress_lines_parse_into_phases() -> None:
    lines = [bench.parse_progress(ln) for ln in STDERR.splitlines()]
    got = [ln for ln in lines if ln is not None]
    assert got[0] == ProgressLine(3, 4, "starting")
    assert got[1] == ProgressLine(3, 4, "warmup prompt")
    assert got[2] == ProgressLine(3, 4, "depth", 1, 2, cached=False)
    assert got[3] == ProgressLine(3, 4, "prompt", 1, 2)
    assert got[4] == ProgressLine(3, 4, "depth", 2, 2, cached=True)
    assert got[7] == ProgressLine(4, 4, "warmup generation")
    assert got[-1] == ProgressLine(4, 4, "generation", 1, 2)
    assert len(got) == 10


def test_classify_separates_records_progress_markdown_and_errors() -> None:
    assert isinstance(bench.classify("stdout", PP_D256), RecordLine)
    assert bench.classify("stdout", "usage: llama-bench [options]") == OtherLine(
        "stdout", "usage: llama-bench [options]"
    )
    assert bench.classify("stdout", PP_D256[:200]) == OtherLine("stdout", PP_D256[:200])  # truncated by a crash
    assert bench.classify("stdout", '{"n_prompt": 1}') == OtherLine("stdout", '{"n_prompt": 1}')  # not a test record
    kinds = [type(bench.classify("stderr", ln)) for ln in STDERR.splitlines()]
    assert kinds.count(MarkdownLine) == 4  # header, rule, one row, build footer
    assert kinds.count(ProgressLine) == 10
    assert isinstance(bench.classify("stderr", BAD_ARG_STDERR), OtherLine)


def test_result_keeps_raw_samples_and_llama_bench_summary() -> None:
    record = bench.parse_record(PP_D256)
    assert record is not None
    r = bench.result_from_record("cfg", record)
    assert r.test_name == "pp64 @ d256"
    assert r.samples_ns == (14339598, 13827833)
    assert (r.avg_ts, r.stddev_ts) == (4545.755943, 116.800434)
    # samples_ts is recomputed from the integer nanoseconds: 64 tokens / time
    assert r.samples_ts == (64e9 / 14339598, 64e9 / 13827833)
    # ... and agrees with llama-bench's printed (six significant digits) samples and its mean/sd
    assert [round(x, 2) for x in r.samples_ts] == [4463.17, 4628.35]
    mean = sum(r.samples_ts) / 2
    sd = math.sqrt(sum((x - mean) ** 2 for x in r.samples_ts))
    assert mean == pytest.approx(r.avg_ts, abs=1e-6) and sd == pytest.approx(r.stddev_ts, abs=1e-6)
    tg = bench.result_from_record("cfg", bench.parse_record(TG_D256) or {})
    assert tg.test_name == "tg16 @ d256" and tg.samples_ts[0] == 16e9 / 8408395


def test_record_must_match_its_configuration() -> None:
    record = bench.parse_record(PP_D256) or {}
    t1 = LlamaConfig("t=1", (("threads", "1"), ("n-cpu-moe", "0")))
    assert bench.record_mismatch(t1, record) is None
    assert bench.record_mismatch(LlamaConfig("fa", (("flash-attn", "auto"),)), record) is None
    assert "n_threads=1" in (bench.record_mismatch(LlamaConfig("t=2", (("threads", "2"),)), record) or "")
    assert "flash_attn=-1" in (bench.record_mismatch(LlamaConfig("fa", (("flash-attn", "on"),)), record) or "")


# ---- argv -----------------------------------------------------------------------------------------


def test_job_argv_and_points_follow_llama_bench_order() -> None:
    config = LlamaConfig(
        "ncmoe=12",
        (("n-cpu-moe", "12"), ("threads", "8"), ("GGML_OP_OFFLOAD_MIN_BATCH", "64")),
        bench_args=("--poll", "0"),
    )
    job = BenchJob(config, n_prompt=512, n_gen=128, depths=(1000, 4000), repetitions=5)
    assert job.points() == [(512, 0, 1000), (0, 128, 1000), (512, 0, 4000), (0, 128, 4000)]
    assert job.to_argv(Path("/b/llama-bench"), Path("m.gguf")) == [
        "/b/llama-bench",
        "-m",
        "m.gguf",
        "-p",
        "512",
        "-n",
        "128",
        "-d",
        "1000,4000",
        "-r",
        "5",
        "-ncmoe",
        "12",
        "-t",
        "8",
        "--poll",
        "0",
        "-o",
        "jsonl",
        "-oe",
        "md",
        "--progress",
    ]
    assert config.environment() == (("GGML_OP_OFFLOAD_MIN_BATCH", "64"),)  # an environment option is no argument
    assert BenchJob(config, 0, 128, (0,), 1).points() == [(0, 128, 0)]


@pytest.mark.parametrize(
    "arg, hint",
    [
        ("-t", "--threads"),
        ("--n_prompt", "--pp"),
        ("-ncmoe", "--ncmoe"),
        ("-o", "JSONL"),
        ("-lm", "--load-mode"),
        ("-b", "--batch"),
        ("--no-host", "--no-host"),
        ("--repack", "--repack"),
    ],
)
def test_extra_args_that_collide_with_xover_are_refused(arg: str, hint: str) -> None:
    with pytest.raises(XoverError, match=hint):
        bench.check_extra_args(["-ngl", "99", arg, "4"])


def test_harmless_extra_args_pass() -> None:
    bench.check_extra_args(["-ngl", "99", "-ot", "exps=CPU", "-ctk", "q8_0"])


# ---- options and planning -------------------------------------------------------------------------


def test_option_parsing_says_what_to_change() -> None:
    assert options.int_list("--ncmoe", "12,18,12") == (12, 18)
    with pytest.raises(XoverError, match=r"--ncmoe '12,x' is not a comma-separated list of integers"):
        options.int_list("--ncmoe", "12,x")
    with pytest.raises(XoverError, match="at least 1"):
        options.int_list("--threads", "0", minimum=1)
    assert options.parse_env(["GGML_OP_OFFLOAD_MIN_BATCH=32,4096"]) == (("GGML_OP_OFFLOAD_MIN_BATCH", ("32", "4096")),)
    with pytest.raises(XoverError, match="NAME=VALUE"):
        options.parse_env(["GGML_OP_OFFLOAD_MIN_BATCH"])
    with pytest.raises(XoverError, match="'yes' is not one of on, off, auto"):
        options.choice_list("--flash-attn", "on,yes", opts.FLASH_ATTN.choices)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: benchrun.BenchTests(model=Path("m.gguf"), depths=()), "--depth"),
        (lambda: benchrun.BenchTests(model=Path("m.gguf"), depths=(0,), n_prompt=0, n_gen=0), "not both 0"),
        (lambda: options.table_values({"no_op_offload": ("2",)}), "--no-op-offload"),
        (lambda: benchrun.BenchTests(model=Path("m.gguf"), depths=(0,), repetitions=0), "-r"),
        (lambda: benchrun.sweep_configs([], bench_args=("-d", "5")), "--depth"),
        (lambda: options.parse_env(["A=1", "A=2"]), "twice"),
    ],
)
def test_spec_validation(make, message: str) -> None:
    with pytest.raises(XoverError, match=message):
        make()


def test_expand_is_the_cartesian_product_with_short_labels() -> None:
    configs = benchrun.sweep_configs(
        [(opts.N_CPU_MOE, ("12", "18")), (opts.THREADS, ("8",))], env=(("GGML_OP_OFFLOAD_MIN_BATCH", ("32", "4096")),)
    )
    assert [c.label for c in configs] == [
        "ncmoe=12 GGML_OP_OFFLOAD_MIN_BATCH=32",
        "ncmoe=12 GGML_OP_OFFLOAD_MIN_BATCH=4096",
        "ncmoe=18 GGML_OP_OFFLOAD_MIN_BATCH=32",
        "ncmoe=18 GGML_OP_OFFLOAD_MIN_BATCH=4096",
    ]
    assert configs[0].bench_argv() == ("-ncmoe", "12", "-t", "8")
    assert configs[0].environment() == (("GGML_OP_OFFLOAD_MIN_BATCH", "32"),)
    assert len({c.key for c in configs}) == 4
    assert [c.label for c in benchrun.sweep_configs([])] == ["default"]


def test_plan_skips_measured_configs_and_reruns_only_missing_depths() -> None:
    spec = benchrun.BenchTests(model=Path("m.gguf"), depths=(1000, 4000, 16000), n_prompt=512, n_gen=128)
    c12, c18, c24 = benchrun.sweep_configs([(opts.N_CPU_MOE, ("12", "18", "24"))])
    done = {(c12.key, p) for p in BenchJob(c12, 512, 128, (1000, 4000, 16000), 5).points()} | {
        (c18.key, (512, 0, 1000)),
        (c18.key, (0, 128, 1000)),
        (c18.key, (512, 0, 4000)),
    }
    plan = benchrun.plan(spec, [c12, c18, c24], lambda c, p: (c.key, p) in done)
    assert plan.skipped == (c12,)
    j18_tg, j18, j24 = plan.jobs
    # d4000 lacks only its tg test: a job without -p, so pp512 @ d4000 is not measured twice
    assert (j18_tg.config, j18_tg.depths, j18_tg.n_prompt, j18_tg.n_gen) == (c18, (4000,), 0, 128)
    assert (j18.config, j18.depths, j18.n_prompt, j18.n_gen) == (c18, (16000,), 512, 128)
    assert (j24.depths, j24.repetitions) == ((1000, 4000, 16000), 5)
    assert plan.total_tests == 3 + 6
    planned = [(j.config.key, p) for j in plan.jobs for p in j.points()]
    assert len(planned) == len(set(planned)) and not set(planned) & done
    # only decode missing: the prefill tests are left out of the rerun
    only_tg = benchrun.plan(spec, [c18], lambda c, p: p[1] == 0)
    assert (only_tg.jobs[0].n_prompt, only_tg.jobs[0].n_gen) == (0, 128)


def _exited(code: int | None, tail: str = "", timed_out: bool = False) -> Exited:
    return Exited(returncode=code, timed_out=timed_out, duration_ns=1, stderr_tail=tail, markdown="")


def test_exit_problems_name_the_cause() -> None:
    assert benchrun.exit_problem(_exited(0), 4, 4, None) is None
    assert benchrun.exit_problem(_exited(1, BAD_ARG_STDERR), 0, 4, None) == (
        "llama-bench exited with code 1 after 0 of 4 tests: error: invalid parameter for argument: --bogus"
    )
    assert benchrun.exit_problem(_exited(1, GOMP_STDERR), 0, 2, None) == (
        "llama-bench exited with code 1 after 0 of 2 tests: libgomp: Thread creation failed: Resource temporarily unavailable"
    )
    assert "failed to load model" in (benchrun.exit_problem(_exited(1, NO_MODEL_STDERR), 0, 2, None) or "")
    assert benchrun.exit_problem(_exited(-9), 1, 4, None) == (
        "llama-bench was killed by SIGKILL after 1 of 4 tests (a signal xover did not send: an interrupted measurement)"
    )  # issue 69: retried once in a fresh process, and by a resume
    # xover's Ctrl-C never reaches llama-bench (a session of its own): a SIGINT there came from elsewhere too
    assert "SIGINT after 1 of 4 tests (a signal xover did not send" in benchrun.exit_problem(_exited(-2), 1, 4, None)
    assert benchrun.exit_problem(_exited(-15, timed_out=True), 2, 4, 30.0) == (
        "timed out after 2 of 4 tests (--timeout 30 s; raise it for long depths)"
    )
    assert benchrun.exit_problem(_exited(0), 3, 4, None) == "llama-bench exited normally after 3 of 4 tests"


# ---- the runner, on a stand-in process ------------------------------------------------------------


# ---- new knobs, -v and peak memory ----------------------------------------------------------------


def test_load_mode_and_batch_sweep_like_the_other_knobs() -> None:
    sweeps = options.table_values(
        {"n_cpu_moe": ("18",), "load_mode": ("none,mmap",), "batch_size": ("4096",), "ubatch_size": ("512", "2048")}
    )
    configs = benchrun.sweep_configs(sweeps)
    assert [c.label for c in configs] == ["lm=none ub=512", "lm=none ub=2048", "lm=mmap ub=512", "lm=mmap ub=2048"]
    assert configs[1].bench_argv() == ("-ncmoe", "18", "-lm", "none", "-ub", "2048", "-b", "4096")
    with pytest.raises(XoverError, match="--load-mode: load-mode must be one of auto, none, mmap"):
        options.table_values({"load_mode": ("pinned",)})
    with pytest.raises(XoverError, match="--batch"):
        options.table_values({"batch_size": ("0",)})
    # a record that reports another batch size than the configuration asked for is refused
    record = bench.parse_record(PP_D256)
    assert record is not None
    assert bench.record_mismatch(LlamaConfig("b", (("batch-size", "2048"),)), record) is None
    assert "n_batch=2048" in (bench.record_mismatch(LlamaConfig("b", (("batch-size", "512"),)), record) or "")


def test_sweeps_run_llama_bench_verbose_to_read_its_buffers() -> None:
    spec = benchrun.BenchTests(model=Path("m.gguf"), depths=(0,))
    (job,) = benchrun.plan(spec, benchrun.sweep_configs([(opts.N_CPU_MOE, ("12",))]), lambda c, p: False).jobs
    assert job.verbose and job.to_argv(Path("b"), Path("m"))[-6:] == ["-v", "-o", "jsonl", "-oe", "md", "--progress"]
    assert "-v" not in BenchJob(job.config, 1, 1, (0,), 1).to_argv(Path("b"), Path("m"))
    # a verbose log line is not mistaken for the error that ended the process
    assert benchrun.exit_problem(_exited(1, "set_abort_callback: call\nfailed to create context"), 0, 2, None) == (
        "llama-bench exited with code 1 after 0 of 2 tests: failed to create context"
    )


def test_buffer_sizes_keep_the_peak_of_each_device_and_kind() -> None:
    from xover.llamacpp import memory

    buffers = memory.parse_buffer_lines(VERBOSE_STDERR.splitlines())
    mib = 1 << 20
    assert buffers == (
        ("CPU", "model", round(1.26 * mib)),
        ("CPU_REPACK", "model", round(3.2 * mib)),
        ("CPU", "output", 0),
        ("CPU", "KV", round(1.5 * mib)),
        ("CPU", "compute", round(5.76 * mib)),
        ("CUDA0", "compute", round(342.01 * mib)),
        ("CUDA0", "model", 9216 * mib),
    )
    use = memory.MemoryUse(123 * mib, buffers)
    assert use.device_bytes == round((342.01 + 9216) * mib)
    assert use.host_buffer_bytes == round((1.26 + 3.2 + 1.5 + 5.76) * mib)
    assert memory.MemoryUse.from_dict(use.to_dict()) == use
    assert (
        memory.is_host_device("CUDA_Host")
        and memory.is_host_device("CPU_Mapped")
        and not memory.is_host_device("ROCm0")
    )
    assert memory.parse_vmhwm("Name:\tllama-bench\nVmPeak:\t  9000 kB\nVmHWM:\t    4096 kB\n") == 4 << 20
    assert memory.parse_vmhwm("Name:\tzombie\nState:\tZ (zombie)\n") is None
    assert benchrun.describe_memory(use).startswith(
        "peak RSS 123.0 MiB; buffers: CPU model 1.3 MiB, CPU_REPACK model 3.2 MiB"
    )


def test_an_rpc_workers_buffers_are_kept_under_their_own_name_and_counted_apart() -> None:
    """llama.cpp names a worker's buffers after its buffer type, RPC0[host:port] (seen in llama-bench -v with the
    experts of two layers on a ggml-rpc-server): they are neither this host's memory nor its accelerators'."""
    from xover.llamacpp import memory

    lines = [
        "load_tensors:   CPU_Mapped model buffer size =     3.49 MiB",
        "load_tensors: RPC0[127.0.0.1:50099] model buffer size =     1.95 MiB",
        "llama_kv_cache:        CUDA0 KV buffer size =     0.50 MiB",
    ]
    mib = 1 << 20
    buffers = memory.parse_buffer_lines(lines)
    assert buffers == (
        ("CPU_Mapped", "model", round(3.49 * mib)),
        ("RPC0[127.0.0.1:50099]", "model", round(1.95 * mib)),
        ("CUDA0", "KV", round(0.5 * mib)),
    )
    use = memory.MemoryUse(None, buffers)
    assert (use.device_bytes, use.host_buffer_bytes) == (round(0.5 * mib), round(3.49 * mib))
    assert memory.is_remote_device("RPC0[127.0.0.1:50099]") and not memory.is_host_device("RPC0[127.0.0.1:50099]")


def test_ik_llama_cpp_model_buffers_without_their_kind_count_as_model() -> None:
    """ik_llama.cpp's llama-server logs its model buffers as ``llm_load_tensors: DEV buffer size = X MiB``, at its
    default verbosity (these lines: the H200 study of 2026-12-03, --n-cpu-moe 24 -ub 4096 under 16 GiB); its KV,
    output and compute buffers read as mainline's."""
    from xover.llamacpp import memory

    lines = [
        "llm_load_tensors: ggml ctx size =    0.51 MiB",
        "llm_load_tensors:  CUDA_Host buffer size =  8536.92 MiB",
        "llm_load_tensors:      CUDA0 buffer size =  9154.43 MiB",
        "llama_kv_cache_init:      CUDA0 KV buffer size =  3120.00 MiB",
        "llama_init_from_model: KV self size  = 3120.00 MiB, K (f16): 1560.00 MiB, V (f16): 1560.00 MiB",
        "llama_init_from_model:  CUDA_Host  output buffer size =     0.58 MiB",
        "llama_init_from_model:      CUDA0 compute buffer size =  2438.00 MiB",
        "llama_init_from_model:  CUDA_Host compute buffer size =   292.05 MiB",
    ]
    mib = 1 << 20
    assert memory.parse_buffer_lines(lines) == (
        ("CUDA_Host", "model", round(8536.92 * mib)),
        ("CUDA0", "model", round(9154.43 * mib)),
        ("CUDA0", "KV", 3120 * mib),
        ("CUDA_Host", "output", round(0.58 * mib)),
        ("CUDA0", "compute", 2438 * mib),
        ("CUDA_Host", "compute", round(292.05 * mib)),
    )
