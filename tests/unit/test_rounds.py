"""The process as the unit of evidence (xover.analysis.rounds): known answers of the round statistics."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from xover.analysis.rounds import (
    RatioInterval,
    can_still_fall_below_one,
    drifted,
    order,
    paired_ratio,
    summarize_rounds,
    t975,
)


def test_student_t_quantiles() -> None:
    assert t975(1) == 12.706 and t975(2) == 4.303 and t975(9) == 2.262
    assert t975(21) == 2.086  # between tabulated values: the larger quantile (a wider interval)
    assert t975(1000) == 1.96
    with pytest.raises(ValueError):
        t975(0)


def test_rounds_alternate_so_linear_drift_falls_on_both() -> None:
    assert [order(["a", "b"], r) for r in range(4)] == [["a", "b"], ["b", "a"], ["a", "b"], ["b", "a"]]
    assert order(["a", "b", "c"], 1) == ["c", "b", "a"]
    shuffled = [order(["a", "b", "c", "d"], r, seed=7) for r in range(3)]
    assert shuffled == [order(["a", "b", "c", "d"], r, seed=7) for r in range(3)]  # seeded: the same again
    assert all(sorted(o) == ["a", "b", "c", "d"] for o in shuffled)


def test_round_summary_is_the_median_of_round_medians_and_their_spread() -> None:
    s = summarize_rounds({1: [1.0, 3.0, 2.0], 2: [2.5], 3: [1.5, 1.5], 4: []})
    assert s is not None and s.rounds == (1, 2, 3) and s.medians == (2.0, 2.5, 1.5)
    assert s.median == 2.0 and (s.low, s.high) == (1.5, 2.5) and s.spread() == pytest.approx(0.5)
    assert summarize_rounds({}) is None


def test_the_paired_interval_by_hand() -> None:
    a = {1: 1.0, 2: 1.1, 3: 0.9}
    b = {1: 1.2, 2: 1.3, 3: 1.1, 4: 5.0}  # round 4 has no partner: left out
    r = paired_ratio(a, b)
    logs = [math.log(1.0 / 1.2), math.log(1.1 / 1.3), math.log(0.9 / 1.1)]
    half = 4.303 * statistics.stdev(logs) / math.sqrt(3)
    assert r is not None and r.n == 3
    assert r.ratio == pytest.approx(math.exp(statistics.fmean(logs)))
    assert (r.low, r.high) == (
        pytest.approx(math.exp(statistics.fmean(logs) - half)),
        pytest.approx(math.exp(statistics.fmean(logs) + half)),
    )
    assert r.sign == -1 and r.describe("A", "B").startswith("A faster than B: A takes 0.83x B's time (")


def test_a_difference_within_the_noise_between_rounds_names_no_winner() -> None:
    r = paired_ratio({1: 1.0, 2: 1.3, 3: 0.95}, {1: 1.1, 2: 1.0, 3: 1.05})
    assert r is not None and r.low < 1 < r.high and r.sign == 0
    assert r.describe("A", "B").startswith("A and B indistinguishable here")
    assert paired_ratio({1: 1.0}, {1: 2.0}) is None  # one round: no spread between rounds to judge by
    two = paired_ratio({1: 1.0, 2: 1.01}, {1: 2.0, 2: 2.0})  # a 2x difference, but 2 rounds decide nothing
    assert two is not None and two.high < 1 and not two.decided and two.sign == 0


def test_identical_ratios_in_three_rounds_decide() -> None:
    r = paired_ratio({1: 0.85, 2: 0.85, 3: 0.85}, {1: 1.0, 2: 1.0, 3: 1.0})
    assert r == RatioInterval(pytest.approx(0.85), pytest.approx(0.85), pytest.approx(0.85), 3)
    assert r is not None and r.sign == -1


def _ratios(*logs: float) -> tuple[dict[int, float], dict[int, float]]:
    """A's round times over B's as the given log-ratios (B takes 1 s every round)."""
    return {i: math.exp(x) for i, x in enumerate(logs, 1)}, {i: 1.0 for i in range(1, len(logs) + 1)}


def test_what_rounds_left_could_still_call_faster_by_hand() -> None:
    """Two rounds 5 % and 3 % faster can still be confirmed in a third; one round slower never can be in 3 or 4
    rounds: with one log-ratio x > 0 and k more rounds, the interval's upper end is lowest when the k are equal to
    x (no spread), which leaves it at x > 0. With 5 rounds it could (four rounds far enough below). One faster and one
    slower round (-5 %, +2 %) cannot be confirmed in 3 or 4 rounds; in 4 the best the next two can do is an upper
    end of exp(0.0232) by hand: d = -0.5 sqrt(Q / (b (c^2 b - 1/4))) with Q = 0.00245, b = 1, c = 3.182 / sqrt 12."""
    assert can_still_fall_below_one(*_ratios(-0.05, -0.03), most=3)
    assert not can_still_fall_below_one(*_ratios(0.01), most=3)
    assert not can_still_fall_below_one(*_ratios(0.01), most=4)
    assert can_still_fall_below_one(*_ratios(0.01), most=5)
    assert not can_still_fall_below_one(*_ratios(-0.05, 0.02), most=4)
    a, b = _ratios(-0.05, 0.02, -0.05, -0.05)  # the two rounds the bound says are best: upper end exp(0.0232)
    r = paired_ratio(a, b)
    assert r is not None and math.log(r.high) == pytest.approx(0.0232, abs=3e-4)
    assert can_still_fall_below_one({}, {}, most=3) and not can_still_fall_below_one({}, {}, most=2)
    assert not can_still_fall_below_one(*_ratios(-0.05, -0.03, -0.04), most=3)  # no round left


def test_no_rounds_the_bound_rules_out_could_have_called_it_faster() -> None:
    """Against brute force: where the bound says no, no rounds left (random, spread or not, up to the most allowed)
    put the interval below 1; where it says yes, some equal rounds do."""
    rng = random.Random(7)
    for _ in range(600):
        n = rng.randint(1, 3)
        most = rng.randint(max(n + 1, 3), 5)
        logs = [rng.gauss(0.0, 0.05) for _ in range(n)]
        a, b = _ratios(*logs)
        ok = can_still_fall_below_one(a, b, most)
        tries = [
            logs + [rng.gauss(rng.uniform(-0.4, 0.1), rng.uniform(0.0, 0.05)) for _ in range(m - n)]
            for m in range(max(n + 1, 3), most + 1)
            for _ in range(40)
        ] + [logs + [v / 200] * (m - n) for m in range(max(n + 1, 3), most + 1) for v in range(-120, 20)]
        below = any((r := paired_ratio(*_ratios(*t))) is not None and r.high < 1 for t in tries)
        if not ok:
            assert not below, (logs, most)
        elif below is False:  # the equal rounds that reach it may lie between the grid's steps: a finer look
            fine = [logs + [v / 20000] * (m - n) for m in range(max(n + 1, 3), most + 1) for v in range(-12000, 2000)]
            assert any((r := paired_ratio(*_ratios(*t))) is not None and r.high < 1 for t in fine), (logs, most)


def test_drift_beyond_the_rounds_spread() -> None:
    s = summarize_rounds({1: [1.0], 2: [1.2], 3: [1.1]})
    assert s is not None
    assert drifted(s, 1.15) is None
    assert drifted(s, 1.5) == pytest.approx(0.25) and drifted(s, 0.8) == pytest.approx(-0.2)


def _config(label: str, ttft: dict[int, float]):  # type: ignore[no-untyped-def]
    """A configuration measured in rounds at 1K, decode so fast the total is the TTFT."""
    from xover.analysis.crossover import ConfigData

    rounds = {1024: {n: (t, 1e9) for n, t in ttft.items()}}
    return ConfigData(label, {1024: list(ttft.values())}, {1024: [1e9] * len(ttft)}, rounds=rounds)


def test_what_would_settle_a_pair_the_rounds_left_open() -> None:
    from xover.analysis.crossover import compare_pair
    from xover.report.rounds import open_lines

    b = _config("b", {1: 1.0, 2: 1.0, 3: 1.0})
    near = compare_pair(_config("a", {1: 0.90, 2: 0.97, 3: 0.93}), b, 100, n_boot=0)  # ~7 % faster, 3 rounds
    assert near.separated == (0,) and near.in_rounds
    (line,) = open_lines([near])
    assert line == (
        "a vs b stays open at 1K after 3 rounds: to settle it, 1K: about 4 rounds, if the difference holds at 7%."
    )
    noise = compare_pair(_config("a", {1: 1.0, 2: 1.2, 3: 0.85}), b, 100, n_boot=0)  # no difference, a noisy one
    (line,) = open_lines([noise])
    assert "no likely number of rounds" in line and "probably as fast as each other here" in line
    decided = compare_pair(_config("a", {1: 0.80, 2: 0.81, 3: 0.79}), b, 100, n_boot=0)
    assert decided.separated == (-1,) and open_lines([decided]) == []


def _prov(cpu: str = "cpu", gpu: str | None = None, cores: str = "2"):  # type: ignore[no-untyped-def]
    from fakes.records import provenance

    return provenance(cpu=cpu, gpu=gpu, extra=(("cpu_count", cores),))


def _store_rounds(study, ttft_by_round: dict[int, float], name: str = "a", prov=None) -> None:  # type: ignore[no-untyped-def]
    from xover.domain.config import LlamaConfig
    from xover.domain.records import ServerTimings, TtftSample
    from xover.results.store import Store

    with Store(study) as st:
        run = st.begin_run("ttft", ["xover", "study"], prov or _prov())
        config = LlamaConfig(name, (("threads", "1" if name == "a" else "2"),))
        st.put_config(config)
        for n, ttft_s in ttft_by_round.items():
            ns = int(ttft_s * 1e9)
            timings = ServerTimings(0, 1024, ns / 1e6, None, 100, 100.0, 1e9)
            sample = TtftSample(config.key, "cold", 1024, 0, f"p{n}", 0, ns, ns, ns, (ns,), 100, timings, True, round=n)
            st.add_ttft_sample(run, "mk", sample)


def test_a_drift_check_outside_the_spread_of_the_rounds_is_told(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from xover.report.rounds import drift_line
    from xover.results.read_model import crossover_inputs, load

    _store_rounds(tmp_path / "moved", {1: 1.0, 2: 1.1, 3: 1.05, -3: 1.5})
    data = load(tmp_path / "moved")
    assert [s.round for _, s in data.drift_samples()] == [-3] and len(data.cold_samples()) == 3
    line = drift_line(data, crossover_inputs(data), 100)
    assert line is not None and "a at 1K: 1.50 s a turn, 36% slower than any of its 3 rounds (1.00-1.10 s)" in line
    _store_rounds(tmp_path / "steady", {1: 1.0, 2: 1.1, 3: 1.05, -3: 1.08})
    data = load(tmp_path / "steady")
    assert drift_line(data, crossover_inputs(data), 100) is None


def test_the_evidence_line_says_when_a_lease_left_the_configurations_with_different_rounds(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The H200 engines study's lease ended in round 3 after one configuration's cold samples: the verdicts rest on
    2 rounds for the others, and the line says "2-3 rounds each", not "3 rounds"."""
    from xover.report.rounds import evidence_line
    from xover.results.read_model import load

    _store_rounds(tmp_path / "even", {1: 1.0, 2: 1.1, 3: 1.05})
    _store_rounds(tmp_path / "even", {1: 2.0, 2: 2.1, 3: 2.05, -3: 2.0}, name="b")  # a drift check is no round
    line = evidence_line(load(tmp_path / "even"))
    assert line is not None and line.startswith("Measured in rounds of fresh servers (3 rounds, the order")
    _store_rounds(tmp_path / "cut", {1: 1.0, 2: 1.1, 3: 1.05})
    _store_rounds(tmp_path / "cut", {1: 2.0, 2: 2.1}, name="b")
    line = evidence_line(load(tmp_path / "cut"))
    assert line is not None and line.startswith("Measured in rounds of fresh servers (2-3 rounds each, the order")


def test_the_evidence_line_says_whose_machine_the_verdicts_are(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Issue 46: the default study called fa=off faster at 512-4K on one 2-core machine and fa=on faster at 4K on
    three studies of another. The verdict names the machine its runs name (CPU, cores, GPU) and says the answer is
    that machine's; runs on two machines are both named."""
    from xover.report.rounds import evidence_line, machines
    from xover.results.read_model import load

    _store_rounds(tmp_path / "one", {1: 1.0, 2: 1.1, 3: 1.05}, prov=_prov("Xeon", "NVIDIA H200, 143771 MiB", "16"))
    line = evidence_line(load(tmp_path / "one"))
    assert line is not None and line.endswith(
        " indistinguishable here. Measured on Xeon (16 cores) and NVIDIA H200, 143771 MiB: the answers are that "
        "machine's, and another CPU or GPU may rank the configurations otherwise."
    )
    _store_rounds(tmp_path / "two", {1: 1.0, 2: 1.1, 3: 1.05}, prov=_prov("EPYC", None, "2"))
    _store_rounds(tmp_path / "two", {1: 2.0, 2: 2.1, 3: 2.05}, name="b", prov=_prov("Ryzen", None, "8"))
    from xover.report.rounds import LEGACY

    legacy = tmp_path / "legacy"  # one process per configuration: the same sentence after the legacy rule
    _store_rounds(legacy, {None: 1.0}, prov=_prov("Xeon", None, "2"))  # type: ignore[dict-item]
    legacy_line = evidence_line(load(legacy))
    assert legacy_line is not None and legacy_line.startswith(LEGACY)
    assert legacy_line.endswith(" Measured on Xeon (2 cores), no GPU: the answers are that machine's, and another CPU "
                                "or GPU may rank the configurations otherwise.")  # fmt: skip
    data = load(tmp_path / "two")
    assert machines(data) == ["EPYC (2 cores), no GPU", "Ryzen (8 cores), no GPU"]
    line = evidence_line(data)
    assert (
        line is not None
        and "Measured on 2 machines (EPYC (2 cores), no GPU; Ryzen (8 cores), no GPU): the answers are those machines'"
        in line
    )
