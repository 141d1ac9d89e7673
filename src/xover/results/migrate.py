"""The results store's versioned migrations of stored data (the schema text itself grows in
:mod:`xover.results.store`). Run inside one transaction by :class:`xover.results.store.Store` when it opens an
older store.

**To schema 3: one configuration, one key.** Before it, a configuration measured by llama-bench and by llama-server
was stored twice, under two keys: one digested from its llama-bench flags, one from llama-server's whole argument
list with xover's own flags in it (the model's path, ``-c``, ``-ngl 99``, ``-np 1 --cache-ram 0``, a cache-lab
scenario's flags), so a study copied elsewhere or a cache-lab scenario was another server. Each stored record is
read back as the :class:`xover.domain.config.LlamaConfig` it measured (:func:`xover.domain.config.from_bench_record`,
:func:`~xover.domain.config.from_server_record`) and every reference to its old key (measurements, failures,
artifact bodies) moves to that configuration's key; records of one configuration become one. A tuning result's
signature (the flags of the configuration it tuned) becomes that configuration's key.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from xover.domain.codec import encode
from xover.domain.config import LlamaConfig, from_bench_record, from_server_record
from xover.domain.llama_options import parse_args

_KEYED_TABLES = ("bench_results", "ttft_samples", "failures", "session_turns")


def legacy_config(kind: str, label: str, spec: dict[str, Any]) -> LlamaConfig:
    """A configuration record of a store before schema 3 as the configuration it describes."""
    if kind == "bench":
        return from_bench_record(label, spec.get("fields", ()), spec.get("env", ()), spec.get("extra_args", ()))
    return from_server_record(label, spec.get("args", ()), spec.get("env", ()))


def signature_config(signature: dict[str, Any]) -> LlamaConfig:
    """A tuning result's signature before schema 3 (the tuned configuration's flags as the spec gave them) as that
    configuration."""
    values, rest = parse_args([a for f, v in signature.get("flags", ()) for a in (f, v)], "server")
    if signature.get("no_op_offload"):
        values["no-op-offload"] = "1"
    config = LlamaConfig(
        name="",
        bench_args=tuple(signature.get("bench_args", ())),
        server_args=(*rest, *signature.get("server_args", ())),
    )
    return config.with_env(dict((k, v) for k, v in signature.get("env", ()))).with_values(values)


def _rekeyed(value: Any, keys: dict[str, str]) -> Any:
    if isinstance(value, str):
        return keys.get(value, value)
    if isinstance(value, list):
        return [_rekeyed(v, keys) for v in value]
    if isinstance(value, dict):
        out = {k: _rekeyed(v, keys) for k, v in value.items()}
        if isinstance(out.get("signature"), dict) and out.get("schema", "").startswith("xover.tune/"):
            out["signature"] = signature_config(out["signature"]).key
        return out
    return value


def to_v3(db: sqlite3.Connection) -> dict[str, str]:
    """Re-key a store of schema 1 or 2 (see the module's docstring); the old key -> new key map."""
    rows = db.execute("SELECT rowid, key, kind, label, spec FROM configs ORDER BY rowid").fetchall()
    keys: dict[str, str] = {}
    merged: dict[str, tuple[LlamaConfig, str]] = {}  # new key -> (configuration, its latest label), first-seen order
    for _, key, kind, label, spec in rows:
        if kind not in ("bench", "server"):
            continue  # already a configuration of this schema
        config = legacy_config(kind, label, json.loads(spec))
        keys[key] = config.key
        merged[config.key] = (merged[config.key][0] if config.key in merged else config, label)
    if not keys:
        return keys
    for new_key, (config, label) in merged.items():
        db.execute(
            "INSERT INTO configs(key, kind, label, spec) VALUES(?,?,?,?) ON CONFLICT(key) DO UPDATE SET "
            "kind=excluded.kind, label=excluded.label, spec=excluded.spec",
            (new_key, "llama", label, json.dumps(encode(config), sort_keys=True, default=str)),
        )
    for table in _KEYED_TABLES:
        for old, new in keys.items():
            db.execute(f"UPDATE {table} SET config_key=? WHERE config_key=?", (new, old))  # noqa: S608 - fixed names
    gone = [k for k in keys if k not in merged]
    if gone:
        db.execute(f"DELETE FROM configs WHERE key IN ({','.join('?' * len(gone))})", gone)
    for rowid, body in db.execute("SELECT id, body FROM artifacts").fetchall():
        before = json.loads(body)
        after = _rekeyed(before, keys)
        if after != before:
            db.execute(
                "UPDATE artifacts SET body=? WHERE id=?", (json.dumps(after, sort_keys=True, default=str), rowid)
            )
    return keys
