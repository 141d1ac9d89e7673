"""Rebuild this study's tuning result from its stored llama-bench processes, without a GPU (run once, 2026-12-02).

The lease that finished this study resumed its tuning stage from the first lease's processes, and xover then read
the latest stored record of each test whatever its round (fixed in 495d98e): its decode confirmation showed one
process for all three rounds of the defaults, and the search read a round's record for the defaults. Every process
the tuning needs is stored, so the stage is run again here on a copy of the store, from which the wrong tuning
result is removed; it measures nothing (llama-bench is /bin/false, so any test it lacked would fail loudly).

The model file only has to give the same model key (size and the hash of its first 64 MiB) and the same tensors: a
sparse file with the synthetic model's header and first tensors' bytes, written as ``xover synth`` writes them.

    PYTHONPATH=src python studies/h200-gpt-oss-decode/retune.py STUDY_DIR
"""

from __future__ import annotations

import sqlite3
import sys
import tempfile
from pathlib import Path

from xover.domain.presets import ALL_PRESETS
from xover.domain.shapes import tensor_infos, type_sizes
from xover.domain.study_spec import load_spec
from xover.gguf import synth
from xover.llamacpp.binaries import Binaries
from xover.measure import tune
from xover.measure.provenance import model_id

HEAD = 80 << 20  # more than the 64 MiB the model key hashes


def sparse_model(preset: str, path: Path) -> None:
    shape = ALL_PRESETS[preset]
    tensors = tensor_infos(shape)
    synth._write_header(path, shape, tensors, preset, 0)
    pools = synth._Pools(0)
    with path.open("ab") as f:
        f.write(bytes(synth._pad(f.tell())))
        end = f.tell()
        for i, t in enumerate(tensors):
            if f.tell() < HEAD:
                pool = pools.get(t.ggml_type, synth.pool_kind(t.name, t.ggml_type))
                block = type_sizes(t.ggml_type)[1]
                start = (i * 7919) % (len(pool) // block) * block
                synth._write_run(f, pool, start, t.nbytes, lambda n: None)
                f.write(bytes(synth._pad(t.nbytes)))
                end = f.tell()
            else:
                end += t.nbytes + synth._pad(t.nbytes)
        f.truncate(end)


def main(study: Path) -> None:
    spec = load_spec(Path(__file__).with_name("study.toml"))
    db = sqlite3.connect(study / "results.sqlite")
    with db:
        db.execute("DELETE FROM artifacts WHERE name = 'tune'")
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    db.close()
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "gpt-oss-120b.gguf"
        sparse_model("gpt-oss-120b", model)
        print("model key", model_id(model).key)
        fake = Binaries(Path("/bin/false"), Path("/bin/false"), "retune")

        def emit(kind: str, text: str, *_: object) -> None:
            print(f"tune: {kind}: {text}")

        tune.run_tune(spec, model, fake, study, ["retune.py"], False, emit, None)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
