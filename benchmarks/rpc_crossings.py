"""What does one crossing to an RPC worker cost a decoded token, against the probed round trip?

The link theory (``xover.analysis.rpclink``) counts one round trip per layer whose experts are on a worker. This
measures the real price: llama-bench decode (tg) with the experts of 0, 1, ..., all layers of a model on one local
``ggml-rpc-server`` (``-ot ...=RPC0[host:port]``, every other tensor here, ``-ngl 0``), one thread here and one on
the worker, so no two busy-waiting thread pools share a core. Decode time per token against the number of layers
whose experts are away is close to a line; its slope is the cost of one crossing (the request, the worker's
MUL_MAT_ID on one token, the reply, and whatever the RPC backend sends besides), printed beside the link probe's
round trip through the same protocol. Every crossing above the probed round trip is time the theory's lower bound
leaves out.

Where that time goes, by llama.cpp's source (ggml-rpc.cpp): every command of the RPC backend is queued to a
dispatcher thread per worker (a mutex, a condition variable and a promise), so a crossing that waits for its
reply costs two thread hand-offs on top of the round trip the probe (a plain socket) measures. Seen on a 2-core
machine (2026-12-01, tiny-moe): about 1.07 ms a crossing against a 74 us round trip, 14x; there three runnable
threads (llama-bench's, its dispatcher, the worker's) share two cores, so a hand-off can wait for a scheduler
tick. Run it on the machine you mean to answer for.

    .venv/bin/python benchmarks/rpc_crossings.py                    # tiny-moe, synthesized on the fly
    .venv/bin/python benchmarks/rpc_crossings.py -m model.gguf -r 5 --tg 64
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import numpy as np

from xover.domain.config import LlamaConfig
from xover.llamacpp import bench, rpc, rpclink
from xover.llamacpp.binaries import resolve


def tg_samples(binary: Path, model: Path, settings: tuple[tuple[str, str], ...], n_gen: int, reps: int) -> list[float]:
    """llama-bench's decode samples (t/s) of one configuration (option name -> value), through xover's own runner."""
    job = bench.BenchJob(LlamaConfig("probe", settings), 0, n_gen, (0,), reps)
    samples: list[float] = []
    exited = None
    for ev in bench.run(job, binary, model, timeout_s=300):
        if isinstance(ev, bench.RecordLine):
            samples += [float(x) for x in ev.record["samples_ts"]]
        elif isinstance(ev, bench.Exited):
            exited = ev
    if not samples:
        raise SystemExit(f"llama-bench gave no result for {settings}: {exited.stderr_tail if exited else '?'}")
    return samples


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-m", "--model", type=Path, help="a MoE GGUF (default: tiny-moe, synthesized)")
    ap.add_argument("-r", "--repetitions", type=int, default=5)
    ap.add_argument("--tg", type=int, default=32, help="tokens decoded per repetition")
    args = ap.parse_args()
    binaries = resolve(None)
    if binaries.rpc_server is None:
        raise SystemExit("no ggml-rpc-server in xover's build: run `xover llama build`")
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            from xover.domain.presets import PRESETS
            from xover.gguf.synth import write_model

            model = Path(tmp) / "tiny-moe.gguf"
            write_model(PRESETS["tiny-moe"], model, seed=0)
        from xover.gguf.inspect import model_table

        n_layer = model_table(str(model))[0].hparams.n_layer
        (port,) = rpc.free_ports(1)
        with rpc.running([rpc.WorkerSpec(port=port, threads=1)], binaries.rpc_server, Path(tmp)) as (worker,):
            link = rpclink.probe(worker.endpoint)
            rtt_ms = statistics.median(link.rtt_ms)
            ms_per_token: list[float] = []
            print(f"{model.name}: {n_layer} layers; worker {worker.endpoint}, probed round trip {rtt_ms:.3f} ms")
            print("layers with experts on the worker | decode t/s (median [min-max]) | ms per token")
            for k in range(n_layer + 1):
                settings: tuple[tuple[str, str], ...] = (
                    ("rpc", worker.endpoint),
                    ("n-gpu-layers", "0"),
                    ("threads", "1"),
                )
                if k:
                    layers = "|".join(str(i) for i in range(k))
                    settings += (("override-tensor", f"blk\\.({layers})\\.ffn_.*_exps=RPC0[{worker.endpoint}]"),)
                s = tg_samples(binaries.bench, model, settings, args.tg, args.repetitions)
                med = statistics.median(s)
                ms_per_token.append(1000.0 / med)
                print(f"{k:>33} | {med:,.1f} [{min(s):,.1f}-{max(s):,.1f}] | {1000.0 / med:.3f}")
    slope, intercept = np.polyfit(np.arange(n_layer + 1), np.asarray(ms_per_token), 1)
    print(
        f"one crossing costs {slope * 1000:.0f} us a token (least squares over {n_layer + 1} points; intercept "
        f"{intercept:.3f} ms), {slope / rtt_ms:.1f}x the probed round trip of {rtt_ms * 1000:.0f} us"
    )


if __name__ == "__main__":
    main()
