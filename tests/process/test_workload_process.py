"""The tests of tests/unit/test_workload.py that start a process (a subprocess, xover's CLI or a fake llama.cpp binary):
tests/unit starts none (its conftest.py refuses)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

from xover.domain.workload import WorkloadSpec, dumps, generate


def _text(spec: WorkloadSpec) -> str:
    return dumps(generate(spec))


def test_bytes_do_not_depend_on_the_interpreter_hash_seed() -> None:
    """Sets or hash-ordered containers would make the file differ between processes."""
    code = (
        "import hashlib, sys; from xover.domain.workload import WorkloadSpec, dumps, generate; "
        "sys.stdout.write(hashlib.sha256(dumps(generate(WorkloadSpec(seed=3, turns=6, system_tokens=1024, "
        "target_tokens=4096, rewrite_every=2))).encode()).hexdigest())"
    )
    digests = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        ).stdout
        for seed in ("1", "2")
    }
    here = hashlib.sha256(
        _text(WorkloadSpec(seed=3, turns=6, system_tokens=1024, target_tokens=4096, rewrite_every=2)).encode()
    ).hexdigest()
    assert digests == {here}
