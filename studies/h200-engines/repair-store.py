"""The corrections made once, on 2026-12-03, to this study's two stores (results.sqlite and tune/results.sqlite), kept
so that anyone can see what was changed and redo it on the stores as the leases returned them (git history).

Before commit b10f112 a run's provenance named the study's mainline binaries whatever engine its configuration ran:
ik_llama.cpp's servers (runs 10, 12, 13 and 15 of results.sqlite) and tuning trials said
0c1e570-cuda-275a59ba/build/bin. Each such run held the samples of one configuration only, so its engine is its
configuration's (configs.spec), and that engine's build is the one the study recorded (artifact ``engines``, the same
build keys in both leases). The fix sets llama_engine on every run and, for ik_llama.cpp's, the build folder and
the identity (``ik0.1.5``); nothing measured changes.

Round 3 of lease d ended after one server: mainline's defaults' cold samples (run 17). Paired by round with the
others' round 3, measured by the next lease on another machine, they would carry the difference between machines
(lease c's and lease d's mainline tuned differed by 15% at 32K) into the verdicts. Run 17 is what the stage's drift
check is, the first configuration once more in a fresh server after the last whole round, so its samples are
stored as that (round -2): kept, shown in the report's drift line, not paired. The next lease measures round 3
whole, on one machine.

It also drops results.sqlite's runs 1-8: the fourth lease's rounds, whose samples and failures run.sh's seeding
deleted (they are kept in lease-2026-12-03c/results.sqlite) but whose run rows it left, so the report listed them
in its provenance. The seeding drops such rows now (scripts/lease.sh seed_store).

    python3 studies/h200-engines/repair-store.py
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

HERE = Path(__file__).parent


def builds() -> dict[str, dict[str, str]]:
    db = sqlite3.connect(HERE / "results.sqlite")
    ((body,),) = db.execute("SELECT body FROM artifacts WHERE name = 'engines'").fetchall()
    return {b["engine"]: b for b in json.loads(body)}


def repair(path: Path, by_engine: dict[str, dict[str, str]]) -> None:
    db = sqlite3.connect(path)
    engine_of = {key: json.loads(spec)["engine"] for key, spec in db.execute("SELECT key, spec FROM configs")}
    held: dict[int, set[str]] = {}
    for table in ("ttft_samples", "bench_results", "failures"):
        for run_id, key in db.execute(f"SELECT run_id, config_key FROM {table}"):
            held.setdefault(run_id, set()).add(engine_of[key])
    for run_id, body in db.execute("SELECT id, provenance FROM runs").fetchall():
        engines = held.get(run_id)
        if not engines:
            if path.parent == HERE:  # the fourth lease's rounds, emptied by the seeding
                db.execute("DELETE FROM runs WHERE id = ?", (run_id,))
            continue
        (engine,) = engines  # one engine a run: checked, not assumed
        p = json.loads(body)
        p["llama_engine"] = engine
        if engine != "llama.cpp":
            p["llama_bin_dir"] = by_engine[engine]["bin_dir"]
            p["llama_build_commit"] = by_engine[engine]["commit"]
        db.execute("UPDATE runs SET provenance = ? WHERE id = ?", (json.dumps(p, sort_keys=True), run_id))
    if path.parent == HERE:  # round 3's one server, after round 2: the drift check
        db.execute("UPDATE ttft_samples SET round = -2 WHERE run_id = 17 AND round = 3")
    db.commit()
    db.execute("VACUUM")
    db.close()


if __name__ == "__main__":
    found = builds()
    for store in (HERE / "results.sqlite", HERE / "tune" / "results.sqlite"):
        repair(store, found)
        print("repaired", store.relative_to(HERE))
