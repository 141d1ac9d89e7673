"""Known answer for issue 31's two tuned variants, on the fake llama-server: a machine where the setting tuned for
decode (half the prefill speed, twice the decode speed) wins short prompts and loses long ones. Both variants go
through the study's real cold TTFT stage in rounds of fresh servers (xover.measure.cold); the report shows both, says
which to run for which kind of turn, and where they cross.

Per turn of R = 32 response tokens: tuned L/4000 + 32/50 s, tuned for decode L/1000 + 32/100 s, equal at L = 427.
At 128 tokens they differ by 0.22 s a turn (0.67 s against 0.45 s): over 3 rounds, one stall of a busy 2-core machine
(150 ms and more) leaves that interval straddling 1, and the crossing unclaimed. As on a real machine, the study then
measures the open length in further rounds (max-rounds) until the interval answers it.
"""

from __future__ import annotations

import re
from pathlib import Path

from fakes.llama_server import fake_config
from xover.domain import artifacts
from xover.domain.study_spec import StudySpec
from xover.llamacpp.binaries import Binaries
from xover.measure.cold import stage_ttft
from xover.measure.study import StageEvent, Study
from xover.report.html import build_report, render_markdown
from xover.results.read_model import load
from xover.results.store import Store

RESPONSE = 32
LENGTHS = (128, 2048)
CROSSING = 427  # L / 4000 + 32 / 50 = L / 1000 + 32 / 100


def test_a_decode_tuned_variant_that_wins_short_prompts_is_shown_beside_the_tuned_one_with_their_crossing(
    tmp_path: Path, fake_bins: Binaries, tiny_model: Path
) -> None:
    tuned, for_decode = fake_config("x tuned", 4000, 50), fake_config("x tuned for decode", 1000, 100)
    spec = StudySpec(
        configs=(tuned, for_decode),
        model_preset="tiny-moe",
        lengths=LENGTHS,
        response_tokens=(RESPONSE,),
        decode_tokens=RESPONSE,
        repetitions=1,
        rounds=3,
        max_rounds=6,
    )
    events: list[StageEvent] = []
    study = Study(spec, tiny_model, fake_bins, tmp_path / "study", frozenset(), ("test",), events.append)
    assert stage_ttft(study, [(tuned.name, for_decode.name)]) == 0, [e.detail for e in events if e.status == "fail"]
    # what the tuning stage stores when decode's best setting differs from the whole turn's (xover.measure.tune)
    with Store(tmp_path / "study") as store:
        store.add_artifact(
            None,
            artifacts.TUNE,
            {
                "schema": artifacts.TUNE_SCHEMA,
                "config": "x",
                "variant": tuned.name,
                "setting_label": "lm=none ub=4096 b=4096",
                "server_command": "llama-server -m m.gguf -lm none -ub 4096 -b 4096",
                "decode_variant": for_decode.name,
                "decode_setting_label": "nohost=1",
                "decode_server_command": "llama-server -m m.gguf --no-host",
                "decode_confirmation": {
                    "setting": [["no-host", "1"]],
                    "ratio": 0.5,
                    "low": 0.45,
                    "high": 0.55,
                    "n": 3,
                    "kept": True,
                    "against": [["load-mode", "none"]],
                    "part": "decode",
                },
            },
        )
    report = build_report(load(tmp_path / "study"), response=RESPONSE, n_boot=0)
    told = next(v for v in report.verdicts if v.startswith("Which to run for which kind of turn"))
    # the decode-tuned variant first below the crossing, the tuned one above it, the crossing near 427 tokens
    m = re.search(r"x tuned for decode is faster below ~([\d,]+) tokens and x tuned above", told)
    assert m is not None, told
    assert 0.7 * CROSSING < int(m.group(1).replace(",", "")) < 1.4 * CROSSING
    md = render_markdown(report)
    assert "x → x tuned for decode: nohost=1" in md and "llama-server -m m.gguf --no-host" in md
    assert "Decode against its limit" in md  # each variant's decode, side by side
    decode_rows = [line for line in md.splitlines() if line.startswith("| x tuned")]
    assert any("x tuned for decode" in r and "no-host" not in r for r in decode_rows)


def test_a_faster_decode_is_credited_to_settings_only_beyond_the_noise_between_rounds() -> None:
    from xover.report.decode import _physics
    from xover.report.tune import Layout

    lay = Layout(bases=("b",), tuned={"b": "b tuned"}, pairs=(), records=())
    served = {"b": (1024, 100.0), "b tuned": (1024, 105.0)}

    def told(rounds: dict[str, dict[int, float]]) -> str:
        blocks = _physics(lay, {}, served, rounds, {"b": 300.0, "b tuned": 300.0})
        return blocks[1].items[0]

    noisy = told({"b": {1: 100.0, 2: 110.0, 3: 95.0}, "b tuned": {1: 105.0, 2: 100.0, 3: 110.0}})
    assert "not faster than it beyond the noise between 3 rounds" in noisy and "no setting is credited" in noisy
    assert "33% of it is reached" in noisy  # the base's 100 t/s against the limit, not the variant's
    clear = told({"b": {1: 100.0, 2: 104.0, 3: 98.0}, "b tuned": {1: 150.0, 2: 160.0, 3: 155.0}})
    assert (
        "the best measured, b tuned, 105.0 t/s (5% of the time per token removed by settings, over 3 rounds)" in clear
    )
    legacy = told({})  # measured before rounds: said to rest on one process each
    assert "removed by settings, one process each)" in legacy
