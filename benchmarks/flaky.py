"""How often each real test that drives a search, rounds or a study passes when run again and again.

Those tests take whichever path the timing noise chooses: a value that leads by a little gets a second process, a
round planner chases an open question, a confirmation runs or not. A test that asserts one run's path (an exact
count of processes, a named winner, a tight bound on a timing) passes on a quiet machine and fails on a busy one
(issue 64). This runs the selected tests ``--runs`` times in a row, each run a fresh pytest process, and prints each
test's pass rate and its time per run. ``--busy N`` keeps N cores spinning while they run, as another program on a
2-core machine would: llama.cpp's threads then wait on each other and every choice made from timings can go the
other way.

Target: every test passes every time, idle and with one core busy.

python benchmarks/flaky.py                          # 5 runs of the default selection, machine otherwise idle
python benchmarks/flaky.py --runs 3 --busy 1        # 3 runs with one core kept busy
python benchmarks/flaky.py tests/real/test_advise_real.py -k advise_searches --runs 10
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

DEFAULT_TESTS = (
    "tests/real/test_advise_real.py",
    "tests/real/test_tune_real.py",
    "tests/real/test_study_real.py",
    "tests/process/test_rounds_drift.py",
    "tests/process/test_rounds_sessions.py",
    "tests/process/test_cached_turns.py",
    "tests/process/test_decode_variant.py",
)


def _spin() -> None:
    while True:
        pass


@contextlib.contextmanager
def busy(cores: int) -> Iterator[None]:
    """``cores`` processes that each keep one core busy until the block ends."""
    procs = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(cores)]
    for p in procs:
        p.start()
    try:
        yield
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.join()


def outcomes(junit: Path) -> dict[str, tuple[str, float, str]]:
    """test id -> (passed | failed | error | skipped, seconds, the failure's first line) from a JUnit XML file."""
    out: dict[str, tuple[str, float, str]] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        test_id = f"{case.get('classname', '')}::{case.get('name', '')}"
        status, why = "passed", ""
        for kind in ("failure", "error", "skipped"):
            el = case.find(kind)
            if el is not None:
                status = "failed" if kind == "failure" else kind
                text = (el.get("message") or el.text or "").strip()
                why = text.splitlines()[0][:160] if text else ""
                break
        out[test_id] = (status, float(case.get("time", "0")), why)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("tests", nargs="*", default=list(DEFAULT_TESTS), help="test files or ids (default: %(default)s)")
    ap.add_argument("--runs", type=int, default=5, help="fresh pytest processes in a row (default 5)")
    ap.add_argument("--busy", type=int, default=0, metavar="N", help="cores kept spinning meanwhile (default 0)")
    ap.add_argument("-k", dest="keyword", help="pytest's -k, to select tests within the files")
    args = ap.parse_args()
    if args.runs < 1 or args.busy < 0:
        raise SystemExit("flaky.py: --runs must be at least 1 and --busy at least 0")
    results: dict[str, list[tuple[str, float, str]]] = {}
    with tempfile.TemporaryDirectory() as tmp, busy(args.busy):
        for run in range(1, args.runs + 1):
            junit = Path(tmp) / f"run{run}.xml"
            cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", *args.tests]
            if args.keyword:
                cmd += ["-k", args.keyword]
            start = time.perf_counter()
            proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
            took = time.perf_counter() - start
            if not junit.exists():
                raise SystemExit(f"flaky.py: pytest wrote no results (exit {proc.returncode}): {proc.stderr[-300:]}")
            got = outcomes(junit)
            for test_id, outcome in got.items():
                results.setdefault(test_id, []).append(outcome)
            failed = sum(1 for s, _, _ in got.values() if s in ("failed", "error"))
            print(f"run {run}/{args.runs}: {len(got)} tests, {failed} failed, {took:.0f} s", flush=True)
    print(f"\n{args.runs} runs, {args.busy} core(s) kept busy, {multiprocessing.cpu_count()} cores")
    print(f"{'passed':>8}  {'s/run (min-median-max)':>22}  test")
    flaky = 0
    for test_id, runs in results.items():
        ran = [r for r in runs if r[0] != "skipped"]
        if not ran:
            print(f"{'skipped':>8}  {'':>22}  {test_id}")
            continue
        passed = sum(1 for s, _, _ in ran if s == "passed")
        times = [t for _, t, _ in ran]
        spread = f"{min(times):.1f}-{statistics.median(times):.1f}-{max(times):.1f}"
        print(f"{passed:>3}/{len(ran):<4}  {spread:>22}  {test_id}")
        for status, _, why in ran:
            if status != "passed":
                print(f"{'':>34}{status}: {why}")
        flaky += passed != len(ran)
    verdict = "every test passed every run" if not flaky else f"{flaky} test(s) failed at least once"
    print(f"\n{verdict}")
    sys.exit(1 if flaky else 0)


if __name__ == "__main__":
    main()
