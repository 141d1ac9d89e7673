"""How often does xover name a winner that is not there? The real CPU build, tiny-moe, and a knob that cannot act:
`-b 4096` (one sequence with a 512-token ubatch runs the same batches whatever the logical batch), against
llama.cpp's defaults. Each trial is a fresh study in its own directory: the tuning stage searches -b 4096 for the
defaults (a "kept" is a false keep), and the cold TTFT verdict compares the two configurations measured in rounds
(a "faster" at any length is a false winner). Prints each trial and the totals, and the study times.

    .venv/bin/python benchmarks/false_winners.py [--trials 10] [--keep DIR]

Goal (issue 30): at most 1 false "faster" or "kept" in 10 trials on 2 idle cores.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from xover.analysis.crossover import compare_pair
from xover.domain.config import LlamaConfig
from xover.domain.study_spec import StudySpec
from xover.llamacpp.binaries import resolve
from xover.measure.study import run_study
from xover.results.read_model import crossover_inputs, load

LENGTHS = (512, 1024, 2048)
RESPONSE = 64


def spec() -> StudySpec:
    return StudySpec(
        configs=(LlamaConfig("defaults"), LlamaConfig("b=4096", (("batch-size", "4096"),))),
        model_preset="tiny-moe",
        lengths=LENGTHS,
        response_tokens=(RESPONSE,),
        repetitions=1,
        rounds=3,
        max_rounds=6,
        bench_depths=(0,),
        skip=frozenset({"bench", "cache", "session"}),
        tune_knobs=("batch-size",),
        tune_values=(("batch-size", ("4096",)),),
        tune_depths=(),
    )


def trial(out: Path) -> tuple[int, bool, float, str]:
    """One fresh study: (lengths named faster, whether the defaults' tuning kept -b 4096, seconds, its verdicts)."""
    t0 = time.perf_counter()
    outcome = run_study(spec(), out, resolve(), fresh=True)
    seconds = time.perf_counter() - t0
    data = load(out)
    configs = {c.label: c for c in crossover_inputs(data)}
    pair = compare_pair(configs["defaults"], configs["b=4096"], RESPONSE, n_boot=0)
    kept = any(t.config.name == "defaults" and t.changed for t in outcome.tuned)
    told = ", ".join(
        f"{L}: {i.describe('defaults', 'b=4096') if i else 'no rounds'}" for L, i in zip(pair.lengths, pair.intervals)
    )
    return sum(1 for s in pair.separated if s != 0), kept, seconds, told


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--keep", type=Path, default=None, help="write the studies under this folder and keep them")
    args = ap.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="xover-false-"))
    false_faster = false_kept = 0
    times = []
    for i in range(args.trials):
        named, kept, seconds, told = trial(root / f"trial-{i + 1}")
        false_faster += named > 0
        false_kept += kept
        times.append(seconds)
        print(f"trial {i + 1}: {seconds:.0f} s; tuning kept -b 4096: {'yes' if kept else 'no'}; {told}", flush=True)
    print(
        f"\n{args.trials} trials: a false 'faster' in {false_faster}, a false 'kept' in {false_kept} "
        f"(goal: at most 1 of either in 10); study time {min(times):.0f}-{max(times):.0f} s, "
        f"median {sorted(times)[len(times) // 2]:.0f} s"
    )


if __name__ == "__main__":
    main()
