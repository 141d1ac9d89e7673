"""Issue 69: a tuning process killed by a signal xover did not send (SIGKILL from the OOM killer or a stray ``kill``) is
an interrupted measurement, not a result: it is retried once in a fresh process, stored as a failure with its reason
if the retry dies too, told as such by the report, and retried by a resume. Real llama-bench on tiny-moe.

The known point is xover's test hook (``XOVER_TEST_KILL_BENCH``, :data:`xover.measure.bench.KILL_HOOK`): the first
processes of a round (or of the search) whose label matches are killed after their first stored test. The
configuration ``slow`` runs ``-ub 16``: its search tries ``-ub 256``, which prefills several times faster on 1K-token
prompts (64 ubatches against 4), so its recommendation and its confirmation in rounds happen. One thread (``-t 1``): another
program on a core slows it in proportion, where two threads would wait on each other and swing tenfold.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from xover.measure.bench import KILL_HOOK
from xover.results.read_model import load
from xover.results.store import Store

pytestmark = pytest.mark.real

SPEC = """
[model]
path = "{model}"

[study]
lengths = [1024]  # 64 ubatches of 16 against 4 of 256: at 256 tokens the gain was small enough for noise to hide
response-tokens = [8]
repetitions = 1
rounds = 3
max-rounds = 3
skip = ["bench", "ttft", "cache", "session"]
tune-knobs = ["ubatch-size"]
tune-values = {{ ubatch-size = ["256"] }}
tune-repetitions = 2

[[config]]
name = "slow"
ubatch-size = 16
threads = 1
"""

STUDY_TIMEOUT_S = 900  # a hang guard: a 2-core machine with a core busy elsewhere runs many times slower


def _study(spec: Path, out: Path, bins: Path, hook: str | None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, XOVER_LLAMA_BIN_DIR=str(bins))
    env.pop(KILL_HOOK, None)
    if hook is not None:
        env[KILL_HOOK] = hook
    return subprocess.run(
        [sys.executable, "-m", "xover", "study", str(spec), "-o", str(out), "-q"],
        env=env,
        capture_output=True,
        text=True,
        timeout=STUDY_TIMEOUT_S,
    )


def _tune_failures(out: Path) -> list[str]:
    with Store(out / "tune") as store:
        return [f.reason for _, f in store.failures()]


def _retried(out: Path) -> int:
    with Store(out / "tune") as store:
        return len(store.artifacts("llama-bench-retried"))


@pytest.mark.parametrize(
    ("hook", "missing"),
    [
        # the confirmation's first process in round 1 (the defaults' side goes first there), and its retry
        ("1:slow:2", "not confirmed: the confirmation process was interrupted (round 1: llama-bench was killed by "
         "SIGKILL"),
        # the search's trial of -ub 256, and its retry
        ("search:ub=256:2", "failed: llama-bench was killed by SIGKILL"),
    ],
)  # fmt: skip
def test_a_killed_tuning_process_is_retried_told_and_resumed(
    llama_bins, tiny_model: Path, tmp_path: Path, hook: str, missing: str
) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC.format(model=tiny_model))
    out = tmp_path / "out"
    r = _study(spec, out, llama_bins.bin_dir, hook)
    assert r.returncode == 0, r.stderr
    # killed twice: the process and the fresh one that retried it; both interrupted, stored with their reason
    failures = _tune_failures(out)
    assert len(failures) == 1 and "killed by SIGKILL" in failures[0] and "interrupted measurement" in failures[0]
    assert _retried(out) == 1
    # the report of the interrupted run says what is missing and how to get it, and never calls a variant tuned
    report = " ".join((out / "report.md").read_text().split())
    assert missing in report and "run the study again to retry" in report
    (record,) = [t for t in load(out).tune_results() if t.config == "slow"]
    assert record.interrupted and record.variant is None  # no variant rests on a confirmation that did not run
    # the resume searches again, reusing what was measured; the killed process runs again and the variant is confirmed
    r = _study(spec, out, llama_bins.bin_dir, None)
    assert r.returncode == 0, r.stderr
    data = load(out)
    (record,) = [t for t in data.tune_results() if t.config == "slow"][-1:]
    assert not record.interrupted and record.variant == "slow tuned" and record.setting_label == "ub=256"
    assert record.confirmation is not None and record.confirmation["kept"]
    report = " ".join((out / "report.md").read_text().split())
    assert "run the study again to retry" not in report


def test_a_process_killed_once_is_retried_in_a_fresh_process_and_nothing_is_lost(
    llama_bins, tiny_model: Path, tmp_path: Path
) -> None:
    """Killed once, its retry measures every test again in a fresh process: no failure, the tuning complete."""
    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC.format(model=tiny_model))
    out = tmp_path / "out"
    r = _study(spec, out, llama_bins.bin_dir, "1:slow:1")
    assert r.returncode == 0, r.stderr
    assert _tune_failures(out) == [] and _retried(out) == 1
    (record,) = [t for t in load(out).tune_results() if t.config == "slow"]
    assert not record.interrupted and record.variant == "slow tuned"
