"""Confirmation rounds resumed across sessions (xover.measure.tune.confirm): a round is one session's pair."""

from __future__ import annotations

import pytest

from xover.analysis import advise
from xover.analysis.advise import Measurement, RateSamples
from xover.domain.config import LlamaConfig
from xover.domain.study_spec import StudySpec
from xover.measure import tune

NO_HOST = (("no-host", "1"),)


def _spec() -> StudySpec:
    return StudySpec(configs=(LlamaConfig("pinned"),), model_preset="tiny-moe", lengths=(1024,), rounds=3, max_rounds=3)


def _run(stored: dict[tuple[bool, int], float]) -> tuple[tune.Confirmation, list[tuple[str, int, bool]]]:
    """Decode at 6.5 t/s at the defaults and 22 t/s tuned for decode in this session; ``stored``: (tuned?, round) ->
    t/s an earlier session stored (reused unless asked afresh)."""
    calls: list[tuple[str, int, bool]] = []

    def measure(setting: advise.Setting, n: int, fresh: bool = False) -> Measurement:
        tuned = setting == NO_HOST
        calls.append(("tuned" if tuned else "defaults", n, fresh))
        old = None if fresh else stored.get((tuned, n))
        tps = old if old is not None else (22.0 if tuned else 6.5)
        return Measurement(decode=(RateSamples(0, 128, (tps, tps)),), reused=old is not None)

    c = tune.confirm(measure, NO_HOST, tune.workload(_spec()), _spec(), lambda *a: None, "pinned", part="decode")
    return c, calls


def test_a_round_half_stored_by_an_earlier_session_measures_its_stored_side_again() -> None:
    """Round 3's defaults were stored by a session that then ended (at 5 t/s on its machine); this session measures
    the other side and then the stored side again, so round 3 pairs two processes of one machine."""
    rounds = {(False, 1): 6.4, (True, 1): 21.0, (False, 2): 6.6, (True, 2): 20.0, (False, 3): 5.0}
    c, calls = _run(rounds)
    assert calls[-3:] == [("defaults", 3, False), ("tuned", 3, False), ("defaults", 3, True)]
    assert ("defaults", 1, True) not in calls and ("tuned", 2, True) not in calls  # whole rounds are kept
    decode_s = advise.decode_turn_s
    assert c.against_s[3] == decode_s(Measurement(decode=(RateSamples(0, 128, (6.5, 6.5)),)), tune.workload(_spec()))
    assert c.kept and c.interval is not None and c.interval.n == 3


def test_whole_rounds_from_one_session_are_not_measured_again() -> None:
    c, calls = _run({})
    assert [f for _, _, f in calls] == [False] * 6 and c.kept


def test_a_cached_turn_confirmation_prices_the_new_tokens_prefill_too() -> None:
    """Confirmed on cached turns (512 new tokens on 16K, 200-token answers): the setting that halves prefill and
    triples decode is kept, each round's times being the whole cached turn from the same process's tests."""
    turns = advise.cached_workload([512], 16384, 200)

    def measure(setting: advise.Setting, n: int, fresh: bool = False) -> Measurement:
        pp, tg = (500.0, 30.0) if setting == NO_HOST else (1000.0, 10.0)
        return Measurement(prefill=(RateSamples(0, 512, (pp, pp)),), decode=(RateSamples(0, 128, (tg, tg)),))

    c = tune.confirm(measure, NO_HOST, turns, _spec(), lambda *a: None, "pinned", part="cached")
    assert c.kept and c.part == "cached"
    assert c.against_s[1] == pytest.approx(512 / 1000 + 200 / 10) and c.tuned_s[1] == pytest.approx(
        512 / 500 + 200 / 30
    )
    assert tune.decode_variant_name("pinned", c.part) == "pinned tuned for cached turns"
    assert tune.base_name("pinned tuned for cached turns") == "pinned"


def _sequence(times: dict[int, tuple[float, float]], most: int) -> tuple[tune.Confirmation, list[str], list[str]]:
    """A whole-turn confirmation whose round n measures (defaults' s, tuned's s) = ``times[n]`` (prefill of 1,024
    tokens: the turn is prefill-bound), with at most ``most`` rounds; the processes run and the lines emitted."""
    calls: list[str] = []
    said: list[str] = []

    def measure(setting: advise.Setting, n: int, fresh: bool = False) -> Measurement:
        calls.append(f"{'tuned' if setting == NO_HOST else 'defaults'} {n}")
        s = times[n][1 if setting == NO_HOST else 0]
        return Measurement(
            prefill=(RateSamples(0, 1024, (1024 / s, 1024 / s)),), decode=(RateSamples(0, 128, (1e6, 1e6)),)
        )

    spec = StudySpec(
        configs=(LlamaConfig("pinned"),), model_preset="tiny-moe", lengths=(1024,), rounds=3, max_rounds=most
    )
    c = tune.confirm(measure, NO_HOST, tune.workload(spec), spec, lambda k, text, *a: said.append(text), "pinned")
    return c, calls, said


def test_a_confirmation_stops_where_no_round_left_could_call_the_setting_faster() -> None:
    """Slower in round 1: no two (or three) more rounds could put the interval below 1, so the setting would not be
    kept whatever they measured; the confirmation stops after one round's two processes instead of six, and says so.
    Faster in round 1 and slower in round 2 by as much, out of at most 4 rounds: it stops after round 2. Faster in
    every round: all 3 rounds, kept."""
    c, calls, said = _sequence({1: (1.0, 1.04)}, most=3)
    assert calls == ["defaults 1", "tuned 1"] and c.stopped == 3 and not c.kept
    assert said[-1].endswith("stopped after 1 of at most 3 rounds: no result of the rest could confirm it")
    assert "tuned took 1.04x" in said[-1]
    c, calls, said = _sequence({1: (1.0, 0.96), 2: (1.0, 1.04)}, most=4)
    assert len(calls) == 4 and c.stopped == 4 and not c.kept and c.interval is not None and c.interval.n == 2
    c, calls, said = _sequence({n: (1.0, 0.9) for n in (1, 2, 3)}, most=4)
    assert len(calls) == 6 and c.stopped is None and c.kept


def test_a_confirmation_goes_on_while_the_rounds_left_could_still_call_it_faster() -> None:
    """Faster by 5 % and then by 1 %: a third round could still confirm it, so it is measured (and round 4, allowed,
    where the third leaves it open)."""
    c, calls, _ = _sequence({1: (1.0, 0.95), 2: (1.0, 0.99), 3: (1.0, 0.97), 4: (1.0, 0.96)}, most=4)
    assert len(calls) >= 6 and c.stopped is None
