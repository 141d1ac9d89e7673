"""What the verdicts rest on: rounds of fresh servers (the process as the unit of evidence), or, for a study measured
before xover measured in rounds, one server process per configuration and the within-process rule. Pure: the read
model in, :class:`xover.report.blocks.Block` lists and lines out.

For a study measured in rounds the section shows, per configuration and length, each round's total time per turn,
the median of the round medians and the spread between rounds; the machine's load and stolen CPU per round where
they differ between configurations; the drift check (the first configuration measured once more at the end of the
stage, against the spread of its own rounds); and, for each question the rounds left open, what would settle it.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence

from xover.analysis.crossover import ConfigData, PairResult, round_totals
from xover.analysis.rounds import MIN_ROUNDS, RoundSummary, drifted, rounds_to_settle
from xover.domain.artifacts import TTFT_EFFICIENCY
from xover.domain.records import cached_depth
from xover.domain.units import format_tokens
from xover.report.blocks import Block, table
from xover.results.read_model import SESSION_GAP_S, StudyData

LEGACY = (
    "Measured before xover measured in rounds: one server process per configuration. Its verdicts keep the "
    "within-process rule (a difference is called where the samples' ranges do not overlap), which cannot see the "
    "drift between processes; `xover study --remeasure ttft` measures its cold TTFT again in rounds of fresh servers."
)


def evidence_line(data: StudyData) -> str | None:
    """The sentence that says what a study's verdicts rest on; None for a study without cold TTFT."""
    if not data.cold_samples():
        return None
    if not data.in_rounds:
        return LEGACY + whose_machine(data)
    rounds_of: dict[str, set[int]] = {}
    for label, s in data.cold_samples():
        if s.round and s.round > 0:
            rounds_of.setdefault(label, set()).add(s.round)
    counts = sorted({len(r) for r in rounds_of.values()})
    n = max((s.round or 0) for _, s in data.cold_samples())
    # a lease that ended mid-round leaves the configurations with different counts: say so
    rounds = f"{n} round{'s' if n != 1 else ''}" if len(counts) < 2 else f"{counts[0]}-{counts[-1]} rounds each"
    return (
        f"Measured in rounds of fresh servers ({rounds}, the order alternating between "
        "rounds): a configuration is faster only where the 95% interval of its total time per turn over the other's, "
        f"paired by round, excludes 1; otherwise the two are indistinguishable here.{whose_machine(data)}"
    )


def whose_machine(data: StudyData) -> str:
    """The sentence that says whose machine the verdicts are (with a leading space); empty where no run names one."""
    found = machines(data)
    if not found:
        return ""
    if len(found) == 1:
        return (
            f" Measured on {found[0]}: the answers are that machine's, and another CPU or GPU may rank the "
            "configurations otherwise."
        )
    return (
        f" Measured on {len(found)} machines ({'; '.join(found)}): the answers are those machines', and another CPU "
        "or GPU may rank the configurations otherwise."
    )


def machines(data: StudyData) -> list[str]:
    """The machines a study's runs were measured on, as their provenance names them (the CPU, its cores, the GPU),
    in the order they first appear; none where no run names one. A verdict is that machine's: the same study on
    another CPU or GPU may rank the configurations otherwise (issue 46: fa=off won 512-4K on one 2-core machine,
    fa=on won 4K on another)."""
    seen: list[str] = []
    for run in data.runs:
        p = run.provenance
        if p.cpu_info is None and p.gpu_info is None:
            continue
        cores = dict(p.extra).get("cpu_count")
        cpu = f"{p.cpu_info or 'an unnamed CPU'}{f' ({cores} cores)' if cores else ''}"
        name = f"{cpu} and {p.gpu_info}" if p.gpu_info else f"{cpu}, no GPU"
        if name not in seen:
            seen.append(name)
    return seen


def _rounds_needed(pair: PairResult, i: int) -> str:
    """What would settle a length the rounds left open: the rounds the observed difference and spread need, or
    that no likely number would."""
    r = pair.intervals[i] if i < len(pair.intervals) else None
    if r is None:
        return f"measure both in at least {MIN_ROUNDS} rounds"
    if r.n < 2 or r.high <= r.ratio:
        return "more rounds"
    n = rounds_to_settle(r)
    if n is not None:
        return f"about {n} rounds, if the difference holds at {abs(r.ratio - 1):.0%}"
    return (
        f"no likely number of rounds: the difference ({abs(r.ratio - 1):.0%}) is small against the spread between "
        f"rounds; they are probably as fast as each other here"
    )


def open_lines(pairs: Sequence[PairResult]) -> list[str]:
    """One line per pair whose rounds left a length open: where, after how many rounds, and what would settle it."""
    out = []
    for p in pairs:
        if not p.in_rounds:
            continue
        open_at = [i for i, s in enumerate(p.separated) if s == 0]
        if not open_at:
            continue
        where = ", ".join(format_tokens(p.lengths[i]) for i in open_at)
        settle = "; ".join(f"{format_tokens(p.lengths[i])}: {_rounds_needed(p, i)}" for i in open_at)
        out.append(f"{p.a} vs {p.b} stays open at {where} after {p.rounds_told()}: to settle it, {settle}.")
    return out


def drift_line(data: StudyData, configs: Sequence[ConfigData], response: int) -> str | None:
    """Whether the first configuration, measured once more at the end of the stage, moved beyond its rounds' spread."""
    drift = data.drift_samples()
    if not drift:
        return None
    by_label = {c.label: c for c in configs}
    moved = []
    for label in dict.fromkeys(lb for lb, _ in drift):
        config = by_label.get(label)
        if config is None:
            continue
        for length in sorted({s.length for lb, s in drift if lb == label}):
            totals = round_totals(config, length, response)
            samples = [s for lb, s in drift if lb == label and s.length == length]
            decode = [s.timings.predicted_per_second for s in samples if s.timings and s.timings.predicted_per_second]
            if not totals or not decode:
                continue
            again = statistics.median(s.first_token_ns / 1e9 for s in samples if s.first_token_ns) + response / (
                statistics.median(decode)
            )
            summary = RoundSummary.of(totals)
            d = drifted(summary, again)
            if d is not None:
                moved.append(
                    f"{label} at {format_tokens(length)}: {again:.2f} s a turn, {abs(d):.0%} "
                    f"{'slower' if d > 0 else 'faster'} than any of its {summary.n} rounds ({summary.low:.2f}-"
                    f"{summary.high:.2f} s)"
                )
    if not moved:
        return None
    return (
        "The machine drifted during the cold TTFT stage: measured once more at its end, "
        + "; ".join(moved)
        + ". The alternating order spreads such drift over every configuration, but compare totals across sessions "
        "with care."
    )


def _machine_rows(data: StudyData) -> list[tuple[str, ...]]:
    """Per configuration: the load average at its servers' starts and the CPU stolen over their lives, per round."""
    load: dict[int, str] = {}
    for run in data.runs:
        extra = dict(run.provenance.extra)
        if "loadavg_1m" in extra:
            load[run.id] = extra["loadavg_1m"]
    rows: dict[str, list[str]] = defaultdict(list)
    steal: dict[str, list[float]] = defaultdict(list)
    for a in data.artifacts:
        body = a.body
        if a.name != TTFT_EFFICIENCY or not isinstance(body, dict) or body.get("round") is None:
            continue
        label = str(body.get("label"))
        if a.run_id in load:
            rows[label].append(load[a.run_id])
        if isinstance(body.get("cpu_steal"), (int, float)):
            steal[label].append(float(body["cpu_steal"]))
    out: list[tuple[str, ...]] = []
    for label in dict.fromkeys([*rows, *steal]):
        loads = rows.get(label, [])
        st = steal.get(label, [])
        out.append((label, ", ".join(loads) or "-", f"{min(st):.1%}-{max(st):.1%}" if st else "-"))
    return out


def rounds_blocks(data: StudyData, configs: Sequence[ConfigData], response: int) -> list[Block]:
    """The section: each configuration's rounds (total time per turn), their median and spread, and the machine per
    round. Empty for a study measured before rounds (its evidence line says so)."""
    if not data.in_rounds:
        return []
    rows = []
    for c in configs:
        for length in sorted(c.rounds):
            totals = round_totals(c, length, response)
            if not totals:
                continue
            s = RoundSummary.of(totals)
            rows.append(
                (
                    c.label,
                    format_tokens(length),
                    str(s.n),
                    ", ".join(f"{t:.3f}" for t in s.medians),
                    f"{s.median:.3f}",
                    f"{s.low:.3f}-{s.high:.3f} ({s.spread():.0%})",
                )
            )
    blocks = [
        Block("h2", "Rounds of fresh servers"),
        Block(
            "p",
            "Each round starts every configuration's llama-server afresh (a discarded warm-up, then its cold samples), "
            f"in an order that alternates between rounds. A configuration's total time per turn ({response}-token "
            "responses) is the median of its round medians; the spread that decides is the one between rounds. "
            "Verdicts pair the rounds of two configurations and call one faster only where the 95% t interval of "
            "their ratio excludes 1.",
        ),
        table(
            [
                "config",
                "prompt",
                "rounds",
                "total per turn in each round (s)",
                "median of rounds (s)",
                "between rounds (s)",
            ],
            rows,
        ),
    ]
    left = left_out_line(data)
    if left:
        blocks.append(Block("p", left))
    machine = _machine_rows(data)
    if machine:
        blocks += [
            Block(
                "p",
                "The machine in each round: the load average when each server started, and the share of CPU time the "
                "hypervisor stole over its life (a shared machine's noise).",
            ),
            table(["config", "load average at each start", "CPU stolen"], machine),
        ]
    return blocks


def left_out_line(data: StudyData) -> str | None:
    """The samples :attr:`StudyData.off_session` leaves out of the rounds, per round and configuration; None where
    every round was measured in one session of the machine."""
    points: dict[tuple[int, str], dict[str, set[int]]] = defaultdict(lambda: defaultdict(set))
    for row in data.off_session_rows():
        s = row.sample
        depth = cached_depth(s.mode)
        kind = "cold" if depth is None else f"cached turns on {format_tokens(depth)}, new tokens"
        points[(s.round or 0, row.label)][kind].add(s.length)
    if not points:
        return None

    def config(label: str, kinds: dict[str, set[int]]) -> str:
        told = (f"{k} {', '.join(format_tokens(x) for x in sorted(sizes))}" for k, sizes in kinds.items())
        return f"{label} ({', '.join(told)})"

    where = "; ".join(
        f"round {n}: " + ", ".join(config(label, kinds) for (m, label), kinds in sorted(points.items()) if m == n)
        for n in sorted({n for n, _ in points})
    )
    return (
        f"Left out of the rounds: {where}. They were measured in another session of the machine than the one that "
        f"began their round (its boot id; runs stored without one are a session of their own, which ends where more "
        f"than {SESSION_GAP_S // 60} minutes pass between runs), and a round pairs servers measured together on one "
        "machine."
    )
