"""A kind of turn is entries (issue 47): domain.turn_kinds declares each kind (its [study] keys, sizes, depth and
stored mode), and each layer above holds one function per kind by name. These tests fail when a kind lacks one."""

from __future__ import annotations

from xover.domain.config import LlamaConfig
from xover.domain.records import ServerTimings, TtftSample
from xover.domain.study_spec import STUDY_KEYS, StudySpec
from xover.domain.turn_kinds import AFTER_COLD, CACHED, CHAT, COLD, TURN_KINDS, by_name, kind_of
from xover.measure.resume import ttft_todo
from xover.report.html import TURN_SECTIONS
from xover.results.read_model import TURN_INPUTS, StoredSample


def test_every_kind_has_its_spec_keys_inputs_and_section() -> None:
    names = [k.name for k in TURN_KINDS]
    assert len(set(names)) == len(names) and TURN_KINDS[0] is COLD
    for kind in TURN_KINDS:
        assert set(kind.spec_keys) <= STUDY_KEYS, kind.name
        assert kind.name in TURN_INPUTS, f"results.read_model.TURN_INPUTS lacks {kind.name!r}"
        assert by_name(kind.name) is kind
    for kind in AFTER_COLD:
        assert kind.name in TURN_SECTIONS, f"report.html.TURN_SECTIONS lacks {kind.name!r}"
    assert set(TURN_INPUTS) == set(names) and set(TURN_SECTIONS) == {k.name for k in AFTER_COLD}


def test_a_stored_mode_belongs_to_one_kind() -> None:
    assert kind_of("cold") is COLD and kind_of("chat") is CHAT
    assert kind_of(CACHED.mode(16384)) is CACHED and CACHED.mode(16384) == "cached:16384"
    assert kind_of("warm") is None and kind_of("cache:reuse") is None
    for kind in TURN_KINDS:
        assert [k for k in TURN_KINDS if k.owns(kind.mode(2048))] == [kind]


def _spec(**kw: object) -> StudySpec:
    a = LlamaConfig("a")
    small = LlamaConfig("small", (("threads", "2"),), max_context=4096)  # holds 2K + 512 + 64, not 2K + 2K + 64
    return StudySpec(
        configs=(a, small),
        model_preset="tiny-moe",
        lengths=(1024, 2048),
        response_tokens=(64,),
        repetitions=1,
        **kw,  # type: ignore[arg-type]
    )


def test_the_plan_asks_each_kind_for_what_its_context_holds() -> None:
    spec = _spec(cached_new_tokens=(512, 2048), cached_depth=2048)
    a, small = spec.configs
    assert CACHED.wanted(spec, a) == (512, 2048) and CACHED.wanted(spec, small) == (512,)
    assert COLD.wanted(spec, a) == (1024, 2048)
    # chat at one length: no length in the band (10K-40K), so the longest each configuration holds
    assert CHAT.wanted(spec, a) == (2048,) and CHAT.wanted(spec, small) == (2048,)
    todo = {t.config.name: t for t in ttft_todo(spec, [], "mk", 1)}
    assert todo["a"].missing == {1024: 1, 2048: 1}
    assert todo["a"].turns == {"chat": {2048: 1}, "cached": {512: 1, 2048: 1}}
    assert todo["small"].turns == {"chat": {2048: 1}, "cached": {512: 1}}
    # no cached turns asked for, chat off: neither kind plans anything
    off = _spec(chat_length=0)
    assert CACHED.wanted(off, a) == () and CHAT.wanted(off, a) == ()
    assert all(t.turns == {"chat": {}, "cached": {}} for t in ttft_todo(off, [], "mk", 1))
    # a length in the band: the shortest of them
    assert CHAT.wanted(_spec(band=(1000, 4000)), a) == (1024,)
    # ik_llama.cpp's server cannot make one (its /detokenize refuses a cut UTF-8 character): none there
    assert CHAT.wanted(spec, LlamaConfig("ik", engine="ik_llama.cpp")) == ()


def test_stored_samples_of_a_kind_count_in_its_round_only() -> None:
    spec = _spec(cached_new_tokens=(512,), cached_depth=2048)
    timings = ServerTimings(2048, 512, 100.0, 5.12, 8, 100.0, 80.0)
    s = TtftSample(spec.configs[0].key, CACHED.mode(2048), 512, 0, "p", 0, None, 10**8, 2 * 10**8, (), 1, timings, True, round=1)  # fmt: skip
    c = TtftSample(spec.configs[0].key, CHAT.mode(0), 2048, 0, "c", 0, None, 10**8, 2 * 10**8, (), 1, timings, True, round=1)  # fmt: skip
    stored = [StoredSample(1, 1, "a", s, "mk"), StoredSample(2, 1, "a", c, "mk")]
    assert ttft_todo(spec, stored, "mk", 1)[0].turns == {"chat": {}, "cached": {}}
    assert ttft_todo(spec, stored, "mk", 2)[0].turns == {"chat": {2048: 1}, "cached": {512: 1}}
