"""The report's cached agentic turns (xover.analysis.cached): the turns tools like Cline and Roo send once a
conversation is in llama-server's prompt cache, measured on the cold stage's fresh servers. Built from the read
model alone (:func:`xover.results.read_model.cached_inputs`)."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

from xover.analysis.advise import cached_workload
from xover.analysis.cached import cached_verdict, work_line
from xover.analysis.crossover import ConfigData, PairResult, compare_pair, fit_cost_model, measured_totals, round_totals
from xover.domain.units import format_tokens
from xover.report.blocks import Block, table
from xover.results.read_model import StudyData, cached_inputs

TITLE = "Cached agentic turns"


def cached_depth_of(data: StudyData) -> int | None:
    """The cached turns' context (the deepest measured); None without cached turns."""
    by_depth = data.cached_samples()
    return max(by_depth) if by_depth else None


def cached_pairs(data: StudyData, told: Sequence[tuple[str, str, str]], response: int) -> list[tuple[str, PairResult]]:
    """(prefix, pair) for each verdict pair both of whose sides measured cached turns (the same pairs, in the same
    order and with the same prefixes, as the cold verdicts)."""
    by_label = {c.label: c for c in cached_inputs(data)}
    out, seen = [], set()
    for prefix, a, b in told:
        if a == b or (a, b) in seen or a not in by_label or b not in by_label:
            continue
        seen.add((a, b))
        try:
            out.append((prefix, compare_pair(by_label[a], by_label[b], response, n_boot=0)))
        except ValueError:  # no turn size measured on both
            continue
    return out


def cached_verdicts(
    data: StudyData, told: Sequence[tuple[str, str, str]], response: int, cold: Sequence[ConfigData] = ()
) -> list[str]:
    """The verdicts on cached turns: each told pair both of whose sides measured them, and which configuration to
    run for which kind of work (cold prompts against cached turns, ``cold`` the cold verdicts' inputs)."""
    depth = cached_depth_of(data)
    if depth is None:
        return []
    lines = [prefix + cached_verdict(pair, depth) for prefix, pair in cached_pairs(data, told, response)]
    work = work_line(cold, cached_inputs(data, depth), response, depth)
    return lines + ([work] if work else [])


def _row(c: ConfigData, n: int, response: int) -> list[str]:
    rounds = round_totals(c, n, response)
    ttft = statistics.median(c.ttft_s[n])
    rates = sorted(c.decode_tps.get(n) or ())
    decode = statistics.median(rates) if rates else None
    totals = sorted(rounds.values())
    total = measured_totals(c, response)[n] if decode else None
    spread = f"{totals[0]:.3f}-{totals[-1]:.3f}" if len(totals) > 1 else "—"
    return [
        c.label,
        format_tokens(n),
        str(len(rounds)) if rounds else "—",
        f"{ttft * 1000:.1f}",
        (f"{decode:.1f}" + (f" ({rates[0]:.1f}-{rates[-1]:.1f})" if len(rates) > 1 else "")) if decode else "—",
        f"{total:.3f}" if total is not None else "—",
        spread,
    ]


def cached_blocks(data: StudyData, response: int) -> list[Block]:
    """The section: what a cached turn is here and each configuration's turns (the verdicts are the report's)."""
    depth = cached_depth_of(data)
    configs = cached_inputs(data)
    if depth is None or not configs:
        return []
    out = [
        Block("h2", TITLE),
        Block(
            "p",
            f"A cached turn resends the conversation: the first {format_tokens(depth)} tokens come from the slot's "
            "prompt cache (each sample's cache_n equals them, prompt_n its new tokens; or all but the one token a "
            "restored sliding-window checkpoint processes again) and only the new tokens are "
            f"prefilled, then a {response}-token answer is decoded on top of both. Measured on the cold stage's "
            "fresh servers (-np 1 --cache-ram 0: the slot is the only cache), after their cold samples, in the same "
            "rounds; a turn's total is its TTFT plus the answer at the decode speed the same request measured. "
            "Two configurations cross here in new tokens per turn, not in prompt length: a setting that loses "
            "every cold prompt can win every turn that adds a few thousand tokens.",
        ),
    ]
    rows = [_row(c, n, response) for c in configs for n in sorted(c.ttft_s)]
    out.append(
        table(
            [
                "config",
                "new tokens",
                "rounds",
                "TTFT ms (median)",
                "decode t/s (range)",
                f"total per turn, {response}-token answer (s)",
                "between rounds (s)",
            ],
            rows,
        )
    )
    agree = _against_bench(data, configs, depth)
    if agree:
        out += [
            Block(
                "p",
                f"The turns' decode against llama-bench's tg at the same depth ({format_tokens(depth)} tokens), "
                "measured in a process of its own: two ways to the same rate, which should agree within 5% or the "
                "turns' range, the wider.",
            ),
            Block("ul", items=tuple(agree)),
        ]
    return out


AGREE = 0.05  # two measurements of one decode rate agree within 5 %, or within the turns' own range where wider


def _against_bench(data: StudyData, configs: Sequence[ConfigData], depth: int) -> list[str]:
    """Per configuration with a llama-bench decode test at the cached depth: its rate against the turns' (they agree
    within :data:`AGREE` or the turns' range, the wider)."""
    bench: dict[str, float] = {}
    for label, r in data.bench:  # the latest tg test at the cached depth
        if r.n_gen and not r.n_prompt and r.n_depth == depth:
            bench[label] = r.avg_ts
    out = []
    for c in configs:
        rates = sorted(t for ts in c.decode_tps.values() for t in ts)
        if c.label not in bench or not rates:
            continue
        b, med = bench[c.label], statistics.median(rates)
        within = abs(b / med - 1) <= max(AGREE, (rates[-1] - rates[0]) / med)
        out.append(
            f"{c.label}: turns {med:.1f} t/s ({rates[0]:.1f}-{rates[-1]:.1f}, {len(rates)} turns), llama-bench "
            f"{b:.1f} t/s: " + ("they agree" if within else f"llama-bench {b / med - 1:+.0%} off the turns' median")
        )
    return out


def turns_workload(data: StudyData, response: int) -> Any | None:
    """The study's cached agentic turns as a workload for the tuning search's scores (the depth and turn sizes its
    cached samples were measured at); None without cached turns."""

    depth = cached_depth_of(data)
    if depth is None:
        return None
    sizes = sorted({s.length for _, s in data.cached_samples()[depth]})
    return cached_workload(sizes, depth, response)


def cached_ttft(data: StudyData) -> tuple[dict[str, Callable[[int], float]], int] | None:
    """Per configuration, the TTFT of a cached turn of N new tokens as fitted to its measured cached turns (the
    crossover's cost model), and their depth: what the session replay's turns are shown against."""
    depth = cached_depth_of(data)
    if depth is None:
        return None
    return {c.label: fit_cost_model(c).ttft for c in cached_inputs(data, depth)}, depth
