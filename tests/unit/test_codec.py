"""The record codec (xover.domain.codec): the store's provenance and configurations and advise's stored
records decode through one function, back to equal records."""

from __future__ import annotations

import json
from pathlib import Path

from xover.analysis import advise
from xover.domain.codec import decode, encode
from xover.domain.config import LlamaConfig
from xover.domain.records import ModelId, Provenance
from xover.results.migrate import legacy_config
from xover.results.store import Store, provenance_from_dict


def _json_round_trip(record: object) -> object:
    return decode(type(record), json.loads(json.dumps(encode(record))))


def test_records_round_trip_through_json() -> None:
    model = ModelId(path="/m.gguf", name="m.gguf", size_bytes=1, header_sha256="ab" * 32)
    prov = Provenance("abc", 1, "CPU", "/bin", "flag", "cpu", None, "host", "linux", "0.1", model, (("k", "v"),))
    assert _json_round_trip(prov) == prov
    assert _json_round_trip(Provenance(None, None, None, None, None, None, None, "h", "os", "v", None)) == Provenance(
        None, None, None, None, None, None, None, "h", "os", "v", None
    )
    config = LlamaConfig(
        "ncmoe=1",
        settings=(("n-cpu-moe", "1"), ("GGML_OP_OFFLOAD_MIN_BATCH", "64"), ("no-op-offload", "1")),
        env=(("A", "1"),),
        bench_args=("--poll", "0"),
        server_args=("--jinja",),
        rpc_local=2,
        rpc_threads=4,
        max_context=8192,
    )
    served = LlamaConfig("x", url="http://127.0.0.1:8080")
    assert _json_round_trip(config) == config and _json_round_trip(served) == served
    assert _json_round_trip(config).key == config.key  # type: ignore[attr-defined]
    knob = advise.default_knobs(2)[0]
    assert _json_round_trip(knob) == knob


def test_the_store_decodes_with_the_codec(tmp_path: Path) -> None:
    data = {"name": "x", "settings": [["threads", "2"]]}  # env, arguments and the rest missing: their defaults
    assert decode(LlamaConfig, data) == LlamaConfig("x", (("threads", "2"),))
    with Store(tmp_path) as st:  # a stored record with fields missing reads back the same way
        st.db.execute(
            "INSERT INTO configs(key, kind, label, spec) VALUES(?,?,?,?)",
            (LlamaConfig("x", (("threads", "2"),)).key, "llama", "x", json.dumps(data)),
        )
        assert st.configs() == [LlamaConfig("x", (("threads", "2"),))]
    # a record of a store before schema 3: llama-bench's fields, or llama-server's arguments
    assert legacy_config("bench", "x", {"label": "x", "fields": [["-t", "2"]]}) == LlamaConfig("x", (("threads", "2"),))
    assert legacy_config("server", "s", {"label": "s", "args": ["-t", "2"]}) == LlamaConfig("s", (("threads", "2"),))
    prov = Provenance(None, None, None, None, None, None, None, "h", "os", "v", None)
    body = {k: v for k, v in encode(prov).items() if k != "extra"}
    assert provenance_from_dict(body) == prov
