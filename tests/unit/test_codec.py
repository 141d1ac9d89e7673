"""The record codec (xover.domain.codec): the store's provenance and configurations and advise's stored
records decode through one function, back to equal records."""

from __future__ import annotations

import json

from xover.analysis import advise
from xover.domain.codec import decode, encode
from xover.domain.records import BenchConfig, ModelId, Provenance, ServerConfig
from xover.results.store import bench_config_from_dict, provenance_from_dict, server_config_from_dict


def _json_round_trip(record: object) -> object:
    return decode(type(record), json.loads(json.dumps(encode(record))))


def test_records_round_trip_through_json() -> None:
    model = ModelId(path="/m.gguf", name="m.gguf", size_bytes=1, header_sha256="ab" * 32)
    prov = Provenance("abc", 1, "CPU", "/bin", "flag", "cpu", None, "host", "linux", "0.1", model, (("k", "v"),))
    assert _json_round_trip(prov) == prov
    assert _json_round_trip(Provenance(None, None, None, None, None, None, None, "h", "os", "v", None)) == Provenance(
        None, None, None, None, None, None, None, "h", "os", "v", None
    )
    bench = BenchConfig("ncmoe=1", (("-ncmoe", "1"),), (("GGML_OP_OFFLOAD_MIN_BATCH", "64"),), ("-ngl", "99"))
    server = ServerConfig("x", ("-m", "m.gguf", "--no-op-offload"), (("A", "1"),))
    assert _json_round_trip(bench) == bench and _json_round_trip(server) == server
    knob = advise.default_knobs(2)[0]
    assert _json_round_trip(knob) == knob


def test_the_store_decodes_with_the_codec() -> None:
    data = {"label": "x", "fields": [["-t", "2"]]}  # env and extra_args missing: their defaults
    assert bench_config_from_dict(data) == BenchConfig("x", (("-t", "2"),))
    assert server_config_from_dict({"label": "s", "args": ["-t", "2"]}) == ServerConfig("s", ("-t", "2"))
    prov = Provenance(None, None, None, None, None, None, None, "h", "os", "v", None)
    body = {k: v for k, v in encode(prov).items() if k != "extra"}
    assert provenance_from_dict(body) == prov
