"""What a round of fresh servers is expected to cost (xover.measure.resume.round_cost), by hand: the budget check of
a round past the first ones reads it, so that a round of only the open questions is not priced as a whole round."""

from __future__ import annotations

import dataclasses

from fakes.records import provenance
from xover.domain.artifacts import TTFT_EFFICIENCY
from xover.domain.config import LlamaConfig
from xover.domain.records import ServerTimings, TtftSample
from xover.domain.study_spec import StudySpec
from xover.measure.resume import TtftTodo, round_cost
from xover.results.read_model import Artifact, StoredRun, StoredSample, StudyData

A, B = LlamaConfig("a", settings=(("n-cpu-moe", "2"),)), LlamaConfig("b", settings=(("n-cpu-moe", "4"),))


def _sample(key: str, mode: str, length: int, seconds: float) -> TtftSample:
    t = ServerTimings(0, length, 1.0, 1.0, 16, 1.0, 1.0)
    return TtftSample(key, mode, length, 0, "p", 1, 100, 50_000_000, int(seconds * 1e9), (), 16, t, True, round=1)


def _data() -> tuple[StudySpec, StudyData, str]:
    runs = tuple(
        StoredRun(i, "study", ("xover",), "2026-12-06T00:00:00+0000", None, None, "done", provenance(m))
        for i, m in ((1, "ab"), (2, "ab"), (3, "cd"))
    )
    mk = provenance("ab").model.key  # type: ignore[union-attr]
    server = {"config_key": A.key, "round": 1}
    artifacts = (
        Artifact(1, TTFT_EFFICIENCY, {**server, "wall_s": 20.0, "load_s": 4.0, "requests_s": 10.0}),
        Artifact(2, TTFT_EFFICIENCY, {**server, "wall_s": 10.0, "load_s": 3.0, "requests_s": 5.0}),  # the latest
        Artifact(3, TTFT_EFFICIENCY, {**server, "wall_s": 99.0, "load_s": 50.0, "requests_s": 0.0}),  # another model
        Artifact(2, "server-props", {"config_key": B.key}),
    )
    rows = [
        (1, _sample(A.key, "cold", 1024, 1.0)),
        (2, _sample(A.key, "cold", 1024, 3.0)),
        (2, _sample(A.key, "cached:16384", 512, 5.0)),
        (3, _sample(A.key, "cold", 4096, 7.0)),  # another model's
        (2, dataclasses.replace(_sample(A.key, "cold", 4096, 60.0), cache_ok=False)),  # failed its check
    ]
    ttft_rows = tuple(StoredSample(i, run, "a", s, mk if run != 3 else "other") for i, (run, s) in enumerate(rows, 1))
    spec = StudySpec(configs=(A, B), model_preset="tiny-moe", lengths=(1024, 4096), cached_new_tokens=(512,),
                     cached_depth=16384)  # fmt: skip
    data = StudyData("x", runs, {}, (), tuple(("a", s) for _, s in rows), (), artifacts, ttft_rows=ttft_rows)
    return spec, data, mk


def test_a_round_costs_each_server_its_load_and_overhead_and_each_sample_its_median_request() -> None:
    spec, data, mk = _data()
    todo = TtftTodo(A, {1024: 2}, {}, (), {"cached": {512: 1}})
    # the latest server's load (3 s) and overhead (2 s: its wall less its load and requests), two cold 1K samples at
    # their median (2 s), one cached turn (5 s) and its priming: a cold prompt of the cached depth, the longest stored
    # (1K at 2 s: the 4K samples are another model's or failed their check)
    assert round_cost(spec, data, [todo], mk) == 3.0 + 2.0 + 2 * 2.0 + 5.0 + 2.0
    nothing = TtftTodo(B, {}, {}, (), {"cached": {}})
    assert round_cost(spec, data, [todo, nothing], mk) == 16.0  # a configuration with nothing to measure is free
    cold_only = TtftTodo(A, {1024: 1}, {}, (), {"cached": {}})
    assert round_cost(spec, data, [cold_only], mk) == 3.0 + 2.0 + 2.0  # no cached turn: no priming


def test_a_round_with_nothing_stored_to_price_it_by_is_not_priced() -> None:
    spec, data, mk = _data()
    assert round_cost(spec, data, [TtftTodo(A, {4096: 1}, {}, ())], mk) is None  # no counted 4K request of this model
    assert round_cost(spec, data, [TtftTodo(B, {1024: 1}, {}, ())], mk) is None  # no server of b stored
    assert round_cost(spec, data, [TtftTodo(A, {1024: 1}, {}, ())], "other") is None  # another model's store
