"""The report's answer for a study of the user's own recording (``[study] workload``): the turns' distribution,
each configuration's waiting over them in minutes, the pairs' savings with their interval, and the replay's measured
waiting against the prediction. Pure: reads the read model, computes with :mod:`xover.analysis.your_turns`."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from xover.analysis.crossover import ConfigData, fit_cost_model
from xover.analysis.your_turns import (
    RecordedTurn,
    ReplayCheck,
    distribution,
    replay_check,
    round_models,
    saving,
    saving_line,
    waiting,
)
from xover.domain.units import format_tokens, format_wait
from xover.report import plots
from xover.report.blocks import Block, table
from xover.results.read_model import StudyData


def _turns(data: StudyData) -> list[RecordedTurn] | None:
    w = data.workload()
    return [RecordedTurn(p, c, a) for p, c, a in w.turns] if w is not None and w.turns else None


def _waits(data: StudyData, configs: Sequence[ConfigData]) -> dict[str, dict[int, float]]:
    turns = _turns(data) or []
    out = {}
    for c in configs:
        try:
            out[c.label] = waiting(round_models(c), turns)
        except ValueError:  # a round without decode samples: no model for it
            continue
    return {k: v for k, v in out.items() if v}


def verdicts(data: StudyData, configs: Sequence[ConfigData], pairs: Sequence[tuple[str, str]]) -> list[str]:
    """The verdict lines in minutes of waiting: the ranking, then each told pair's saving over the recorded turns
    (pairs measured in at least two shared rounds)."""
    turns, w = _turns(data), data.workload()
    if not turns or w is None:
        return []
    waits = _waits(data, configs)
    if not waits:
        return []
    ranked = sorted(waits, key=lambda k: statistics.median(waits[k].values()))
    head = (
        f"Your {len(turns)} recorded turns ({w.file}): waiting over all of them, predicted from each configuration's "
        "measured rounds: "
        + ", ".join(f"{k} {format_wait(statistics.median(waits[k].values()))}" for k in ranked)
        + "."
    )
    said = (
        saving(a, waits[a], b, waits[b], len(turns)) for a, b in dict.fromkeys(pairs) if a != b and {a, b} <= set(waits)
    )
    return [head, *(saving_line(s) for s in said if s is not None)]


def images(data: StudyData) -> list[tuple[str, str, bytes]]:
    """The report's plot of the recorded turns, where the study was sized from a recording."""
    w = data.workload()
    if w is None or not w.turns:
        return []
    return [("turns", "Your recorded turns: new tokens, cached prefix, answers", plots.turns_plot(w.turns))]


def blocks(data: StudyData, configs: Sequence[ConfigData]) -> list[Block]:
    turns = _turns(data)
    w = data.workload()
    if not turns or w is None:
        return []
    out = [
        Block("h2", "Your recorded turns"),
        Block(
            "p",
            f"The study was sized from {w.file} ({w.kind}, {len(turns)} turns with the recording server's token "
            "counts): its cold lengths span the contexts the turns reach, its cached turns are their typical new "
            "tokens on their typical cached prefix, its answers their typical length. Each configuration's waiting "
            "over the turns is predicted from its cost model, fitted per round of fresh servers to the round's cold "
            "TTFT and decode speeds: a turn waits for the prefill of its new tokens on top of its cached prefix and "
            "for its answer decoded on top of both.",
        ),
    ]
    rows = []
    for name, xs in (
        ("new tokens a turn", [t.new for t in turns]),
        ("cached prefix", [t.cached for t in turns]),
        ("whole prompt", [t.prompt for t in turns]),
        ("answer tokens", [t.answer for t in turns]),
    ):
        d = distribution(xs)
        rows.append([name, format_tokens(round(d.median)), format_tokens(round(d.p90)),
                     f"{format_tokens(round(d.low))}-{format_tokens(round(d.high))}"])  # fmt: skip
    cold = sum(t.cached == 0 for t in turns)
    out += [table(["per turn", "median", "90th percentile", "range"], rows),
            Block("p", f"{cold} of {len(turns)} turns found nothing in the server's cache.")]  # fmt: skip
    waits = _waits(data, configs)
    if waits:
        out.append(Block("h3", "Waiting over your turns, per configuration"))
        out.append(table(
            ["config", "rounds", "waiting in each round", "median"],
            [[k, str(len(v)), ", ".join(format_wait(x) for _, x in sorted(v.items())), format_wait(statistics.median(v.values()))]
             for k, v in sorted(waits.items(), key=lambda kv: statistics.median(kv[1].values()))],
        ))  # fmt: skip
    checks = _replay_checks(data, configs)
    if checks:
        out.append(Block("h3", "The replay against the prediction"))
        out.append(
            Block(
                "p",
                "The recording replayed on each configuration's real server (its requests as recorded, the server's "
                "default cache, the study's answer length): the waiting measured to the last token, against the "
                "cost model's prediction for the same turns (the replaying server's prompt, cached prefix and answer "
                "tokens).",
            )
        )
        out.append(table(
            ["config", "turns", "measured", "predicted", "prediction off by"],
            [[c.label, str(c.turns), format_wait(c.measured_s), format_wait(c.predicted_s), f"{c.off:+.0%}"] for c in checks],
        ))  # fmt: skip
    return out


def _replay_checks(data: StudyData, configs: Sequence[ConfigData]) -> list[ReplayCheck]:
    by_label = {c.label: c for c in configs}
    out = []
    for series in data.session:
        if series.mode != "default" or series.label not in by_label:
            continue
        replayed = [
            (RecordedTurn(t.prompt_tokens, t.cached_tokens or 0, t.completion_tokens), t.last_token_ns / 1e9)
            for t in series.turns
            if t.error is None and t.prompt_tokens and t.completion_tokens and t.last_token_ns
        ]
        if replayed:
            out.append(replay_check(series.label, fit_cost_model(by_label[series.label]), replayed))
    return out
