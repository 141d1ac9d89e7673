"""Every `xover ...` command of the README runs as written, on the tiny model (issue 18, item 6).

The commands come from the README's code blocks and its command table (``tests/readme_commands.py``:
how they are extracted; a synopsis's ``[optional]`` groups are all included, so every flag the README
shows is used, and each ``a|b`` alternative runs as its own command). They run in README order, as a
user would type them (``python -m xover ...``, each from the same working folder ``out``), so ``audit
DIR``, ``report DIR`` and ``export DIR`` read what ``study``, ``bench``, ``ttft``, ``cache``,
``session`` and ``advise`` wrote. A command that exits non-zero fails the test with its stderr; an
unknown flag is named as such.

**What the test substitutes, and nothing else** (:class:`readme_commands.Substitutions`):

* the model (``-m M``, ``M.gguf``) -> tiny-moe synthesized with a 4,096-token training context
  (``xover synth --preset tiny-moe --set n_ctx_train=4096``): session's and advise's default agentic
  workloads scale to the model's training context, so this keeps them at their smallest without
  touching their options (advise then also leaves out the ``-ub 4096`` candidate, half the context);
* the output folder: ``DIR`` / ``-o DIR`` -> ``out/xover-study``, the default ``-o`` of ttft, cache and
  session (every command runs in ``out``, so the default folders of bench and advise,
  ``studies/<command>-<time>``, land there too); ``-o q.gguf`` -> ``out/q.gguf``;
* ``xover study``: ``SPEC.toml`` -> the smallest spec below (two configurations, prompts of 64 and
  128 tokens, one TTFT repetition, a two-turn session); ``--configs N,...`` -> its two names;
  ``--skip STAGE,...`` -> ``tune``, the slowest stage (the knob search, which ``advise`` below runs
  anyway); ``--progress-jsonl F`` -> ``out/progress.jsonl``;
* ``--workload FILE`` -> a workload file of one 256-token turn; ``-- ARGS`` -> ``-- -ngl 99``;
* sizes: prompt lengths and depths (``--lengths``, ``--depth``, ``--length``) / 16 (1k -> 64,
  16k -> 1024, the cache lab's minimum, 32k -> 2048, 32000 -> 2000); ``--turns 30`` -> 2; ``--ncmoe`` scaled from the README's 48-layer
  model to tiny-moe's 4 layers (12 -> 1, 18 -> 2); ``synth --preset qwen3-30b-a3b`` -> ``tiny-moe``
  (18.6 GB otherwise). Repetitions (``-r``) and response tokens (``-R``) stay as written.

**Skipped, with the reason listed** (``test_readme_command_needing_a_gpu``): ``xover llama build
--backend cuda`` (needs the CUDA toolkit and an NVIDIA GPU). ``--hw h200`` runs: it is theory only.

Runtime: 5-10 minutes on 2 cores, most of it ``advise`` (twice, each a knob search at two offload
levels). ``XOVER_README_COMMANDS=inspect,export`` runs only the commands whose text contains one of
those words (to try a README change quickly; CI runs them all).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from readme_commands import Substitutions, Variant, describe, readme_variants, substitute
from xover.llamacpp.binaries import Binaries

pytestmark = pytest.mark.real

VARIANTS = readme_variants()
RUNNABLE = [v for v in VARIANTS if v.skip is None]
NEEDS_GPU = [v for v in VARIANTS if v.skip is not None]
N_CTX = 4096
COMMAND_TIMEOUT_S = 900

SPEC = """\
# The smallest study the README's `xover study SPEC.toml ...` line runs on (tests/real/test_readme_commands.py).
[model]
path = "{model}"

[study]
lengths = [64, 128]
response-tokens = [16]
repetitions = 1
bench-repetitions = 2
pp = 64
tg = 16
cache-length = 128
session-turns = 2
session-system-tokens = 256
session-target-tokens = 700
session-response-tokens = 8
tune-repetitions = 2

[[config]]
name = "t1"
threads = 1

[[config]]
name = "t2"
threads = 2
"""


@pytest.fixture(scope="module")
def setting(tmp_path_factory: pytest.TempPathFactory) -> Substitutions:
    from xover.domain.presets import make_shape
    from xover.gguf.synth import write_model

    base = tmp_path_factory.mktemp("readme")
    out = base / "out"
    out.mkdir()
    shape = make_shape("tiny-moe", n_ctx_train=N_CTX)
    model = write_model(shape, base / "tiny-moe-4k.gguf").path
    spec = base / "smallest.toml"
    spec.write_text(SPEC.format(model=model))
    workload = base / "workload.txt"
    workload.write_text("# prompt tokens, response tokens\n256,16\n")
    return Substitutions(
        model=model, out=out, spec=spec, spec_configs="t1,t2", workload=workload, n_layer=shape.n_layer
    )


def _run(argv: list[str], cwd: Path, bins: Binaries) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "XOVER_LLAMA_BIN_DIR": str(bins.bin_dir)}
    return subprocess.run(
        [sys.executable, "-m", "xover", *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
    )


def test_every_readme_command_runs_as_written(setting: Substitutions, llama_bins: Binaries) -> None:
    assert RUNNABLE, "no xover command found in README.md"
    only = [w for w in os.environ.get("XOVER_README_COMMANDS", "").split(",") if w]
    chosen = [v for v in RUNNABLE if not only or any(w in v.command.text for w in only)]
    failures: list[str] = []
    timings: list[str] = []
    for variant in chosen:
        argv = substitute(variant.argv, setting)
        t0 = time.monotonic()
        r = _run(argv, setting.out, llama_bins)
        timings.append(f"{time.monotonic() - t0:6.1f} s  xover {' '.join(variant.argv)}")
        if r.returncode != 0:
            tail = "\n".join(r.stderr.strip().splitlines()[-6:])
            kind = "an unknown flag: " if "No such option" in r.stderr else ""
            failures.append(f"{describe(variant, argv)}\n  exit {r.returncode}, {kind}{tail}")
    print("\n".join(timings))
    assert not failures, "README commands that do not run as written:\n" + "\n".join(failures)
    if not only:  # what the commands were for is there: the study folder they share, and synth's file
        assert (setting.study_dir / "results.sqlite").is_file() and (setting.study_dir / "report.html").is_file()
        assert (setting.out / "q.gguf").is_file()


@pytest.mark.parametrize("variant", NEEDS_GPU, ids=[v.id for v in NEEDS_GPU])
def test_readme_command_needing_a_gpu(variant: Variant) -> None:
    pytest.skip(f"`xover {' '.join(variant.argv)}` ({variant.command.source}): {variant.skip}")
