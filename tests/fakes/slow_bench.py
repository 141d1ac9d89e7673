"""A llama-bench that reports slow rates: the real llama-bench runs (its processes, records and exit are real), and each
JSONL record it prints has its rates replaced by known slow ones before xover reads it. For known-answer tests of the
plan that prices a search from the rates it measured (issue 68): a machine where an agentic prompt takes minutes,
measured in seconds.

    slow_bench.py REAL_LLAMA_BENCH ARGS...

Prefill runs at :data:`PREFILL_TPS` and decode at :data:`DECODE_TPS` at depth 0, both slowing with depth as
attention reads more (``rate / (1 + depth / HALF_AT)``); every sample equal (no spread).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

PREFILL_TPS = 40.0
DECODE_TPS = 4.0
HALF_AT = 8192  # the depth at which a rate halves


def slow(record: dict[str, object]) -> dict[str, object]:
    n_prompt, n_gen, depth = (int(record.get(k, 0) or 0) for k in ("n_prompt", "n_gen", "n_depth"))  # type: ignore[call-overload]
    rate = (PREFILL_TPS if n_prompt else DECODE_TPS) / (1 + depth / HALF_AT)
    tokens = n_prompt or n_gen
    reps = len(record.get("samples_ts") or [0])  # type: ignore[arg-type]
    ns = round(tokens / rate * 1e9)
    return {**record, "avg_ts": rate, "stddev_ts": 0.0, "samples_ts": [rate] * reps, "avg_ns": ns, "stddev_ns": 0,
            "samples_ns": [ns] * reps}  # fmt: skip


def main(argv: list[str]) -> int:
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, bufsize=1)
    assert proc.stdout is not None
    for line in proc.stdout:
        text = line.strip()
        if text.startswith("{") and text.endswith("}"):
            try:
                line = json.dumps(slow(json.loads(text))) + "\n"
            except json.JSONDecodeError:
                pass
        sys.stdout.write(line)
        sys.stdout.flush()
    return proc.wait()


def write_bin_dir(folder: Path, real: Path) -> Path:
    """A ``--llama-bin-dir`` whose llama-bench is this slow one around ``real``'s, everything else ``real``'s own."""
    folder.mkdir(parents=True, exist_ok=True)
    for f in real.iterdir():
        if f.name != "llama-bench":
            (folder / f.name).symlink_to(f)
    shim = folder / "llama-bench"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{Path(__file__).resolve()}" "{real / "llama-bench"}" "$@"\n')
    shim.chmod(0o755)
    return folder


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
