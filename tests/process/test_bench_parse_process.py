"""The tests of tests/unit/test_bench_parse.py that start a process (a subprocess, xover's CLI or a fake llama.cpp binary):
tests/unit starts none (its conftest.py refuses)."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

from fakes.known import VERBOSE_STDERR
from xover.domain.config import LlamaConfig
from xover.llamacpp import bench, process
from xover.llamacpp.bench import BenchJob, Exited, ProgressLine, RecordLine

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


# ---- line parsing ---------------------------------------------------------------------------------


# ---- argv -----------------------------------------------------------------------------------------


# ---- options and planning -------------------------------------------------------------------------


# ---- the runner, on a stand-in process ------------------------------------------------------------


# The timeout runs from the stand-in's start: it must outlast a Python start-up (a tenth of a second on an idle machine,
# 10x that on 2 busy cores) before the record, or the record would not come before it.
HANG_TIMEOUT_S = 5.0


def test_runner_streams_records_and_enforces_the_timeout(tmp_path: Path) -> None:
    """A stand-in llama-bench prints a progress line and a record, then hangs: the record arrives
    before the timeout, and the timeout stops the process and reports it."""
    fake = tmp_path / "llama-bench"
    fake.write_text(
        textwrap.dedent(f"""\
        #!{sys.executable}
        import sys, time
        sys.stderr.write("llama-bench: benchmark 1/2: prompt run 1/1\\n"); sys.stderr.flush()
        sys.stdout.write({PP_D256!r} + "\\n"); sys.stdout.flush()
        sys.stderr.write("error: something hangs\\n"); sys.stderr.flush()
        time.sleep(60)
    """)
    )
    fake.chmod(0o755)
    job = BenchJob(LlamaConfig("t=1", (("threads", "1"),)), 64, 16, (256,), 2)
    events = list(bench.run(job, fake, tmp_path / "m.gguf", timeout_s=HANG_TIMEOUT_S))
    assert events[0] == ProgressLine(1, 2, "prompt", 1, 1)
    assert isinstance(events[1], RecordLine) and events[1].record["n_depth"] == 256
    end = events[-1]
    assert isinstance(end, Exited) and end.timed_out and end.stderr_tail == "error: something hangs"
    assert HANG_TIMEOUT_S * 1e9 <= end.duration_ns < (HANG_TIMEOUT_S + 10) * 1e9  # stopped at once, not left
    assert end.returncode is not None  # reaped, not left running
    assert process.live_pids() == []


# ---- new knobs, -v and peak memory ----------------------------------------------------------------


def test_runner_keeps_buffer_lines_and_the_peak_resident_set(tmp_path: Path) -> None:
    fake = tmp_path / "llama-bench"
    fake.write_text(
        textwrap.dedent(f"""\
        #!{sys.executable}
        import sys
        ballast = bytearray(64 << 20)  # resident: touched below
        for i in range(0, len(ballast), 4096):
            ballast[i] = 1
        sys.stderr.write({VERBOSE_STDERR!r} + "\\n"); sys.stderr.flush()
        sys.stderr.write("llama-bench: benchmark 1/1: prompt run 1/1\\n"); sys.stderr.flush()
        sys.stdout.write({PP_D256!r} + "\\n"); sys.stdout.flush()
    """)
    )
    fake.chmod(0o755)
    job = BenchJob(LlamaConfig("t=1", (("threads", "1"),)), 64, 0, (256,), 1, verbose=True)
    end = list(bench.run(job, fake, tmp_path / "m.gguf", timeout_s=30))[-1]
    assert isinstance(end, Exited) and end.returncode == 0
    assert len(end.buffer_lines) == 10 and "buffer size" not in end.stderr_tail
    assert end.peak_rss_bytes is not None and end.peak_rss_bytes >= 64 << 20
