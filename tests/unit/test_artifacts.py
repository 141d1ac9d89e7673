"""The typed artifacts (xover.domain.artifacts) and the read model's accessors over them: each parser reads what
every version wrote (missing optional fields take their defaults), a body that cannot be read is skipped, and the
committed studies read as before."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import Any

import pytest

from xover.analysis import advise
from xover.domain import artifacts as art
from xover.domain.artifacts import (
    FitRecord,
    Prediction,
    SkippedPoint,
    StudyRecord,
    TuneRecord,
    UnreadableArtifact,
    fit_records,
    latest_tunes,
    readable,
)
from xover.results.read_model import fit_placements, load, placement_limits, too_slow
from xover.results.store import Store

ROOT = Path(__file__).resolve().parents[2]
GIB = 1 << 30


def _plan(config: str = "fit@8k", request: str = "fit@8192", n: int = 10, **extra: Any) -> dict[str, Any]:
    return {
        "config": config,
        "request": request,
        "n_ctx": 8704,
        "n_cpu_moe": n,
        "budget_bytes": 16 * GIB,
        "headroom_bytes": GIB,
        "estimate": {"model_bytes": 1, "kv_bytes": 2, "compute_bytes": 3, "total_bytes": 6},
        **extra,
    }


def _check(n: int, served: bool, reason: str | None = None) -> dict[str, Any]:
    return {"n_cpu_moe": n, "loaded": served, "served": served, "reason": reason}


# ---- the records ----------------------------------------------------------------------------------


def test_the_artifact_names_are_the_stored_ones() -> None:
    assert (art.PREDICTION, art.TUNE, art.STUDY, art.TTFT_SKIPPED) == ("prediction", "tune", "study", "ttft-skipped")
    assert [art.fit_artifact(s, c) for s in art.FIT_SUFFIXES for c in (False, True)] == [
        "fit",
        "fit-check",
        "fit-tuned",
        "fit-check-tuned",
    ]
    with pytest.raises(ValueError):
        art.fit_artifact("-other")


def test_a_prediction_is_typed_and_still_the_mapping_it_was_read_from() -> None:
    from xover.analysis.theory import Offload, predicted_value

    entry = {
        "label": "ncmoe=18",
        "study_label": "cpu",
        **dataclasses.asdict(Offload(n_cpu_moe=18)),
        "points": [{"length": 1024, "ttft_s": 1.0, "fits": None}],
        "curve": {"length": [1024, 2048], "ttft_s": [1.0, 3.0]},
    }
    body: dict[str, Any] = {
        "schema": "xover.prediction/1",
        "created_at": "2026-12-01T00:00:00+0000",
        "created_unix_ns": 5,
        "model": {"name": "m"},
        "hardware": {"gpu": None},
        "assumptions": ["one", "two"],
        "response_tokens": 200,
        "pp_tokens": 512,
        "lengths": [1024],
        "configs": [entry],
        "crossovers": [{"a": "x", "b": "y", "lengths": [], "faster_short": "x", "faster_long": "x", "max_length": 9}],
        "measurements_before": 0,
    }
    p = Prediction.from_body(body)
    assert (p.schema, p.created_at, p.created_unix_ns, p.response_tokens, p.pp_tokens) == (
        "xover.prediction/1",
        "2026-12-01T00:00:00+0000",
        5,
        200,
        512,
    )
    assert p.assumptions == ("one", "two") and p.lengths == (1024,) and p.measurements_before == 0
    assert p.hardware == {"gpu": None} and p.model == {"name": "m"}
    (c,) = p.configs
    assert (c.label, c.shown_label, c.n_cpu_moe, c.op_offload, c.ubatch) == ("ncmoe=18", "cpu", 18, True, 512)
    assert p.crossovers[0].max_length == 9 and p.crossovers[0].lengths == ()
    assert p == body and dict(p) == body  # the mapping it was read from
    assert predicted_value(p, "ncmoe=18", 1536, "ttft_s") == pytest.approx(2.0)
    assert predicted_value(p, Offload(n_cpu_moe=18), 1024, "ttft_s") == 1.0
    relabelled = p.relabelled()
    assert relabelled.configs[0].label == "cpu" and predicted_value(relabelled, "cpu", 1024, "ttft_s") == 1.0
    assert body["configs"][0]["label"] == "ncmoe=18"  # the stored body is left as it was


def test_an_older_prediction_takes_defaults_and_a_broken_one_is_unreadable() -> None:
    old = Prediction.from_body({"created_unix_ns": 1})
    assert old == {"created_unix_ns": 1} and old.schema == "" and old.created_at is None
    assert (old.hardware, old.assumptions, old.configs, old.measurements_before) == (None, (), (), None)
    bare = Prediction.from_body({"configs": [{"label": "a"}], "assumptions": "not a list", "hardware": "h"})
    assert bare.configs[0].shown_label == "a" and bare.configs[0].n_cpu_moe is None
    assert bare.assumptions == () and bare.hardware is None
    broken: Any
    for broken in ([], {"created_unix_ns": "soon"}, {"configs": [{"curve": {}}]}):
        with pytest.raises(UnreadableArtifact):
            Prediction.from_body(broken)
        assert readable(Prediction.from_body, broken) is None


def _search() -> advise.Search:
    def measure(setting: Any) -> advise.Measurement:
        rates = (advise.RateSamples(0, 512, (100.0, 101.0, 99.0)),)
        return advise.Measurement(rates, rates, effective=())

    return advise.coordinate_search((), measure, advise.uniform_workload((1024,), 200))


def _tune_body(config: str, variant: str | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "schema": art.TUNE_SCHEMA,
        "config": config,
        "signature": "k" * 16,
        "variant": variant,
        "setting": [["threads", "2"]] if variant else [],
        "setting_label": "t=2" if variant else "defaults",
        "server_args": ["-t", "2"],
        "env": [["XOVER_RECHECK", "1"]],
        "server_command": "llama-server -m m.gguf -t 2",
        "response": 200,
        "depths": [0, 1024],
        "chunk": 512,
        "workload": "uniform",
        "backend": "CPU",
        "knobs": [],
        **extra,
    }


def test_a_tuning_result_reads_its_search_through_the_reader_it_is_given() -> None:
    search = _search()
    body = _tune_body("cpu", "cpu tuned", search=dataclasses.asdict(search), placed_trials=True)
    r = TuneRecord.from_body(body, lambda raw: raw["recommended"])
    assert (r.config, r.variant, r.signature, r.setting, r.setting_label) == (
        "cpu",
        "cpu tuned",
        "k" * 16,
        (("threads", "2"),),
        "t=2",
    )
    assert r.env == (("XOVER_RECHECK", "1"),) and r.depths == (0, 1024) and r.chunk == 512 and r.placed_trials
    assert r.server_args == ("-t", "2") and r.backend == "CPU" and r.note == ""
    assert r.search == dataclasses.asdict(search)["recommended"]
    assert TuneRecord.from_body(body).search is None  # without a reader the search is not read

    def fails(raw: Any) -> Any:
        raise KeyError("trials")

    unread = TuneRecord.from_body(body, fails)
    assert unread.search is None and unread.note == "the stored search could not be read (KeyError: 'trials')"
    old = TuneRecord.from_body({"schema": art.TUNE_SCHEMA, "config": "a"})
    assert (old.variant, old.response, old.chunk, old.depths, old.signature, old.placed_trials) == (
        None,
        None,
        None,
        (),
        None,
        False,
    )
    for other in ({"schema": "xover.tune/0", "config": "a"}, {"schema": art.TUNE_SCHEMA}, ["tune"]):
        with pytest.raises(UnreadableArtifact):
            TuneRecord.from_body(other)


def test_the_latest_tuning_of_each_configuration_in_first_seen_order() -> None:
    bodies = [
        _tune_body("gpu", response=100),
        _tune_body("cpu"),
        {"schema": "xover.tune/0", "config": "gpu"},  # another schema: ignored
        _tune_body("gpu", "gpu tuned", response=300),
        _tune_body("cpu", response="many"),  # unreadable: left out
        "garbage",
    ]
    found = latest_tunes(bodies)
    assert [(r.config, r.variant, r.response) for r in found] == [("gpu", "gpu tuned", 300)]


def test_the_study_record_writes_the_json_the_study_always_stored() -> None:
    body = {"configs": ["a", "b"], "pairs": [["a", "b"]], "response_tokens": [64, 128], "band": [500, 900]}
    r = StudyRecord.from_body(body)
    assert r == StudyRecord(("a", "b"), (("a", "b"),), (64, 128), (500, 900))
    assert r.to_body() == body and r.turns == ((64, 128), (500, 900))
    with_decode = StudyRecord.from_body({**body, "decode_tokens": 32})
    assert with_decode.decode_tokens == 32 and with_decode.to_body() == {**body, "decode_tokens": 32}
    old = StudyRecord.from_body({"configs": ["a"], "pairs": [["a", "b", "c"]]})
    assert old.pairs == () and old.turns is None and old.band is None
    assert StudyRecord.from_body({**body, "band": [1]}).turns is None
    assert readable(StudyRecord.from_body, ["a"]) is None


def test_fit_records_read_the_plan_and_llama_cpp_s_check() -> None:
    plan = FitRecord.from_body(_plan())
    assert (plan.config, plan.request, plan.n_ctx, plan.n_cpu_moe, plan.level, plan.limit) == (
        "fit@8k",
        "fit@8192",
        8704,
        10,
        10,
        8192,
    )
    assert plan.ubatch == 512 and plan.checks == () and plan.measured_at is None and not plan.llama_fit_asked
    assert plan.estimate == art.FitEstimate(6, 1, 2, 3) and plan.body == _plan()
    own = {"args": "-ngl 49", "n_ctx": 8704, "n_gpu_layers": 49, "cpu_expert_layers": [40, 41], "partial_layers": [40]}
    checked = FitRecord.from_body(
        _plan(
            request="fit",
            ubatch=4096,
            checks=[_check(10, False, "oom"), _check(11, True)],
            measured_at=11,
            llama_fit=own,
            llama_fit_log="",
        )
    )
    assert checked.level == 11 and checked.limit is None and checked.ubatch == 4096
    assert checked.checks == (art.FitLevelCheck(10, False, False, "oom"), art.FitLevelCheck(11, True, True, None))
    assert checked.llama_fit_asked and checked.llama_fit == art.FitParamsChoice("-ngl 49", 8704, 49, (40, 41), (40,))
    no_answer = FitRecord.from_body(_plan(llama_fit=None, llama_fit_log="no fit-params output"))
    assert no_answer.llama_fit_asked and no_answer.llama_fit is None and no_answer.llama_fit_log.startswith("no fit")
    assert fit_records([_plan(), _plan("fit@32k")])[1].config == "fit@32k"
    broken: Any
    for broken in ({"records": []}, [{"config": "x"}], [_plan(n_ctx="long")]):
        with pytest.raises(UnreadableArtifact):
            fit_records(broken)


def test_a_skipped_point() -> None:
    body = {
        "config": "slow",
        "config_key": "k",
        "length": 16384,
        "rep": 1,
        "estimate_s": 230.5,
        "from_length": 4096,
        "max_ttft_s": 60,
    }
    assert SkippedPoint.from_body(body) == SkippedPoint("slow", 16384, 230.5, 4096, 60.0, "k", 1)
    assert SkippedPoint.from_body({k: v for k, v in body.items() if k not in ("config_key", "rep")}).rep == 0
    assert readable(SkippedPoint.from_body, {"config": "slow", "length": 1}) is None


# ---- the read model ---------------------------------------------------------------------------------


def test_the_read_model_hands_out_the_records_and_skips_what_it_cannot_read(tmp_path: Path) -> None:
    with Store(tmp_path) as st:
        st.add_artifact(None, "prediction", ["not a prediction"])
        st.add_artifact(None, "prediction", {"schema": "xover.prediction/1", "created_unix_ns": 7})
        st.add_artifact(None, "prediction", {"schema": "xover.prediction/1", "created_unix_ns": 9})
        st.add_artifact(None, "study", {"configs": ["a"], "pairs": [], "response_tokens": [200], "band": [1, 2]})
        st.add_artifact(
            None, "study", {"configs": ["b", "a"], "pairs": [["b", "a"]], "response_tokens": [64], "band": [10, 20]}
        )
        st.add_artifact(None, "study", "damaged")
        st.add_artifact(None, "tune", _tune_body("a", "a tuned"))
        st.add_artifact(None, "fit", [_plan("fit@8k"), _plan("fit@32k", "fit@32768", 16)])
        st.add_artifact(None, "fit-check", [_plan("fit@8k", checks=[_check(10, True)], measured_at=12)])
        st.add_artifact(None, "fit-tuned", [_plan("fit@8k tuned", "fit@4096", 14)])
        for length, estimate in ((16384, 200.0), (32768, 400.0), (16384, 210.0)):
            st.add_artifact(
                None,
                "ttft-skipped",
                {"config": "fit@8k", "length": length, "estimate_s": estimate, "from_length": 4096, "max_ttft_s": 60.0},
            )
        st.add_artifact(None, "ttft-skipped", {"config": "fit@8k"})
    data = load(tmp_path)
    pred = data.prediction()
    assert pred is not None and pred.created_unix_ns == 7  # the first readable one
    assert data.study_record() == StudyRecord(("b", "a"), (("b", "a"),), (64,), (10, 20))
    assert data.recorded_turns() == ((64,), (10, 20))
    (tuned,) = data.tune_results()
    assert tuned.variant == "a tuned" and tuned.search is None and tuned.note == ""
    plans, checks = data.fit_records(), data.fit_records(checked=True)
    assert plans is not None and [r.config for r in plans] == ["fit@8k", "fit@32k"]
    assert checks is not None and [r.level for r in checks] == [12]
    assert data.fit_records(art.TUNED, checked=True) is None
    # llama.cpp's check where it ran, else the planner's; then the tuned variants'
    assert [(r.config, r.level) for r in fit_placements(data)] == [("fit@8k", 12), ("fit@8k tuned", 14)]
    assert placement_limits(data) == {"fit@8k": 8192, "fit@8k tuned": 4096}
    assert {k: p.estimate_s for k, p in data.skipped_points().items()} == {
        ("fit@8k", 16384): 210.0,
        ("fit@8k", 32768): 400.0,
    }
    assert too_slow(data) == {"fit@8k": {16384: 210.0, 32768: 400.0}}


def test_a_store_without_these_artifacts(tmp_path: Path) -> None:
    Store(tmp_path).close()
    data = load(tmp_path)
    assert data.prediction() is None and data.study_record() is None and data.recorded_turns() is None
    assert data.tune_results() == () and data.fit_records() is None and data.skipped_points() == {}
    assert fit_placements(data) == [] and placement_limits(data) == {}


def test_the_committed_24_gib_study_reads_typed(tmp_path: Path) -> None:
    copy = tmp_path / "g24"
    copy.mkdir()
    shutil.copy(ROOT / "studies" / "h200-gpt-oss-120b-budgets" / "g24" / "results.sqlite", copy / "results.sqlite")
    data = load(copy)
    pred = data.prediction()
    assert pred is not None and pred.schema == "xover.prediction/1" and pred.configs[0].shown_label == "fit@32k"
    assert pred.hardware is not None and pred.response_tokens == 200
    study = data.study_record()
    assert study is not None and study.configs == ("fit@32k",) and study.decode_tokens == 32
    (tuned,) = data.tune_results()
    assert tuned.config == "fit@32k" and tuned.variant == "fit@32k tuned" and tuned.note == ""
    assert isinstance(tuned.search, advise.Search) and tuned.signature is not None
    (placed,) = data.fit_records(checked=True) or ()
    assert (placed.request, placed.n_cpu_moe, placed.level, placed.llama_fit_asked) == ("fit@32768", 24, 24, True)
    (variant,) = data.fit_records(art.TUNED, checked=True) or ()
    assert variant.config == "fit@32k tuned" and variant.ubatch > 512
    assert sorted(data.skipped_points()) == [("fit@32k", 16384), ("fit@32k", 32768)]


def test_the_study_stores_its_layout_as_before_and_only_when_it_changed(tmp_path: Path) -> None:
    from xover.domain.config import LlamaConfig
    from xover.domain.study_spec import StudySpec
    from xover.measure.study import record_spec

    Store(tmp_path).close()
    a, b, c = (LlamaConfig(name) for name in "abc")
    spec = StudySpec(configs=(a, b, c), model_preset="tiny-moe", lengths=(1024, 4096), pairs=(("a", "c"),))
    record_spec(spec, tmp_path)
    record_spec(spec, tmp_path)  # unchanged: not stored again
    narrowed = dataclasses.replace(spec, configs=(b,), pairs=(), decode_tokens=16)
    record_spec(narrowed, tmp_path)  # --configs b: the order and the pairs stored before stay
    with Store(tmp_path) as st:
        bodies = [body for _, _, body in st.artifacts("study")]
    assert bodies == [
        {"configs": ["a", "b", "c"], "pairs": [["a", "c"]], "response_tokens": [200], "band": [10000, 40000]},
        {
            "configs": ["a", "b", "c"],
            "pairs": [["a", "c"]],
            "response_tokens": [200],
            "band": [10000, 40000],
            "decode_tokens": 16,
        },
    ]
    assert load(tmp_path).study_record() == StudyRecord(("a", "b", "c"), (("a", "c"),), (200,), (10000, 40000), 16)
