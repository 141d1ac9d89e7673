"""Synthesize a preset and print the write speed (GB/s) and the peak resident memory.

python benchmarks/synth_throughput.py                      # qwen3-30b-a3b into a temp dir, deleted after
python benchmarks/synth_throughput.py --preset tiny-moe -o /tmp/tiny.gguf --keep
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from xover.domain.presets import PRESETS, preset
from xover.gguf.synth import write_model


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def _progress_printer(every: int) -> Callable[[int, int], None]:
    next_mark = every

    def progress(done: int, total: int) -> None:
        nonlocal next_mark
        if done >= next_mark or done == total:
            print(f"  {done / 1e9:6.2f} / {total / 1e9:.2f} GB", file=sys.stderr, flush=True)
            next_mark = done + every

    return progress


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="qwen3-30b-a3b", choices=sorted(PRESETS))
    parser.add_argument("-o", "--output", type=Path, help="GGUF path (default: a temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep the file (default: delete it after measuring)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="xover-synth-") as tmp:
        path = args.output or Path(tmp) / f"{args.preset}.gguf"
        result = write_model(preset(args.preset), path, seed=args.seed, progress=_progress_printer(2 * 10**9))
        try:
            print(f"preset      {args.preset}")
            print(f"file        {result.path} ({result.bytes / 1e9:.3f} GB, {result.tensors} tensors)")
            print(f"time        {result.seconds:.2f} s (incl. fsync)")
            print(f"speed       {result.bytes / 1e9 / result.seconds:.2f} GB/s")
            print(f"peak RSS    {_peak_rss_bytes() / 2**20:.0f} MiB")
        finally:
            if not args.keep:
                result.path.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
