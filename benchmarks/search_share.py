"""How much of a study does its tuning search cost? Runs fresh studies on this machine's CPU build and prints, per
study, the tuning stage's wall time against the whole study's, the llama-bench processes the search started, and the
settings it recommended per configuration, so that a change to the search can be compared before and after.

Two studies (issue 46 item 8):

* ``default``: the embedded default study (``xover study`` with no spec: tiny-moe, two configurations);
* ``second``: a second shape as a new user would try it, a 6-layer qwen3moe with 24 experts (tiny-moe's widths),
  two configurations (llama.cpp's defaults and ``-t 1``), lengths 512 and 2K.

    .venv/bin/python benchmarks/search_share.py [--only default|second] [--keep DIR]

Goal: the search takes at most half of each study, with the same recommendations.

Measured on 2 cores (2026-12-05): first before and after the search skipped `-b` alone where it runs the same
ubatches; then (2026-12-06) with the prefill test no longer than the study's longest prompt (and no `-ub` no prompt
fills), the configuration's own knobs searched first, a trial that repeats another configuration's command sharing
its process, a recommendation that is another configuration left to the study's rounds, and confirmations that
stop at the study's rounds unless a budget pays for more:

| study | before | `-b` skipped | after (each run) |
|---|---|---|---|
| default | 49 of 141 s (35%), 12 processes; fa=on, fa=off: defaults kept | 53 of 133 s (40%), 13; the same | 49 of 104 s (47%), 14; 54 of 108 s (50%), 14; the same |
| second | 318 of 353 s (90%), 40; defaults: kept; t=1: t=2 | 259 of 288 s (90%), 27; the same | 37 of 74 s (50%), 9; 33 of 62 s (53%), 10; the same. 60 of 85 s (71%), 22; t=1: t=2 fa=off |

On the second shape the pp test was 4096 tokens against prompts of at most 2K: alone that took a trial from about
8 s to 3 s (102 of 132 s, 28 processes). With sharing, ``t=1`` runs its own processes only: its defaults and its
defaults again; every other trial is a command the ``defaults`` configuration ran, and its recommendation ``-t 2``
is the ``defaults`` configuration, which the study's rounds measure beside it. What remains is the ``defaults``
configuration's search: 8 processes (each candidate once, the defaults twice) and, where a value wins by a little
(``fa=off`` in the third run), the 6 processes of its confirmation in fresh processes; 0.02-0.03 s a turn against
a noise of 0.03 s is where the runs differ. The goal (at most half) is met in two runs of three. Not tried:
screening several values of one knob in one llama-bench process (one load: decisive where a load takes minutes,
nothing here, where a trial is its tests).

Again on 2 cores (2026-12-06, second session, nothing else running), after a value measured in two processes is
weighed against both sides' spreads between processes: default 56 of 142 s (39%), 15 processes, the same
recommendations; second 54/85 s (64%, 26 processes), 65/99 s (65%, 18), 46/80 s (58%, 12), 38/71 s (54%, 10), every
run `t=1: t=2` and the defaults kept. Over the seven runs of the second shape since the search's change: 50-71%, the
goal met in one of seven. Its floor is the ``defaults`` configuration's 8 processes of about 4 s (each candidate once,
the defaults twice) against about 35 s for the rest of the study; a noise of 0.08 s a turn here sends a value that
won its first process by a little to a second process (``ub=1024 (again)`` in the 54% run).

Third session of 2026-12-06 (2 cores, nothing else running; runs that shared the machine with other work are left
out), after: ``-fa on`` is not measured where ``-fa auto`` already runs it (llama.cpp's log says what auto chose),
the next marginal leader of a knob gets its second process too, what a search adds to a moved own knob is confirmed
against that knob, and rounds of the same two commands are run once per tuning stage:

| run | code | default | second |
|---|---|---|---|
| 1 | a2a02e1 (-fa, next leader) | 55 of 120 s (46%), 16 processes | 26 of 56 s (46%), 8 |
| 2 | 2677899 (+ origin rule) | 53 of 116 s (46%), 14 | 30 of 59 s (50%), 9 |
| 3 | 2677899 | 50 of 117 s (43%), 14 | — (a kept folder of an earlier run lent its trials: the script now clears it) |
| 4 | 2677899 | 55 of 142 s (39%), 15 | 34 of 78 s (44%), 20; defaults: a variant for decode, fa=off (confirmed) |
| 5 | 2677899 | — | 70 of 99 s (71%), 21: ``repack=0`` confirmed for ``defaults``, then the same two commands for ``t=1`` |
| 6 | 0f1da33 (+ shared rounds) | 56 of 130 s (43%), 14 | 33 of 64 s (52%), 9 |
| 7 | 167a4de (+ review) | 56 of 121 s (46%), 14 | 33 of 67 s (49%), 9 |
| 8 | 167a4de | 78 of 154 s (50%), 21 | 56 of 87 s (64%), 17: ``repack=0`` won two processes, 6 more to reject it |

Recommendations: ``fa=on`` and ``fa=off`` keep the defaults in every run; ``defaults`` keeps them and ``t=1`` moves
to ``t=2`` in every run of the second shape (run 4 adds a decode variant ``fa=off``, which its rounds confirmed). An
earlier run (before the origin rule) recommended ``repack=0 t=2`` for ``t=1``: ``-nr`` rode on ``-t 2``'s 1.6x
through a confirmation against ``-t 1``; now it is confirmed against ``-t 2`` and was not kept (run 5, whose second
confirmation the shared rounds of run 6 on would have saved). The default study stays at or under half in all seven
runs; the second shape in four of seven (44-52% where no value wins its first two processes by a little, 64-71%
where one does and its 6-process confirmation follows). Its floor is 9 processes of about 3 s (the ``defaults``
configuration's 7 and ``t=1``'s own 2) against about 33 s for the rest of the study: llama-bench itself takes 3.0 s
a process here (pp2048 and tg128 at depths 0 and 512, two repetitions and a warm-up each), so what is left to cut
is tests, not processes.

Fourth session of 2026-12-06 (2 cores, nothing else running; the script now prints each confirmation in rounds,
how many it ran and whether it stopped early):

| code | second shape, each run | default |
|---|---|---|
| 60b4db1 (confirmations stop where the rounds left cannot keep the setting) | 52%, 52%, 48%, 77%, 53%, 40%, 53%, 52%, 44%, 46%, 79% | 38% |
| + an own knob moves when each of its two processes beats each of the defaults' | 59%, 49%, 49%, 61%, 44%, 53% | 42%, 40% |

On 60b4db1 two runs of eleven (77%, 79%: 16-19 processes) recommended nothing for ``t=1``: its defaults measured
0.62 and 0.53 s a turn, ``-t 2`` (the ``defaults`` configuration's processes) 0.46 and 0.32 s. The two spreads
added (0.23 s) covered the means' 0.19 s, so ``-t 1`` stayed and every other knob was searched on its own
processes. Since the own-knob rule, ``t=1: t=2`` and ``defaults`` kept in all six runs. The stop rule cut two
confirmations: ``repack=0 t=2`` against ``t=2`` after one round (2 processes, not 6), a decode variant ``ub=2048``
after two. The share is 44-61%: at or under half in three of six, and at most 61% where a value leads by a little
and a confirmation follows; the default study stays at 38-42%.
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import tempfile
import time
from pathlib import Path

from xover.domain.config import LlamaConfig
from xover.domain.presets import make_shape
from xover.domain.study_spec import StudySpec, default_spec
from xover.gguf.synth import write_model
from xover.llamacpp.binaries import resolve
from xover.measure.study import run_study
from xover.results.store import Store


def second_spec(model: Path) -> StudySpec:
    return StudySpec(
        configs=(LlamaConfig("defaults"), LlamaConfig("t=1", (("threads", "1"),))),
        model_path=model,
        lengths=(512, 2048),
        response_tokens=(64,),
        repetitions=1,
        skip=frozenset({"cache", "session"}),
    )


def one(name: str, spec: StudySpec, out: Path) -> None:
    shutil.rmtree(out, ignore_errors=True)  # a kept folder of an earlier run would lend it its stored trials
    t0 = time.perf_counter()
    outcome = run_study(spec, out, resolve(), fresh=True)
    total = time.perf_counter() - t0
    tune_s = outcome.stage_seconds.get("tune", 0.0)
    db = out / "tune" / "results.sqlite"
    processes = 0
    if db.exists():
        with sqlite3.connect(db) as con:
            processes = con.execute("SELECT count(*) FROM runs").fetchone()[0]
    print(
        f"{name}: study {total:.0f} s, tuning {tune_s:.0f} s ({tune_s / total:.0%} of it), "
        f"{processes} llama-bench processes in the search; stages: "
        + ", ".join(f"{k} {v:.0f} s" for k, v in outcome.stage_seconds.items()),
        flush=True,
    )
    for t in outcome.tuned:
        label = t.label if t.changed else "defaults kept"
        decode = f"; for the second kind of turn {t.decode_label}" if t.decode_variant is not None else ""
        print(f"  {t.config.name}: {label}{decode}", flush=True)
    if (out / "results.sqlite").exists():  # each confirmation in rounds: how many, and whether it stopped early
        with Store(out) as st:
            for _, _, body in st.artifacts():
                if not (isinstance(body, dict) and body.get("schema") == "xover.tune/1"):
                    continue
                for key in ("origin_confirmation", "confirmation", "decode_confirmation"):
                    c = body.get(key)
                    if isinstance(c, dict):
                        stop = f", stopped (at most {c['stopped']})" if c.get("stopped") else ""
                        print(
                            f"  {body.get('config', '?')} {key}: {c.get('setting')} against "
                            f"{c.get('against') or 'defaults'}, {len(c.get('rounds') or [])} rounds{stop}, "
                            f"kept: {c.get('kept')}",
                            flush=True,
                        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=("default", "second"), default=None)
    ap.add_argument("--keep", type=Path, default=None, help="write the studies under this folder and keep them")
    args = ap.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="xover-search-"))
    root.mkdir(parents=True, exist_ok=True)
    if args.only in (None, "default"):
        one("default", default_spec(), root / "default")
    if args.only in (None, "second"):
        model = root / "qwen3moe-6x24.gguf"
        write_model(make_shape("tiny-moe", n_layer=6, n_expert=24), model, seed=0)
        one("second", second_spec(model), root / "second")
    if args.keep is None:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
