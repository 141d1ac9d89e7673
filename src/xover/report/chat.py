"""The report's section on chat-shaped prompts: each configuration's prompt of one length sent as an agent sends it
(many chat messages) beside the same length as one blob, on the same fresh servers (:mod:`xover.analysis.prompt_shape`).
"""

from __future__ import annotations

from collections.abc import Sequence

from xover.analysis.prompt_shape import pair_by_shape, shape_effects, summary
from xover.analysis.rounds import RatioInterval, too_few
from xover.domain.chat_prompts import MESSAGES_PER_1K, turns_for
from xover.domain.units import format_tokens
from xover.report.blocks import Block, table
from xover.results.read_model import StudyData, chat_inputs, crossover_inputs

TITLE = "Chat-shaped prompts"


def _ratio(iv: RatioInterval | None) -> str:
    if iv is None or too_few(iv):
        return "—"
    mark = "" if iv.decided else " (within noise)"
    return f"{iv.ratio:.3f}x ({iv.low:.3f}-{iv.high:.3f}){mark}"


def chat_blocks(data: StudyData, pairs: Sequence[tuple[str, str]]) -> list[Block]:
    """The section: the two shapes per configuration, the verdict, and each headline pair's ratio in either shape."""
    cold, chat = crossover_inputs(data), chat_inputs(data)
    effects = shape_effects(cold, chat)
    if not effects:
        return []
    length = effects[0].length
    out = [
        Block("h2", TITLE),
        Block(
            "p",
            "The cold prompts above are one token array each on /completion. Agents send /v1/chat/completions with "
            f"many messages, so at one length each fresh server also sent a prompt of exactly that length as chat: "
            f"the last turn of a generated agentic session (a system prompt, tool results, user and assistant turns; "
            f"{2 * turns_for(length)} messages at {format_tokens(length)}, about {MESSAGES_PER_1K:g} per 1K tokens), "
            "cut to the length as the server counts it with its chat template, after the server's cold samples, "
            "cold too (cache_n 0, prompt_n the length). Chat's TTFT over the blob's is paired within each server and "
            "called different only where its interval over the rounds excludes 1.",
        ),
        Block("p", summary(effects)),
    ]
    rows = [
        [
            e.config,
            format_tokens(e.length),
            f"{e.blob_s * 1000:.1f}",
            f"{e.chat_s * 1000:.1f}",
            _ratio(e.interval) if e.interval is not None and not too_few(e.interval) else e.describe().split(": ")[-1],
        ]
        for e in effects
    ]
    out.append(table(["config", "length", "blob TTFT ms", "chat TTFT ms", "chat / blob (95% interval)"], rows))
    by_cold = {c.label: c for c in cold}
    by_chat = {c.label: c for c in chat}
    lines = []
    for a, b in pairs:
        blob_iv, chat_iv = pair_by_shape(a, b, by_cold, by_chat, length)
        if too_few(blob_iv) and too_few(chat_iv):
            continue
        lines.append(f"{b} over {a} at {format_tokens(length)}: {_ratio(blob_iv)} as blobs, {_ratio(chat_iv)} as chat")
    if lines:
        out += [
            Block("p", "What the shape does to the headline pairs' cold TTFT ratio:"),
            Block("ul", items=tuple(lines)),
        ]
    return out


def shape_line(data: StudyData) -> str | None:
    """The verdict's line where chat-shaped prompts differ from blobs beyond the noise on some configuration (the
    cold verdicts, of blobs, then understate or overstate what an agent's prompts cost); None where they do not."""
    effects = [e for e in shape_effects(crossover_inputs(data), chat_inputs(data)) if e.differs]
    if not effects:
        return None
    return (
        "Prompt shape: "
        + "; ".join(e.describe() for e in effects)
        + (
            ". The cold verdicts above are of one-blob prompts: where chat is slower, an agent's prompts cost that much "
            "more (the report's 'Chat-shaped prompts' section)."
        )
    )
