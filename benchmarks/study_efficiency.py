"""How much of a study's wall time is measurement? Runs a study (the embedded default unless a spec
is given) into a fresh directory and prints, per stage, wall time against the time the binaries
were computing.

* TTFT: per server, wall time minus model load (until /health answered) against the sum of the
  measured requests' durations (send to final event). The target is a ratio of at most 1.2.
* llama-bench: wall time against the sum of its timed repetitions (samples_ns). llama-bench also
  runs untimed work (a warm-up run per test, the depth prefill before each test), so this ratio is
  an upper bound on xover's own overhead, not a measure of it.

    .venv/bin/python benchmarks/study_efficiency.py [SPEC.toml] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import tempfile
import time
from pathlib import Path

from xover.domain.study_spec import default_spec, load_spec
from xover.llamacpp.binaries import resolve
from xover.measure.study import run_study


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("spec", nargs="?", type=Path)
    ap.add_argument("--keep", type=Path, default=None, help="write the study here and keep it")
    args = ap.parse_args()
    spec = load_spec(args.spec) if args.spec else default_spec()
    out = args.keep or Path(tempfile.mkdtemp(prefix="xover-eff-"))
    t0 = time.perf_counter()
    outcome = run_study(spec, out, resolve(), fresh=True)
    total = time.perf_counter() - t0
    con = sqlite3.connect(out / "results.sqlite")
    bench_ns = sum(sum(json.loads(r[0])) for r in con.execute("SELECT samples_ns FROM bench_results"))
    eff = [json.loads(r[0]) for r in con.execute("SELECT body FROM artifacts WHERE name='ttft-efficiency'")]
    con.close()
    print(
        f"study wall time {total:.1f} s; stages: "
        + ", ".join(f"{k} {v:.1f} s" for k, v in outcome.stage_seconds.items())
    )
    bench_wall = outcome.stage_seconds.get("bench")
    if bench_wall:
        print(
            f"llama-bench: wall {bench_wall:.1f} s / timed repetitions {bench_ns / 1e9:.1f} s = "
            f"{bench_wall / max(bench_ns / 1e9, 1e-9):.2f} (upper bound: includes untimed warm-up and depth prefill)"
        )
    wall = sum(e["wall_s"] - (e["load_s"] or 0) for e in eff)
    busy = sum(e["requests_s"] for e in eff)
    for e in eff:
        print(
            f"  ttft {e['label']}: wall {e['wall_s']:.1f} s, load {e['load_s'] or 0:.1f} s, "
            f"requests {e['requests_s']:.1f} s over {e['samples']} samples"
        )
    if busy:
        print(
            f"TTFT: wall excluding model loads {wall:.1f} s / request time {busy:.1f} s = {wall / busy:.2f} (target <= 1.2)"
        )
    if args.keep is None:
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
