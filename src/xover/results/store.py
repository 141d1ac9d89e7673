"""The results store of a study directory: one SQLite file, versioned schema, the only codec.

Every record is committed as soon as it is measured, so a crash or Ctrl-C loses nothing that had
finished. Everything a report shows is rebuilt from this file alone.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from xover.domain.codec import decode, encode
from xover.domain.config import LlamaConfig
from xover.domain.records import BenchResult, Failure, Provenance, ServerTimings, SessionTurn, TtftSample
from xover.errors import XoverError
from xover.results import migrate

T = TypeVar("T")

SCHEMA_VERSION = 3  # v2: runs.started_unix_ns; v3: one configuration record and key per configuration, rounds
STORE_NAME = "results.sqlite"

# the columns every measurement table starts with, and the server timings TTFT samples and session
# turns both carry; the schema text is built from them
_MEASURED_ROW = """\
    id INTEGER PRIMARY KEY,
    run_id INTEGER NOT NULL REFERENCES runs(id),
    config_key TEXT NOT NULL REFERENCES configs(key),
    model_key TEXT NOT NULL,"""
_SERVER_TIMINGS = """\
    cache_n INTEGER,
    prompt_n INTEGER,
    prompt_ms REAL,
    prompt_per_second REAL,
    predicted_n INTEGER,
    predicted_ms REAL,
    predicted_per_second REAL,"""

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY,
    kind TEXT NOT NULL,              -- bench, ttft, cache, study...
    command TEXT NOT NULL,           -- the argv that started it (JSON list)
    started_at TEXT NOT NULL,
    started_unix_ns INTEGER,         -- the same instant, precise (v2)
    finished_at TEXT,
    status TEXT NOT NULL DEFAULT 'running',  -- running, done, interrupted, failed
    provenance TEXT NOT NULL         -- JSON of records.Provenance
);
CREATE TABLE IF NOT EXISTS configs (
    key TEXT PRIMARY KEY,
    kind TEXT NOT NULL,              -- llama (v3; bench or server before)
    label TEXT NOT NULL,
    spec TEXT NOT NULL               -- JSON of the config record (domain.config.LlamaConfig)
);
CREATE TABLE IF NOT EXISTS bench_results (
{_MEASURED_ROW}
    test TEXT NOT NULL,
    n_prompt INTEGER NOT NULL,
    n_gen INTEGER NOT NULL,
    n_depth INTEGER NOT NULL,
    avg_ts REAL NOT NULL,
    stddev_ts REAL NOT NULL,
    samples_ns TEXT NOT NULL,
    samples_ts TEXT NOT NULL,
    record TEXT NOT NULL,
    round INTEGER,                   -- the round of fresh processes (schema 3; NULL before rounds)
    created_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS bench_point ON bench_results(config_key, model_key, n_prompt, n_gen, n_depth);
CREATE TABLE IF NOT EXISTS ttft_samples (
{_MEASURED_ROW}
    mode TEXT NOT NULL,
    length INTEGER NOT NULL,
    rep INTEGER NOT NULL,
    prompt_id TEXT NOT NULL,
    sent_at_unix_ns INTEGER NOT NULL,
    first_byte_ns INTEGER,
    first_token_ns INTEGER,
    end_ns INTEGER,
    token_times_ns TEXT NOT NULL,
    n_tokens_received INTEGER NOT NULL,
{_SERVER_TIMINGS}
    cache_ok INTEGER NOT NULL,
    error TEXT,
    round INTEGER,                   -- the round of fresh processes (schema 3; NULL before rounds)
    created_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS ttft_point ON ttft_samples(config_key, model_key, mode, length);
CREATE TABLE IF NOT EXISTS failures (
    id INTEGER PRIMARY KEY,
    run_id INTEGER NOT NULL REFERENCES runs(id),
    config_key TEXT NOT NULL,
    stage TEXT NOT NULL,
    point TEXT NOT NULL,
    reason TEXT NOT NULL,
    stderr_tail TEXT NOT NULL,
    created_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS artifacts (
    id INTEGER PRIMARY KEY,
    run_id INTEGER REFERENCES runs(id),
    name TEXT NOT NULL,              -- e.g. server props, theory output
    body TEXT NOT NULL,              -- JSON
    created_at TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS session_turns (
{_MEASURED_ROW}
    mode TEXT NOT NULL,              -- cache mode: default, off, reuse
    session_id TEXT NOT NULL,        -- the workload file's content hash
    feed TEXT NOT NULL,              -- generated or recorded replies
    turn INTEGER NOT NULL,
    rewrite INTEGER NOT NULL,
    sent_at_unix_ns INTEGER NOT NULL,
    prompt_tokens INTEGER,
    prefix_tokens INTEGER,
    cached_tokens INTEGER,
    completion_tokens INTEGER,
    first_byte_ns INTEGER,
    first_token_ns INTEGER,
    last_token_ns INTEGER,
    end_ns INTEGER,
    n_content_events INTEGER NOT NULL,
    reply TEXT NOT NULL,
    reply_tokens INTEGER,
{_SERVER_TIMINGS}
    error TEXT,
    created_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS session_turn_point ON session_turns(config_key, mode, session_id, turn);
"""


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def _json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, default=str)


# ---- codec: records <-> JSON-able dicts -------------------------------------------------------


def provenance_to_dict(p: Provenance) -> dict[str, Any]:
    return encode(p)


def provenance_from_dict(d: dict[str, Any]) -> Provenance:
    return decode(Provenance, d)


CONFIG_KIND = "llama"


class Store:
    """The SQLite results store of one study directory. Not shared across threads."""

    def __init__(self, study_dir: Path | str) -> None:
        self.dir = Path(study_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / STORE_NAME
        try:
            self.db = sqlite3.connect(self.path, isolation_level=None, timeout=30)
            self.db.row_factory = sqlite3.Row
            self.db.execute("PRAGMA journal_mode=WAL")
            self.db.execute("PRAGMA synchronous=NORMAL")
            self.db.execute("PRAGMA foreign_keys=ON")
        except sqlite3.DatabaseError as e:
            raise XoverError(
                f"{self.path} is not a usable results store ({e}); move it aside or pick another -o"
            ) from None
        self._migrate()

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _migrate(self) -> None:
        row = None
        try:
            row = self.db.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        except sqlite3.OperationalError:
            pass
        if row is not None and int(row[0]) > SCHEMA_VERSION:
            raise XoverError(
                f"{self.path} has schema version {row[0]}, newer than this xover understands ({SCHEMA_VERSION}): upgrade xover"
            )
        self.db.executescript(_SCHEMA)
        columns = {r[1] for r in self.db.execute("PRAGMA table_info(runs)")}
        if "started_unix_ns" not in columns:  # a v1 store
            self.db.execute("ALTER TABLE runs ADD COLUMN started_unix_ns INTEGER")
        for table in ("bench_results", "ttft_samples"):  # v1 and v2 stores: measured before rounds
            if "round" not in {r[1] for r in self.db.execute(f"PRAGMA table_info({table})")}:
                self.db.execute(f"ALTER TABLE {table} ADD COLUMN round INTEGER")
        if row is not None and int(row[0]) < 3:
            with self.transaction() as db:
                migrate.to_v3(db)
        self.db.execute(
            "INSERT INTO meta(key, value) VALUES('schema_version', ?) ON CONFLICT(key) DO UPDATE SET value=excluded.value",
            (str(SCHEMA_VERSION),),
        )

    def transaction(self) -> _Tx:
        return _Tx(self.db)

    # ---- runs ---------------------------------------------------------------------------------

    def begin_run(self, kind: str, command: list[str], provenance: Provenance) -> int:
        cur = self.db.execute(
            "INSERT INTO runs(kind, command, started_at, started_unix_ns, provenance) VALUES(?,?,?,?,?)",
            (kind, _json(command), now_iso(), time.time_ns(), _json(provenance_to_dict(provenance))),
        )
        return int(cur.lastrowid or 0)

    def end_run(self, run_id: int, status: str) -> None:
        self.db.execute("UPDATE runs SET finished_at=?, status=? WHERE id=?", (now_iso(), status, run_id))

    def runs(self) -> list[dict[str, Any]]:
        out = []
        for r in self.db.execute("SELECT * FROM runs ORDER BY id"):
            d = dict(r)
            d["command"] = json.loads(d["command"])
            d["provenance"] = provenance_from_dict(json.loads(d["provenance"]))
            out.append(d)
        return out

    def provenance(self, run_id: int) -> Provenance:
        row = self.db.execute("SELECT provenance FROM runs WHERE id=?", (run_id,)).fetchone()
        if row is None:
            raise KeyError(run_id)
        return provenance_from_dict(json.loads(row[0]))

    # ---- configs ------------------------------------------------------------------------------

    def put_config(self, config: LlamaConfig) -> str:
        """Store a configuration under its key (its latest name is the label its measurements are shown by)."""
        self.db.execute(
            "INSERT INTO configs(key, kind, label, spec) VALUES(?,?,?,?) ON CONFLICT(key) DO UPDATE SET label=excluded.label",
            (config.key, CONFIG_KIND, config.name, _json(encode(config))),
        )
        return config.key

    def configs(self) -> list[LlamaConfig]:
        """Every stored configuration, in the order first stored, named by its latest label."""
        out = []
        for label, spec in self.db.execute("SELECT label, spec FROM configs ORDER BY rowid"):
            out.append(dataclasses.replace(decode(LlamaConfig, json.loads(spec)), name=label))
        return out

    # ---- llama-bench results ------------------------------------------------------------------

    def add_bench_result(self, run_id: int, model_key: str, r: BenchResult) -> int:
        return self._insert(
            "bench_results",
            run_id=run_id,
            model_key=model_key,
            test=r.test_name,
            **_columns(
                r, samples_ns=_json(list(r.samples_ns)), samples_ts=_json(list(r.samples_ts)), record=_json(r.record)
            ),
        )

    def bench_results(self, config_key: str | None = None) -> list[tuple[int, int, str, BenchResult]]:
        """(row id, run id, model key, result), oldest first."""
        return self._rows("bench_results", config_key, _bench_from_row)

    def has_bench_point(
        self, config_key: str, model_key: str, n_prompt: int, n_gen: int, n_depth: int, round: int | None = None
    ) -> bool:
        """Whether the test is stored (in round ``round``; None: measured outside rounds)."""
        row = self.db.execute(
            "SELECT 1 FROM bench_results WHERE config_key=? AND model_key=? AND n_prompt=? AND n_gen=? AND n_depth=? "
            "AND round IS ? LIMIT 1",
            (config_key, model_key, n_prompt, n_gen, n_depth, round),
        ).fetchone()
        return row is not None

    # ---- TTFT samples -------------------------------------------------------------------------

    def add_ttft_sample(self, run_id: int, model_key: str, s: TtftSample) -> int:
        return self._insert(
            "ttft_samples",
            run_id=run_id,
            model_key=model_key,
            **_columns(s, token_times_ns=_json(list(s.token_times_ns)), cache_ok=int(s.cache_ok)),
        )

    def ttft_samples(self, config_key: str | None = None) -> list[tuple[int, int, str, TtftSample]]:
        """(row id, run id, model key, sample), oldest first."""
        return self._rows("ttft_samples", config_key, _ttft_from_row)

    # ---- agentic session turns ----------------------------------------------------------------

    def add_session_turn(self, run_id: int, model_key: str, t: SessionTurn) -> int:
        return self._insert("session_turns", run_id=run_id, model_key=model_key, **_columns(t, rewrite=int(t.rewrite)))

    def session_turns(self, config_key: str | None = None) -> list[tuple[int, int, str, SessionTurn]]:
        """(row id, run id, model key, turn), oldest first."""
        return self._rows("session_turns", config_key, _session_turn_from_row)

    def _insert(self, table: str, **columns: Any) -> int:
        """Store one row of a measurement table, stamped ``created_at`` now; its id."""
        columns["created_at"] = now_iso()
        cur = self.db.execute(
            f"INSERT INTO {table}({', '.join(columns)}) VALUES({','.join('?' * len(columns))})", tuple(columns.values())
        )
        return int(cur.lastrowid or 0)

    def _rows(
        self, table: str, config_key: str | None, decode: Callable[[sqlite3.Row], T]
    ) -> list[tuple[int, int, str, T]]:
        """(row id, run id, model key, record) of one measurement table, oldest first, optionally one config's."""
        q = f"SELECT * FROM {table}" + (" WHERE config_key=?" if config_key else "") + " ORDER BY id"
        return [
            (r["id"], r["run_id"], r["model_key"], decode(r))
            for r in self.db.execute(q, (config_key,) if config_key else ())
        ]

    # ---- failures and artifacts ---------------------------------------------------------------

    def add_failure(self, run_id: int, f: Failure) -> int:
        return self._insert("failures", run_id=run_id, **_columns(f))

    def failures(self) -> list[tuple[int, Failure]]:
        return [
            (r["run_id"], Failure(r["config_key"], r["stage"], r["point"], r["reason"], r["stderr_tail"]))
            for r in self.db.execute("SELECT * FROM failures ORDER BY id")
        ]

    def add_artifact(self, run_id: int | None, name: str, body: Any) -> None:
        self.db.execute(
            "INSERT INTO artifacts(run_id, name, body, created_at) VALUES(?,?,?,?)",
            (run_id, name, _json(body), now_iso()),
        )

    def artifacts(self, name: str | None = None) -> list[tuple[int | None, str, Any]]:
        q = "SELECT run_id, name, body FROM artifacts" + (" WHERE name=?" if name else "") + " ORDER BY id"
        return [(r[0], r[1], json.loads(r[2])) for r in self.db.execute(q, (name,) if name else ())]

    def integrity_ok(self) -> bool:
        return self.db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


class _Tx:
    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> sqlite3.Connection:
        self.db.execute("BEGIN")
        return self.db

    def __exit__(self, exc_type: object, *rest: object) -> None:
        self.db.execute("ROLLBACK" if exc_type else "COMMIT")


def _from_row(cls: type[T], r: sqlite3.Row, /, **converted: Any) -> T:
    """A record whose fields are the row's columns of the same names, but for those ``converted`` gives."""
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    return cls(**{f.name: converted[f.name] if f.name in converted else r[f.name] for f in fields})


def _bench_from_row(r: sqlite3.Row) -> BenchResult:
    return _from_row(
        BenchResult,
        r,
        samples_ns=tuple(json.loads(r["samples_ns"])),
        samples_ts=tuple(json.loads(r["samples_ts"])),
        record=json.loads(r["record"]),
    )


def _timings_from_row(r: sqlite3.Row) -> ServerTimings | None:
    """The server's timings columns of a row (TTFT samples and session turns share them)."""
    if all(r[k] is None for k in ("cache_n", "prompt_n", "prompt_ms", "predicted_n")):
        return None
    return _from_row(ServerTimings, r)


def _columns(record: Any, /, **converted: Any) -> dict[str, Any]:
    """A record's columns: its fields by name (``converted`` gives those stored otherwise), its server
    timings as columns of their own (all None without timings)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(record):
        value = converted[f.name] if f.name in converted else getattr(record, f.name)
        if f.name == "timings":
            names = [t.name for t in dataclasses.fields(ServerTimings)]
            out.update(zip(names, [None] * len(names)) if value is None else _columns(value))
        else:
            out[f.name] = value
    return out


def _ttft_from_row(r: sqlite3.Row) -> TtftSample:
    return _from_row(
        TtftSample,
        r,
        token_times_ns=tuple(json.loads(r["token_times_ns"])),
        timings=_timings_from_row(r),
        cache_ok=bool(r["cache_ok"]),
    )


def _session_turn_from_row(r: sqlite3.Row) -> SessionTurn:
    return _from_row(SessionTurn, r, rewrite=bool(r["rewrite"]), timings=_timings_from_row(r))


def iter_rows(store: Store, table: str) -> Iterator[dict[str, Any]]:
    """Raw rows of a table, for exporters (JSONL/CSV). Table names are fixed, never user input."""
    if table not in {"runs", "configs", "bench_results", "ttft_samples", "failures", "artifacts"}:
        raise ValueError(table)
    for r in store.db.execute(f"SELECT * FROM {table} ORDER BY rowid"):  # noqa: S608 - whitelisted
        yield dict(r)
