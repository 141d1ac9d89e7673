"""What `xover advise` with its defaults costs a user on the tiny model: wall time, llama-bench and llama-server
processes, and its recommendation (issue 68: it ran past 25 minutes on 2 cores, its budget bounding one measurement
rather than the run).

Runs `xover advise -m tiny-moe.gguf --ncmoe 0` (plus any arguments after ``--``) as a user would, from this
checkout's ``src`` or another's (``--src``, e.g. a worktree of an older commit: "before"), stopping it after
``--limit`` seconds if it has not ended, and reads the processes back from its store.

python benchmarks/advise_wall.py                             # this checkout, the default budget
python benchmarks/advise_wall.py -- --budget 30m             # a larger budget: it measures more
python benchmarks/advise_wall.py --src /tmp/old/src --limit 600
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from xover.domain.presets import PRESETS
from xover.gguf.synth import write_model
from xover.results.store import Store

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--src", type=Path, default=ROOT / "src", help="the xover sources to run (default: this checkout)")
    ap.add_argument("--limit", type=float, default=1800.0, help="seconds before the run is stopped (default 1800)")
    ap.add_argument("extra", nargs="*", help="more `xover advise` arguments, after --")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = write_model(PRESETS["tiny-moe"], Path(tmp) / "tiny-moe.gguf", seed=0).path
        out = Path(tmp) / "advise"
        cmd = [sys.executable, "-m", "xover", "advise", "-m", str(model), "--ncmoe", "0", "-o", str(out), *args.extra]
        env = {**os.environ, "PYTHONPATH": str(args.src.resolve())}
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            text, _ = proc.communicate(timeout=args.limit)
            ended = f"exit {proc.returncode}"
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)  # as Ctrl-C: completed results are kept
            text, _ = proc.communicate()
            ended = f"stopped after {args.limit / 60:.0f} min"
        wall = time.perf_counter() - start
        with Store(out) as store:
            runs = store.runs()
        bench = sum(1 for r in runs if r["kind"] == "bench")
        servers = len(list((out / "logs").glob("server-*.log"))) if (out / "logs").is_dir() else 0
    flat = " ".join(text.split())
    plan = re.search(r"(plan: .*? of the --budget [\d.]+ min(?:; (?:left out )?to fit it: [^|]*?)?) (?=\s*1/)", flat)
    rec = re.search(r"Recommendation: (.*?)(?: ```|$)", flat)
    print(f"src {args.src}; xover advise -m tiny-moe.gguf --ncmoe 0 {' '.join(args.extra)}".rstrip())
    print(f"  {ended}: {wall / 60:.1f} min wall, {bench} llama-bench processes, {servers} llama-server processes")
    if plan:
        print(f"  {plan.group(1)}")
    print(f"  {'recommendation: ' + rec.group(1) if rec else 'no recommendation printed'}")


if __name__ == "__main__":
    main()
