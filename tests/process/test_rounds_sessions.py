"""A round of fresh servers belongs to one session of the machine (one boot), on the fake llama-server and the study's
real cold TTFT stage (xover.measure.cold).

Seen on gpt-oss-20b (studies/h200-backends, on-h100): lease 4 ended inside round 1; lease 5, on another H100 host,
completed round 1's missing samples, so round 1 paired one host's servers with another's (the hosts were 1.4-1.6x
apart where the experts ran on the CPU). Now a resume in another boot leaves such a round as it is, and the open
question its missing samples leave is measured in a later round, on one host. In the same boot the round is
finished as before (a Ctrl-C and a resume).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from fakes.llama_server import fake_config
from xover.analysis.crossover import round_interval
from xover.domain.config import LlamaConfig
from xover.domain.study_spec import StudySpec
from xover.llamacpp.binaries import Binaries
from xover.measure import provenance
from xover.measure.cold import stage_ttft
from xover.measure.study import StageEvent, Study
from xover.results.read_model import crossover_inputs, load

LENGTH, RESPONSE = 512, 16


def _stage(
    configs: tuple[LlamaConfig, ...],
    study: Path,
    bins: Binaries,
    model: Path,
    compared: tuple[tuple[str, str], ...] | None = None,
    **rounds: int,
) -> list[str]:
    """The cold stage on ``configs``: the first and the last as its verdicts' pair, or, given ``compared``, no
    headline pair and ``compared`` as the pairs the report also tells. What the stage said."""
    spec = StudySpec(
        configs=configs,
        model_preset="tiny-moe",
        lengths=(LENGTH,),
        response_tokens=(RESPONSE,),
        repetitions=1,
        **rounds,  # type: ignore[arg-type]
    )
    events: list[StageEvent] = []
    st = Study(spec, model, bins, study, frozenset(), ("test",), events.append)
    pairs = [(configs[0].name, configs[-1].name)] if len(configs) > 1 and compared is None else []
    assert stage_ttft(st, pairs, compared or ()) == 0, [e.detail for e in events if e.status == "fail"]
    return [e.detail for e in events]


def _rounds(study: Path) -> dict[str, list[int]]:
    out: dict[str, set[int]] = {}
    for label, s in load(study).ttft:
        if s.round is not None and s.round > 0 and s.counted_cold:
            out.setdefault(label, set()).add(s.round)
    return {label: sorted(r) for label, r in out.items()}


def _decided(study: Path, a: str, b: str, rounds: int | None = None) -> bool:
    """Whether the rounds rule calls a winner between ``a`` and ``b`` over their stored rounds (the first ``rounds``
    of them only, given it): what decides whether a round past the study's ``rounds`` is measured."""
    by_label = {c.label: c for c in crossover_inputs(load(study))}
    first, second = (
        dataclasses.replace(c, rounds={L: {n: v for n, v in by.items() if rounds is None or n <= rounds}
                                       for L, by in c.rounds.items()})
        for c in (by_label[a], by_label[b])
    )  # fmt: skip
    interval = round_interval(first, second, LENGTH, RESPONSE)
    return interval is not None and interval.decided


def _c_joins_in_another_boot(
    study: Path, bins: Binaries, model: Path, monkeypatch: pytest.MonkeyPatch, max_rounds: int
) -> list[str]:
    """Rounds 1-3 of ``a`` and ``b`` in one boot, then, in the next, the stage with ``c`` added and ``max_rounds``:
    what the second stage said."""
    boot = study.parent / "boot_id"
    monkeypatch.setattr(provenance, "BOOT_ID", boot)
    a, b, c = fake_config("a", 2000, 100), fake_config("b", 1600, 100), fake_config("c", 1800, 100)
    boot.write_text("lease-1\n")
    _stage((a, b), study, bins, model, rounds=3, max_rounds=3)
    assert _rounds(study) == {"a": [1, 2, 3], "b": [1, 2, 3]}
    boot.write_text("lease-2\n")
    return _stage((a, b, c), study, bins, model, rounds=3, max_rounds=max_rounds)


@pytest.mark.parametrize("next_boot", ["lease-2", "lease-1"])
def test_a_round_begun_in_another_boot_is_left_and_a_later_round_pairs_its_missing_samples(
    next_boot: str, tmp_path: Path, fake_bins: Binaries, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    boot = tmp_path / "boot_id"
    monkeypatch.setattr(provenance, "BOOT_ID", boot)
    a, b = fake_config("a", 2000, 100), fake_config("b", 1600, 100)
    study = tmp_path / "study"
    boot.write_text("lease-1\n")
    _stage((a,), study, fake_bins, tiny_model, rounds=1, max_rounds=1)  # round 1 of a alone: the lease ended
    assert _rounds(study) == {"a": [1]}
    boot.write_text(f"{next_boot}\n")
    told = _stage((a, b), study, fake_bins, tiny_model, rounds=3, max_rounds=4)
    rounds = _rounds(study)
    if next_boot == "lease-1":  # the same boot: round 1 is finished, then rounds until the pair is answered
        # 3 shared rounds part a from b (a turn about 15 % apart), unless a stall of this machine left their interval
        # straddling 1: then round 4 measures both; max-rounds is said to leave a question open only where round 4
        # did not answer it either
        again = [] if _decided(study, "a", "b", rounds=3) else [4]
        assert rounds == {"a": [1, 2, 3, *again], "b": [1, 2, 3, *again]}, rounds
        assert not any("another session" in line for line in told)
        capped = [line for line in told if line.startswith("max-rounds")]
        assert len(capped) == (1 if again and not _decided(study, "a", "b") else 0), (capped, rounds)
        return
    # another boot: b is never measured in round 1; rounds 2-3 give the pair 2 shared rounds, too few, so round 4
    # measures both, in this boot
    assert rounds == {"a": [1, 2, 3, 4], "b": [2, 3, 4]}, rounds
    (line,) = [line for line in told if "another session" in line]
    assert line.startswith("round 1: begun in another session of this machine") and "unmeasured there: b" in line
    boots = {r.id: dict(r.provenance.extra).get("boot_id") for r in load(study).runs}
    assert sorted(set(boots.values())) == ["lease-1", "lease-2"]


def test_a_configuration_new_in_another_boot_is_measured_in_rounds_with_every_other(
    tmp_path: Path, fake_bins: Binaries, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rounds 1-3 complete in one boot; in the next, the spec gains ``c``. Those rounds are left as they are, so ``c``
    (no data there, so no open question yet) is measured in rounds 4-6 with ``a`` and ``b`` beside it, on one host.
    (The first version skipped rounds 1-3 and then measured only open questions: ``c`` was never measured, and the
    stage said every configuration's samples were stored.)"""
    study = tmp_path / "study"
    told = _c_joins_in_another_boot(study, fake_bins, tiny_model, monkeypatch, max_rounds=6)
    rounds = _rounds(study)
    assert rounds["c"] == [4, 5, 6] and rounds["a"] == rounds["b"] == [1, 2, 3, 4, 5, 6], rounds
    assert not any("nothing left to measure" in line for line in told)


def test_max_rounds_that_leave_points_open_say_so_and_what_raises_them(
    tmp_path: Path, fake_bins: Binaries, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Round numbers count from the store's first round: a resume in another boot whose ``max-rounds`` the stored
    rounds already reach measures nothing (lease 6 of studies/h200-backends found its spec's 4 reached after one
    round). The stage says which configurations it left open and what to raise, not that every sample is stored."""
    study = tmp_path / "study"
    told = _c_joins_in_another_boot(study, fake_bins, tiny_model, monkeypatch, max_rounds=3)
    assert _rounds(study) == {"a": [1, 2, 3], "b": [1, 2, 3]}  # nothing measured: rounds 1-3 are another boot's
    (line,) = [line for line in told if line.startswith("max-rounds")]
    assert line.startswith("max-rounds (3) reached with questions still open (a, b, c): raise max-rounds to measure")
    assert "round numbers count from the store's first round" in line
    assert not any("nothing left to measure" in line for line in told)


@pytest.mark.parametrize("told", [True, False])
def test_a_pair_the_report_tells_is_measured_together_until_it_shares_enough_rounds(
    told: bool, tmp_path: Path, fake_bins: Binaries, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lease 7 of studies/h200-backends: ``vk-cpu6`` had 4 rounds at 32K and ``vk-cpu6 tuned`` 6, but they shared 2
    (the rest were other sessions'), and no round measured them together again: neither lacked rounds of its own,
    and a configuration against its tuned variant was no headline pair. Here ``a`` has rounds 1-3 and ``b`` rounds
    2-4 from three boots; in a fourth, with the pair among those the report tells (``compared``), round 5 measures
    both, and then they share 3. Without it, nothing is measured."""
    boot = tmp_path / "boot_id"
    monkeypatch.setattr(provenance, "BOOT_ID", boot)
    a, b = fake_config("a", 2000, 100), fake_config("b", 1600, 100)
    study = tmp_path / "study"
    for n, configs, first, most in ((1, (a,), 1, 1), (2, (a, b), 3, 3), (3, (b,), 3, 4)):
        boot.write_text(f"lease-{n}\n")
        _stage(configs, study, fake_bins, tiny_model, compared=(), rounds=first, max_rounds=most)
    assert _rounds(study) == {"a": [1, 2, 3], "b": [2, 3, 4]}
    boot.write_text("lease-4\n")
    _stage((a, b), study, fake_bins, tiny_model, compared=(("a", "b"),) if told else (), rounds=3, max_rounds=6)
    if told:
        assert _rounds(study) == {"a": [1, 2, 3, 5], "b": [2, 3, 4, 5]}, _rounds(study)
    else:
        assert _rounds(study) == {"a": [1, 2, 3], "b": [2, 3, 4]}, _rounds(study)
