"""A llama-server's log read back as the requests it served, and those as a shape-only session. Pure.

``xover record --from-log FILE`` works from what the server already wrote, at its default verbosity. Per request
(a task) the log holds:

- **llama.cpp** (pinned 0c1e570): ``slot launch_slot_: id S | task T | processing task`` with the log's clock
  (``M.SS.mmm.uuu`` since start) when it starts; ``prompt eval time = X ms / N tokens`` (the prompt's tokens the
  server evaluated, past its cache) and ``eval time = Y ms / M tokens`` (the answer); ``slot release: ... stop
  processing: n_tokens = K`` (the slot's context after it: the whole prompt and the answer's tokens but the last).
  At ``-lv 4`` and up a ``new prompt, ... task.n_tokens = P`` line gives the whole prompt directly. So the prompt is
  ``P``, else ``K - M + 1``, and the cached prefix is what it has beyond ``N``.
- **ik_llama.cpp** (0.1.5): ``slot is processing task | ... timestamp=U id_slot=S id_task=T`` (unix seconds);
  ``kv cache rm [p0, end) | ... id_task=T p0=C`` (the cached prefix); ``slot print_timing: id S | task T |`` then
  the same ``prompt eval time`` and ``eval time`` lines without the task; ``slot released | ... n_past=K`` (the
  prompt and the whole answer).

:func:`session_lines` turns the requests into the lines of a shape-only ``xover-session/1`` file
(:mod:`xover.domain.turn_shape`): each turn one user message whose blocks are the slot's previous context up to the
cached prefix (a block cut where the prefix ends keeps its hash: the same text, shorter) and one new block, so a
replay meets the same cached prefixes. The log holds no text, so nothing of it can leak into the file.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Sequence
from typing import Any

from xover.domain.turn_shape import Block
from xover.domain.workload import FORMAT
from xover.errors import XoverError

_TS = r"^(?:(?P<tm>\d+)\.(?P<ts>\d{2})\.(?P<tms>\d{3})\.(?P<tus>\d{3}) [IWEDT] )?"
_CPP = {
    "launch": re.compile(_TS + r"slot launch_slot_: id\s+(?P<slot>\d+) \| task (?P<task>\d+) \| processing task"),
    "new": re.compile(_TS + r"slot .*\| task (?P<task>\d+) \| new prompt, .*task\.n_tokens = (?P<n>\d+)"),
    "prompt": re.compile(
        _TS + r"slot print_timing: id\s+\d+ \| task (?P<task>\d+) \| prompt eval time =\s*"
        r"(?P<ms>[\d.]+) ms /\s*(?P<n>\d+) tokens"
    ),  # fmt: skip
    "eval": re.compile(
        _TS + r"slot print_timing: id\s+\d+ \| task (?P<task>\d+) \|\s+eval time =\s*"
        r"(?P<ms>[\d.]+) ms /\s*(?P<n>\d+) tokens"
    ),  # fmt: skip
    "release": re.compile(
        _TS + r"slot\s+release: id\s+\d+ \| task (?P<task>\d+) \| stop processing: "
        r"n_tokens = (?P<n>\d+)"
    ),  # fmt: skip
}
_IK = {
    "launch": re.compile(
        r"slot is processing task \|.* timestamp=(?P<t>\d+) id_slot=(?P<slot>\d+) id_task=(?P<task>\d+)"
    ),
    "p0": re.compile(r"kv cache rm \[p0, end\) \|.* id_task=(?P<task>\d+) p0=(?P<n>\d+)"),
    "timing": re.compile(r"^slot print_timing: id\s+\d+ \| task (?P<task>\d+) \|\s*$"),
    "prompt": re.compile(r"^\s*prompt eval time =\s*(?P<ms>[\d.]+) ms /\s*(?P<n>\d+) tokens"),
    "eval": re.compile(r"^\s*eval time =\s*(?P<ms>[\d.]+) ms /\s*(?P<n>\d+) tokens"),
    "release": re.compile(r"slot released \|.* id_task=(?P<task>\d+) .*n_past=(?P<n>\d+)"),
}
_TIMING_WORDS = ("prompt eval time", "eval time =")


@dataclasses.dataclass(frozen=True)
class LoggedRequest:
    task: int
    slot: int
    started_s: float | None  # on the log's clock (llama.cpp: since the server started; ik_llama.cpp: unix seconds)
    prompt_tokens: int  # the whole prompt
    cached_tokens: int  # its prefix taken from the slot's cache
    answer_tokens: int
    prompt_ms: float  # the server's time for the evaluated part
    decode_ms: float


@dataclasses.dataclass
class _Task:
    slot: int = 0
    started_s: float | None = None
    prompt_total: int | None = None  # llama.cpp -lv 4: the whole prompt
    cached: int | None = None  # ik_llama.cpp: p0
    evaluated: tuple[float, int] | None = None
    answer: tuple[float, int] | None = None
    context_after: int | None = None


def _clock(m: re.Match[str]) -> float | None:
    if m.group("tm") is None:
        return None
    return int(m["tm"]) * 60 + int(m["ts"]) + int(m["tms"]) / 1e3 + int(m["tus"]) / 1e6


def parse_log(text: str, source: str = "log") -> tuple[str, list[LoggedRequest]]:
    """The engine whose log ``text`` is, and every request it finished, in the order they started. A log of neither
    format, or a timing line neither reads, is one line naming the line."""
    tasks: dict[int, _Task] = {}
    engine: str | None = None
    timing_task: int | None = None  # ik_llama.cpp: the task of the print_timing header before its lines
    bad: tuple[int, str] | None = None
    first: tuple[int, str] | None = None
    for n, line in enumerate(text.splitlines(), start=1):
        if first is None and line.strip():
            first = (n, line)
        if m := _CPP["launch"].search(line):
            engine = engine or "llama.cpp"
            tasks[int(m["task"])] = _Task(slot=int(m["slot"]), started_s=_clock(m))
        elif m := _IK["launch"].search(line):
            engine = engine or "ik_llama.cpp"
            tasks[int(m["task"])] = _Task(slot=int(m["slot"]), started_s=float(m["t"]))
        elif (m := _CPP["new"].search(line)) and int(m["task"]) in tasks:
            tasks[int(m["task"])].prompt_total = int(m["n"])
        elif (m := _IK["p0"].search(line)) and int(m["task"]) in tasks:
            task = tasks[int(m["task"])]
            task.cached = task.cached if task.cached is not None else int(m["n"])
        elif m := _CPP["prompt"].search(line):
            _set(tasks, int(m["task"]), "evaluated", (float(m["ms"]), int(m["n"])))
        elif m := _CPP["eval"].search(line):
            _set(tasks, int(m["task"]), "answer", (float(m["ms"]), int(m["n"])))
        elif m := _CPP["release"].search(line):
            _set(tasks, int(m["task"]), "context_after", int(m["n"]))
        elif m := _IK["timing"].search(line):
            timing_task = int(m["task"])
        elif (m := _IK["prompt"].search(line)) and timing_task is not None:
            _set(tasks, timing_task, "evaluated", (float(m["ms"]), int(m["n"])))
        elif (m := _IK["eval"].search(line)) and timing_task is not None:
            _set(tasks, timing_task, "answer", (float(m["ms"]), int(m["n"])))
        elif m := _IK["release"].search(line):
            _set(tasks, int(m["task"]), "context_after", int(m["n"]))
        elif bad is None and any(w in line for w in _TIMING_WORDS) and "total time" not in line:
            bad = (n, line)
    done = [_request(t, task, engine or "") for t, task in tasks.items()]
    requests = [r for r in done if r is not None]
    if not requests:
        n, line = bad or first or (1, "")
        why = "a timing line neither format reads" if bad else "no request of llama.cpp's or ik_llama.cpp's"
        raise XoverError(
            f"{source} line {n} ({_clip(line)!r}): {why} llama-server log: give the server's own log at its default "
            "verbosity (its stderr, or --log-file)"
        )
    assert engine is not None
    return engine, requests


def _set(tasks: dict[int, _Task], task: int, field: str, value: Any) -> None:
    if task in tasks:
        setattr(tasks[task], field, value)


def _clip(line: str) -> str:
    return line if len(line) <= 80 else line[:77] + "..."


def _request(task_id: int, t: _Task, engine: str) -> LoggedRequest | None:
    if t.evaluated is None or t.answer is None:
        return None  # a request the server did not finish (or the log was cut)
    (prompt_ms, evaluated), (decode_ms, answer) = t.evaluated, t.answer
    if t.prompt_total is not None:
        prompt = t.prompt_total
    elif t.cached is not None:
        prompt = t.cached + evaluated
    elif t.context_after is not None:  # llama.cpp keeps all but the answer's last token; ik_llama.cpp all of it
        prompt = t.context_after - answer + (1 if engine == "llama.cpp" else 0)
    else:
        return None
    cached = max(prompt - evaluated, 0)
    return LoggedRequest(task_id, t.slot, t.started_s, prompt, cached, answer, prompt_ms, decode_ms)


def _hash(source: str, task: int, part: str) -> str:
    return hashlib.sha256(f"{source}:{task}:{part}".encode()).hexdigest()[:16]


def _prefix(context: Sequence[Block], tokens: int) -> list[Block]:
    """The blocks of ``context`` that make up its first ``tokens`` tokens, the last one cut (same hash: its text's
    beginning)."""
    out: list[Block] = []
    left = tokens
    for b in context:
        if left <= 0:
            break
        out.append(b if b.tokens <= left else Block(left, b.hash))
        left -= b.tokens
    return out


def session_lines(engine: str, requests: Sequence[LoggedRequest], source: str) -> list[dict[str, Any]]:
    """The header and turns of a shape-only session for ``requests`` (see the module's docstring)."""
    contexts: dict[int, list[Block]] = {}
    lines: list[dict[str, Any]] = [{"format": FORMAT, "recorder": {"from_log": source, "engine": engine,
                                                                   "shape_only": True, "replay": "exact"}}]  # fmt: skip
    previous: float | None = None
    for i, r in enumerate(requests):
        prefix = _prefix(contexts.get(r.slot, []), r.cached_tokens)
        have = sum(b.tokens for b in prefix)
        blocks = prefix + [Block(r.prompt_tokens - have, _hash(source, r.task, "new"))] * (r.prompt_tokens > have)
        answer = Block(r.answer_tokens, _hash(source, r.task, "answer"))
        contexts[r.slot] = blocks + [answer]
        since = r.started_s - previous if r.started_s is not None and previous is not None else None
        previous = r.started_s if r.started_s is not None else previous
        recorded = {
            "path": "log",
            "task": r.task,
            "slot": r.slot,
            "since_previous_s": since,
            "prompt_tokens": r.prompt_tokens,
            "cached_tokens": r.cached_tokens,
            "answer_tokens": r.answer_tokens,
            "server_prompt_tps": (r.prompt_tokens - r.cached_tokens) / (r.prompt_ms / 1e3) if r.prompt_ms else None,
            "server_decode_tps": r.answer_tokens / (r.decode_ms / 1e3) if r.decode_ms else None,
            "prompt_ms": r.prompt_ms,
            "decode_ms": r.decode_ms,
        }
        shape = [{"role": "user", "blocks": [[b.tokens, b.hash] for b in blocks]}]
        lines.append({"turn": i, "shape": shape, "assistant": [answer.tokens, answer.hash], "recorded": recorded})
    return lines
