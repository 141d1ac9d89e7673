"""Agentic coding sessions as replayable workloads: a seeded generator and the JSONL format. Pure.

An agentic coding tool (Cline, Roo) resends the whole growing conversation on every turn: a large
system prompt with tool definitions, the user's task, then per turn the assistant's reply (a tool
call written as XML in its text) and a user message carrying the tool's result (file contents, a
diff, command output) and environment details. Some turns rewrite earlier context: after an edit,
the earlier result that showed the edited file is replaced in place by the file's new content, so
the resent conversation no longer extends the previous one and a plain prefix match breaks there.

**File format** (``xover-session/1``, UTF-8 JSONL). An optional first line is a header::

    {"format": "xover-session/1", "generator": {"seed": 0, "turns": 30, ...}}

then one line per turn, in order::

    {"turn": i, "messages": [...OpenAI chat messages...], "assistant": "recorded reply"}

``messages`` is the full conversation to send for turn ``i`` (ending with a user or tool message);
``assistant`` is the reply recorded for it (optional). Turn ``i + 1`` resends the conversation with
that reply appended as an assistant message: the ``k``-th assistant message after those already in
turn 0 is the reply to turn ``k``. Replaying with generated replies substitutes the server's reply
for each of those messages (:func:`messages_for_turn`); ``exact`` replay sends the file as it is.
A recorded real session in this layout replays the same way. Messages are passed through
untouched (tool roles, ``tool_calls``, content parts), except the reply substitution.

**Determinism.** Everything is drawn from one ``random.Random(seed)`` in a fixed order and written
with sorted keys, so a seed gives the same file byte for byte.

**Sizes** are in tokens estimated as characters / ``chars_per_token`` (4 suits English and code
with a real BPE vocabulary; 1 suits xover's synthetic byte-level vocabularies). The replay records
the server's real prompt length per turn.
"""

from __future__ import annotations

import dataclasses
import datetime
import difflib
import hashlib
import itertools
import json
import math
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from xover.domain.units import format_tokens
from xover.errors import XoverError

T = TypeVar("T")

FORMAT = "xover-session/1"
EDIT_KINDS = (
    "delete",
    "modify",
)  # rewrite turns cycle through these: a deleted block lets --cache-reuse recover the rest

Message = Mapping[str, Any]  # an OpenAI chat message; treated as read-only


@dataclasses.dataclass(frozen=True)
class WorkloadSpec:
    """What to generate. ``rewrite_every = N``: turns N, 2N, ... edit a file read earlier and
    rewrite that earlier result in place (0: never). A turn adds at least about 1,500 characters
    (the reply, environment details, a file of two functions), so a smaller growth per turn than
    that overshoots ``target_tokens``."""

    seed: int = 0  # the same seed, the same session, byte for byte
    turns: int = 30
    system_tokens: int = 10_240  # the system prompt (Cline's is about 10K)
    target_tokens: int = 40_960  # the last turn's prompt
    rewrite_every: int = 6
    chars_per_token: float = 4.0  # how the sizes above become characters

    def __post_init__(self) -> None:
        if self.turns < 2:
            raise XoverError(f"--turns {self.turns}: a session needs at least 2 turns")
        if self.system_tokens < 64:
            raise XoverError(f"--system-tokens {self.system_tokens}: give at least 64 tokens")
        if self.target_tokens < self.system_tokens + 64 * self.turns:
            raise XoverError(
                f"--target-tokens {self.target_tokens} leaves under 64 tokens per turn above the "
                f"{self.system_tokens}-token system prompt: raise it or lower --turns"
            )
        if self.rewrite_every < 0 or self.rewrite_every == 1:
            raise XoverError(f"rewrite every {self.rewrite_every} turns: use 0 (never) or at least 2")
        if not self.chars_per_token > 0:
            raise XoverError(f"chars per token {self.chars_per_token}: must be positive")


# What a generated session needs at least, in characters: the system prompt's fixed part (head, core
# tools, rules) and what one turn adds (the reply, environment details, the smallest tool result).
MIN_SYSTEM_CHARS = 1_300
MIN_TURN_CHARS = 1_500
CONTEXT_USE = 0.95  # of the room a context leaves after the response: the chat template's own tokens


def min_session_tokens(spec: WorkloadSpec) -> int:
    """The fewest tokens (estimated) the last turn of a session generated from ``spec`` can hold."""
    system = max(spec.system_tokens, math.ceil(MIN_SYSTEM_CHARS / spec.chars_per_token))
    return system + (spec.turns - 1) * math.ceil(MIN_TURN_CHARS / spec.chars_per_token)


def last_turn_tokens(spec: WorkloadSpec) -> int:
    """The last turn's size, estimated as the generator counts (characters / chars_per_token)."""
    return estimate_tokens(generate(spec).turns[-1].messages, spec.chars_per_token)


_k = format_tokens


def _turns_error(
    spec: WorkloadSpec, model: str, n_ctx: int, reply_tokens: int, turns: int, system: int, limit: int
) -> XoverError:
    """``--turns`` that outgrow the context, in one line naming what fits (``limit`` turns)."""
    per_turn = math.ceil(MIN_TURN_CHARS / spec.chars_per_token)
    replies = f" and {reply_tokens:,} per fed-back reply" if reply_tokens else ""
    return XoverError(
        f"--turns {turns}: each turn adds at least about {per_turn:,} tokens ({MIN_TURN_CHARS:,} characters at "
        f"{spec.chars_per_token:g} per token){replies}, so after a {_k(system)}-token system prompt {turns} turns "
        f"outgrow {model}'s training context of {n_ctx:,} tokens: "
        + (
            f"at most {limit} turns fit; give --turns {limit} or fewer"
            if limit >= 2
            else "not even 2 turns fit; give a smaller --system-tokens or --response-tokens, or replay --exact"
        )
    )


def _check_room(
    spec: WorkloadSpec, n_ctx: int, response_tokens: int, given: frozenset[str], model: str, reply_tokens: int, two: int
) -> None:
    """Refuse, in one line, a context that holds no session of two turns (``two``: their prompt budget) or a given
    final size that cannot fit."""
    room = n_ctx - response_tokens
    if two < 256:
        raise XoverError(
            f"{model}'s training context of {n_ctx:,} tokens leaves no room for a session with "
            f"{response_tokens}-token responses"
            + (f" fed back as {reply_tokens:,} tokens each" if reply_tokens else "")
            + ": lower --response-tokens, or replay --exact"
        )
    if spec.target_tokens > room and "target_tokens" in given:
        raise XoverError(
            f"--target-tokens {spec.target_tokens:,} plus {response_tokens} response tokens exceed {model}'s "
            f"training context of {n_ctx:,} tokens: at most {room:,} fit; give --target-tokens {room:,} or less"
        )


def fit_to_context(
    spec: WorkloadSpec,
    n_ctx: int,
    response_tokens: int,
    given: frozenset[str] = frozenset(),
    model: str = "the model",
    *,
    reply_tokens: int = 0,
    slack: int = 0,
) -> tuple[WorkloadSpec, str | None]:
    """``spec`` fitted to a model's training context of ``n_ctx`` tokens, and one line saying what changed.

    The last turn's prompt (as generated, estimated at ``chars_per_token``) must fit :data:`CONTEXT_USE`
    of what the context leaves after the response and ``slack``, less ``reply_tokens`` for each earlier
    reply when the replay feeds back the server's own replies (llama-server caps a slot at the training
    context, so nothing may spill over). Sizes the user did not give (``given`` names the fields given:
    ``system_tokens``, ``target_tokens``, ``turns``) are scaled: the system prompt and the final size
    by the same factor, and the turns to as many as that final size holds (each turn adds at least
    :data:`MIN_TURN_CHARS` characters); then, since a turn's growth is drawn at random, the final size
    is lowered until the generated session fits. A given size that cannot fit raises, naming what fits.
    ``n_ctx`` 0 (unknown) fits anything.
    """
    if not n_ctx:
        return spec, None
    room = n_ctx - response_tokens

    def budget(turns: int) -> int:
        return int((room - slack) * CONTEXT_USE) - (turns - 1) * reply_tokens

    _check_room(spec, n_ctx, response_tokens, given, model, reply_tokens, budget(2))

    def turns_error(turns: int, system: int, limit: int) -> XoverError:
        return _turns_error(spec, model, n_ctx, reply_tokens, turns, system, limit)

    def sized(target: int, turns: int) -> WorkloadSpec:
        """The spec at final size ``target`` (system prompt scaled alike unless given), ``turns`` turns."""
        system = (
            spec.system_tokens
            if "system_tokens" in given
            else max(64, round(spec.system_tokens * target / spec.target_tokens))
        )
        if system + 64 * 2 > target:
            raise XoverError(
                f"--system-tokens {system:,} leaves no room for turns in the {_k(target)}-token session "
                f"that fits {model}'s training context of {n_ctx:,} tokens: lower --system-tokens"
            )
        return dataclasses.replace(
            spec, system_tokens=system, target_tokens=max(target, system + 64 * turns), turns=turns
        )

    def at(turns: int) -> WorkloadSpec:
        """The largest final size ``turns`` turns get (the given one, else the default or what fits)."""
        b = budget(turns)
        target = spec.target_tokens if "target_tokens" in given or spec.target_tokens <= b else max(256, b // 256 * 256)
        return sized(target, turns)

    def fits(trial: WorkloadSpec) -> bool:
        smallest = min_session_tokens(trial)
        return smallest <= budget(trial.turns) and ("turns" in given or smallest <= trial.target_tokens)

    if "turns" in given:
        fitted = at(spec.turns)
        if not fits(fitted):
            limit = next((n for n in range(spec.turns - 1, 1, -1) if fits(at(n))), 1)
            raise turns_error(spec.turns, fitted.system_tokens, limit)
    else:
        fitted = next((at(n) for n in range(spec.turns, 1, -1) if fits(at(n))), at(2))
        if not fits(fitted):
            raise turns_error(2, fitted.system_tokens, 1)
    target = fitted.target_tokens
    size = last_turn_tokens(fitted)
    for _ in range(12):
        if size <= budget(fitted.turns) or "target_tokens" in given or target <= 256:
            break
        target = max(
            256,
            int(target * budget(fitted.turns) / size) // 256 * 256
            - (256 if size <= budget(fitted.turns) * 1.02 else 0),
        )
        fitted = sized(target, fitted.turns)
        while "turns" not in given and fitted.turns > 2 and not fits(fitted):
            fitted = sized(target, fitted.turns - 1)
        size = last_turn_tokens(fitted)
    if size > budget(fitted.turns):
        raise XoverError(
            f"the session these sizes generate grows to about {size:,} tokens, beyond the "
            f"{budget(fitted.turns):,} that fit {model}'s training context of {n_ctx:,} tokens with "
            f"{response_tokens}-token responses: lower --target-tokens, --system-tokens or --turns"
        )
    if fitted == spec:
        return spec, None
    return fitted, _fit_note(spec, fitted, model, n_ctx, reply_tokens)


def _fit_note(spec: WorkloadSpec, fitted: WorkloadSpec, model: str, n_ctx: int, reply_tokens: int) -> str:
    """The line :func:`fit_to_context` says when it changed the session: what, against the defaults."""
    changed = [
        f"{fitted.turns} turns (default {spec.turns})" if fitted.turns != spec.turns else "",
        f"a {_k(fitted.system_tokens)}-token system prompt (default {_k(spec.system_tokens)})"
        if fitted.system_tokens != spec.system_tokens
        else "",
        f"growing to {_k(fitted.target_tokens)} tokens (default {_k(spec.target_tokens)})"
        if fitted.target_tokens != spec.target_tokens
        else "",
    ]
    replies = f", with room for fed-back replies of {reply_tokens:,} tokens" if reply_tokens else ""
    return f"agentic session scaled to {model}'s training context of {n_ctx:,} tokens{replies}: " + ", ".join(
        c for c in changed if c
    )


@dataclasses.dataclass(frozen=True)
class Turn:
    index: int
    messages: tuple[Message, ...]
    assistant: str  # the recorded reply ("" when the file has none)


@dataclasses.dataclass(frozen=True)
class Session:
    turns: tuple[Turn, ...]
    header: Mapping[str, Any] | None = None

    @property
    def prior_assistant(self) -> int:
        """Assistant messages already in turn 0 (a few-shot prefix); later ones are replies."""
        return len(_assistant_positions(self.turns[0].messages))

    def rewrites(self, i: int) -> tuple[int, ...]:
        """Indices of messages of turn ``i`` that changed in place since turn ``i - 1``."""
        if i == 0:
            return ()
        prev, cur = self.turns[i - 1].messages, self.turns[i].messages
        return tuple(j for j in range(min(len(prev), len(cur))) if prev[j] != cur[j])


# ---- the file format ----------------------------------------------------------------------------


def dumps(session: Session) -> str:
    """The JSONL text of a session (header first when there is one)."""
    lines = [_line(session.header)] if session.header is not None else []
    lines += [_line({"turn": t.index, "messages": list(t.messages), "assistant": t.assistant}) for t in session.turns]
    return "\n".join(lines) + "\n"


def _line(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def session_id(text: str) -> str:
    """Identifies a workload file's exact content."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def json_lines(text: str, source: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """A session file's lines as JSON objects with where each stands (``source line N``), blank lines and a
    recording's requests that are not turns (``xover record``'s events) left out; a line that is not a JSON object
    is one error naming it."""
    for n, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        where = f"{source} line {n}"
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as e:
            raise XoverError(f"{where} is not JSON ({e.msg}): each line must be one JSON object") from None
        if not isinstance(obj, dict):
            raise XoverError(f'{where} is not a JSON object: each line must be {{"turn": i, "messages": [...]}}')
        if "event" in obj and "turn" not in obj:
            continue
        yield where, obj


def header_and_turns(
    text: str, source: str, turn: Callable[[dict[str, Any], int, str], T], example: str
) -> tuple[dict[str, Any] | None, tuple[T, ...]]:
    """A session file's header (first, if any) and its turns, each parsed by ``turn(obj, index, where)``;
    ``example`` is what a turn line holds beside its number, for the error of a file without turns."""
    header: dict[str, Any] | None = None
    turns: list[T] = []
    for where, obj in json_lines(text, source):
        if "format" in obj:
            if turns or header is not None:
                raise XoverError(f"{where}: a header line may only come first")
            if obj["format"] != FORMAT:
                raise XoverError(
                    f"{where}: format {obj['format']!r} is not {FORMAT!r}: regenerate or record the file with this "
                    "xover"
                )
            header = obj
            continue
        turns.append(turn(obj, len(turns), where))
    if not turns:
        raise XoverError(f'{source} holds no turns: it needs lines like {{"turn": 0, {example}}}')
    return header, tuple(turns)


def loads(text: str, source: str = "workload") -> Session:
    """Parse and validate a session file; every problem is one line naming the line to fix."""
    header, turns = header_and_turns(text, source, _turn, '"messages": [...]')
    return Session(turns=turns, header=header)


def _turn(obj: dict[str, Any], expected: int, where: str) -> Turn:
    if obj.get("turn") != expected:
        raise XoverError(
            f'{where}: "turn" is {obj.get("turn")!r}, expected {expected}: turns must be numbered 0, 1, 2, ... in order'
        )
    messages = obj.get("messages")
    if not isinstance(messages, list) or not messages:
        raise XoverError(f'{where}: "messages" must be a non-empty list of chat messages')
    for k, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise XoverError(f'{where}: message {k} has no "role": each message is {{"role": ..., "content": ...}}')
    if messages[-1]["role"] == "assistant":
        raise XoverError(f"{where}: the last message is the assistant's; a turn must end with what the client sends")
    assistant = obj.get("assistant", "")
    if not isinstance(assistant, str):
        raise XoverError(f'{where}: "assistant" must be a string (the recorded reply)')
    return Turn(index=expected, messages=tuple(messages), assistant=assistant)


def _assistant_positions(messages: Sequence[Message]) -> list[int]:
    return [j for j, m in enumerate(messages) if m.get("role") == "assistant"]


def check_feedable(session: Session) -> None:
    """Raise unless every turn carries exactly one more earlier reply than the turn before it,
    which is what substituting generated replies needs."""
    base = session.prior_assistant
    for t in session.turns:
        have = len(_assistant_positions(t.messages))
        if have != base + t.index:
            raise XoverError(
                f"turn {t.index} holds {have} assistant messages, expected {base + t.index} (one reply per "
                "earlier turn): replay it with --exact, which sends the recorded replies as they are"
            )


def messages_for_turn(session: Session, i: int, replies: Sequence[str] | None) -> list[dict[str, Any]]:
    """The messages to send for turn ``i``: as recorded (``replies`` None), or with the reply to
    each earlier turn ``k`` replaced by ``replies[k]`` (the text the server generated)."""
    msgs = [dict(m) for m in session.turns[i].messages]
    if replies is None:
        return msgs
    if len(replies) < i:
        raise ValueError(f"turn {i} needs {i} earlier replies, got {len(replies)}")
    for k, j in enumerate(_assistant_positions(msgs)[session.prior_assistant :]):
        msgs[j]["content"] = replies[k]
    return msgs


def estimate_tokens(messages: Sequence[Message], chars_per_token: float) -> int:
    """Characters of the text content / chars_per_token (the chat template adds a few tokens per message)."""
    chars = 0
    for m in messages:
        content = m.get("content")
        if isinstance(content, str):
            chars += len(content)
        elif isinstance(content, list):
            chars += sum(len(p.get("text", "")) for p in content if isinstance(p, dict))
    return round(chars / chars_per_token)


# ---- the generator ------------------------------------------------------------------------------

_VERBS = (
    "get",
    "set",
    "load",
    "parse",
    "build",
    "render",
    "update",
    "validate",
    "compute",
    "fetch",
    "resolve",
    "merge",
    "split",
    "encode",
    "decode",
    "normalize",
    "apply",
    "collect",
    "format",
    "write",
    "read",
    "flush",
    "reset",
    "schedule",
    "dispatch",
    "register",
    "filter",
    "sort",
    "group",
    "refresh",
)
_NOUNS = (
    "config",
    "user",
    "session",
    "token",
    "cache",
    "record",
    "request",
    "response",
    "item",
    "entry",
    "path",
    "buffer",
    "index",
    "batch",
    "report",
    "metric",
    "event",
    "handler",
    "client",
    "server",
    "queue",
    "task",
    "node",
    "graph",
    "schema",
    "payload",
    "header",
    "layout",
    "widget",
    "order",
    "invoice",
    "account",
    "column",
    "row",
    "limit",
    "window",
    "snapshot",
    "profile",
    "plugin",
    "route",
)
_TYPES = ("int", "str", "float", "bool", "bytes", "list[str]", "dict[str, int]", "Path", "None", "tuple[int, ...]")
_PACKAGES = ("core", "api", "storage", "billing", "auth", "ui", "jobs", "utils")
_DOC = (
    "Return the {a} for the given {b}.",
    "Build a {a} from the {b} fields.",
    "Check that the {a} matches the {b}.",
    "Apply every pending {a} to the {b}.",
    "Convert the {a} into a {b} the caller can store.",
    "Drop stale {a} entries older than the {b}.",
    "Merge two {a} lists, keeping the newest {b}.",
)
_STMTS = (
    "{x} = {y}.get({q}, {n})",
    "if not {x}:\n{i}    raise ValueError({q})",
    "{x} = [{y} for {y} in {z} if {y}]",
    "for {y} in {z}:\n{i}    {x}.append({y})",
    "{x} = {n} * len({z})",
    "logger.debug({q}, {x})",
    "{x} = self.{y}.{v}({z})",
    "{x}.update({y}={z})",
    "{x} = sorted({z}, key=lambda item: item.{y})",
    "assert {x} is not None, {q}",
    "{x} = {y} or {z}",
    "{x} += {n}",
)
_REQUESTS = (
    "The {noun} {verb} step fails when the {noun2} is empty. Find the cause and fix it, then run the tests.",
    "Add a {verb}_{noun} helper to the {pkg} package and use it where the {noun2} is built by hand.",
    "Refactor the {pkg} module so the {noun} cache is invalidated when the {noun2} changes.",
    "The CI run reports a flaky test around {verb}_{noun}. Make it deterministic.",
)
_FEEDBACK = (
    "Keep the public API unchanged.",
    "Please also update the docstrings.",
    "Don't touch the migrations folder.",
    "Prefer small functions over one big one.",
    "Run only the {pkg} tests, the full suite is slow.",
)


def _ident(rng: random.Random) -> str:
    return f"{rng.choice(_VERBS)}_{rng.choice(_NOUNS)}"


def _words(rng: random.Random) -> dict[str, str]:
    return {
        "noun": rng.choice(_NOUNS),
        "noun2": rng.choice(_NOUNS),
        "verb": rng.choice(_VERBS),
        "pkg": rng.choice(_PACKAGES),
    }


def _stmt(rng: random.Random, indent: str) -> str:
    text = rng.choice(_STMTS).format(
        x=rng.choice(_NOUNS),
        y=rng.choice(_NOUNS),
        z=rng.choice(_NOUNS) + "s",
        v=_ident(rng),
        q=repr(f"{rng.choice(_NOUNS)} {rng.choice(_VERBS)}"),
        n=rng.randint(0, 512),
        i=indent,
    )
    return indent + text


def _function(rng: random.Random) -> str:
    name, a, b = _ident(rng), rng.choice(_NOUNS), rng.choice(_NOUNS)
    args = ", ".join(f"{rng.choice(_NOUNS)}: {rng.choice(_TYPES)}" for _ in range(rng.randint(1, 3)))
    body = [_stmt(rng, "    ") for _ in range(rng.randint(2, 8))]
    return (
        f"def {name}({args}) -> {rng.choice(_TYPES)}:\n"
        f'    """{rng.choice(_DOC).format(a=a, b=b)}"""\n' + "\n".join(body) + f"\n    return {rng.choice(_NOUNS)}"
    )


def _file_blocks(rng: random.Random, path: str, n_chars: int) -> list[str]:
    """A Python module as blocks (header, then functions) whose text is about ``n_chars`` long."""
    mod = path.rsplit("/", 1)[-1].removesuffix(".py")
    imports = "\n".join(f"from {rng.choice(_PACKAGES)}.{rng.choice(_NOUNS)} import {_ident(rng)}" for _ in range(3))
    blocks = [
        f'"""{mod}: {rng.choice(_DOC).format(a=rng.choice(_NOUNS), b=rng.choice(_NOUNS))}"""\n\n'
        f"from __future__ import annotations\n\nimport logging\n{imports}\n\nlogger = logging.getLogger(__name__)"
    ]
    size = len(blocks[0])
    while size < n_chars or len(blocks) < 3:  # at least two functions, so that one before the last can be edited
        blocks.append(_function(rng))
        size += len(blocks[-1]) + 3
    return blocks


def _render_file(blocks: Sequence[str]) -> str:
    return "\n\n\n".join(blocks) + "\n"


def _core_tools() -> list[str]:
    tools = [
        (
            "read_file",
            "Read the contents of a file at the specified path. Use this when you need to examine the "
            "contents of an existing file, for example to analyze code or review text files.",
            ["path"],
        ),
        (
            "write_to_file",
            "Write content to a file at the specified path. If the file exists it is overwritten; "
            "if not, it is created, along with any directories it needs.",
            ["path", "content"],
        ),
        (
            "replace_in_file",
            "Replace sections of content in an existing file using SEARCH/REPLACE blocks that "
            "define exact changes to specific parts of the file.",
            ["path", "diff"],
        ),
        (
            "execute_command",
            "Execute a CLI command on the system. Tailor the command to the user's system and explain what it does.",
            ["command", "requires_approval"],
        ),
        (
            "search_files",
            "Perform a regex search across files in a directory, with context-rich results.",
            ["path", "regex", "file_pattern"],
        ),
        ("list_files", "List files and directories within the specified directory.", ["path", "recursive"]),
        (
            "list_code_definition_names",
            "List definition names (classes, functions, methods) in source files at "
            "the top level of the specified directory.",
            ["path"],
        ),
        (
            "ask_followup_question",
            "Ask the user a question to gather additional information needed to complete the task.",
            ["question", "options"],
        ),
        ("attempt_completion", "Once the task is complete, present the result to the user.", ["result", "command"]),
    ]
    out = []
    for name, desc, params in tools:
        plist = "\n".join(f"- {p}: (required) The {p.replace('_', ' ')} for this tool." for p in params)
        usage = "\n".join(f"<{p}>{p.replace('_', ' ')} here</{p}>" for p in params)
        out.append(f"## {name}\nDescription: {desc}\nParameters:\n{plist}\nUsage:\n<{name}>\n{usage}\n</{name}>\n")
    return out


def _mcp_tools(rng: random.Random) -> Iterator[str]:
    """MCP server tool definitions with JSON input schemas, as many as the budget takes."""
    server = 0
    while True:
        server += 1
        name = f"{rng.choice(_NOUNS)}-{rng.choice(_NOUNS)}-{server}"
        yield f"## {name} (`npx -y @acme/{name}-mcp`)\n\n### Available Tools\n"
        for _ in range(rng.randint(3, 6)):
            props = {
                f"{rng.choice(_NOUNS)}_{k}": {
                    "type": rng.choice(("string", "integer", "boolean")),
                    "description": rng.choice(_DOC).format(a=rng.choice(_NOUNS), b=rng.choice(_NOUNS)),
                }
                for k in range(rng.randint(2, 5))
            }
            schema = json.dumps(
                {"type": "object", "properties": props, "required": sorted(props)[:1]}, indent=2, sort_keys=True
            )
            yield (
                f"- {_ident(rng)}: {rng.choice(_DOC).format(a=rng.choice(_NOUNS), b=rng.choice(_NOUNS))}\n"
                f"    Input Schema:\n    {schema}\n"
            )


def _system_prompt(rng: random.Random, n_chars: int) -> str:
    head = (
        "You are Xover Agent, a highly skilled software engineer with extensive knowledge in many programming "
        "languages, frameworks, design patterns, and best practices.\n\n====\n\nTOOL USE\n\nYou have access to a "
        "set of tools that are executed upon the user's approval. You can use one tool per message, and will "
        "receive the result of that tool use in the user's response. Tool use is formatted using XML-style "
        "tags:\n\n<tool_name>\n<parameter1_name>value1</parameter1_name>\n</tool_name>\n\n# Tools\n\n"
    )
    tail = (
        "\n====\n\nRULES\n\n- Your current working directory is: /home/dev/project\n- Do not ask for more "
        "information than necessary.\n- Wait for the user's response after each tool use.\n\n====\n\nSYSTEM "
        "INFORMATION\n\nOperating System: Linux 6.8\nDefault Shell: /bin/bash\n"
    )
    parts, size = [head], len(head) + len(tail)
    # Core tools, then MCP servers' tools, while a block brings the size closer to the budget.
    for block in itertools.chain(_core_tools(), ["\n====\n\nMCP SERVERS\n\n"], _mcp_tools(rng)):
        if size + len(block) / 2 > n_chars:
            break
        parts.append(block)
        size += len(block)
    return "".join(parts) + tail


def _env_details(turn: int, visible: str, tabs: Sequence[str]) -> str:
    when = datetime.datetime(2026, 3, 14, 9, 0, 0) + datetime.timedelta(seconds=41 * turn)
    return (
        f"\n\n<environment_details>\n# VSCode Visible Files\n{visible}\n\n# VSCode Open Tabs\n{', '.join(tabs)}\n\n"
        f"# Current Time\n{when.strftime('%m/%d/%Y, %H:%M:%S')} (UTC)\n\n# Current Mode\nACT MODE\n</environment_details>"
    )


def _thinking(rng: random.Random, what: str) -> str:
    w = _words(rng)
    return (
        f"<thinking>\nTo {w['verb']} the {w['noun']} correctly I need {what}. The {w['noun2']} handling in the "
        f"{w['pkg']} package looks related, so I will check it next.\n</thinking>\n\n"
    )


def _pytest_output(rng: random.Random, n_chars: int, files: Sequence[str]) -> str:
    lines = [
        "============================= test session starts ==============================",
        "platform linux -- Python 3.12.3, pytest-8.3.2, pluggy-1.5.0",
        "rootdir: /home/dev/project",
        "",
    ]
    size = sum(len(x) + 1 for x in lines)
    failures = []
    while size < n_chars * 0.6:
        test = f"tests/test_{rng.choice(_NOUNS)}.py::test_{_ident(rng)}"
        status = "FAILED" if rng.random() < 0.15 else "PASSED"
        if status == "FAILED":
            failures.append(test)
        lines.append(f"{test} {status}")
        size += len(lines[-1]) + 1
    lines.append("\n=================================== FAILURES ===================================")
    while size < n_chars:
        path = rng.choice(files) if files else f"src/{rng.choice(_PACKAGES)}/{rng.choice(_NOUNS)}.py"
        lines += [
            f"___________________________ test_{_ident(rng)} ___________________________",
            f"{path}:{rng.randint(10, 400)}: in {_ident(rng)}",
            _stmt(rng, "    "),
            f"E   AssertionError: expected {rng.randint(0, 99)} {rng.choice(_NOUNS)}s, got {rng.randint(0, 99)}",
        ]
        size += sum(len(x) + 1 for x in lines[-4:])
    lines.append(
        f"========================= {len(failures)} failed, {rng.randint(40, 400)} passed in "
        f"{rng.randint(2, 90)}.{rng.randint(10, 99)}s ========================="
    )
    return "\n".join(lines)


def _search_output(rng: random.Random, n_chars: int, regex: str) -> str:
    lines = [f"Found many results for '{regex}'.", ""]
    size = len(lines[0])
    while size < n_chars:
        path = f"src/{rng.choice(_PACKAGES)}/{rng.choice(_NOUNS)}.py"
        hit = [path, "│----", f"│{_stmt(rng, '    ')}", f"│{_stmt(rng, '    ')}", "│----", ""]
        lines += hit
        size += sum(len(x) + 1 for x in hit)
    return "\n".join(lines)


def _list_output(rng: random.Random) -> str:
    return "\n".join(
        sorted({f"src/{rng.choice(_PACKAGES)}/{rng.choice(_NOUNS)}.py" for _ in range(rng.randint(12, 30))})
    )


@dataclasses.dataclass
class _Shown:
    """Where a file's content sits in the conversation: message index, text around it, its blocks."""

    message: int
    head: str
    tail: str
    blocks: list[str]


class _Generator:
    def __init__(self, spec: WorkloadSpec) -> None:
        self.spec = spec
        self.rng = random.Random(spec.seed)
        self.messages: list[dict[str, Any]] = []
        self.shown: dict[str, _Shown] = {}  # files whose content is in the conversation, in reading order
        self.rewrites = 0

    def chars(self, tokens: float) -> int:
        return max(1, round(tokens * self.spec.chars_per_token))

    def size(self) -> int:
        return sum(len(m["content"]) for m in self.messages)

    def new_path(self) -> str:
        while True:
            path = f"src/{self.rng.choice(_PACKAGES)}/{self.rng.choice(_NOUNS)}_{self.rng.choice(_NOUNS)}.py"
            if path not in self.shown:
                return path

    def run(self) -> Session:
        spec, rng = self.spec, self.rng
        w = _words(rng)
        task = rng.choice(_REQUESTS).format(**w)
        self.messages = [
            {"role": "system", "content": _system_prompt(rng, self.chars(spec.system_tokens))},
            {"role": "user", "content": f"<task>\n{task}\n</task>" + _env_details(0, "(none)", ())},
        ]
        turns: list[Turn] = []
        action = ("read_file", self.new_path())
        for t in range(spec.turns):
            if t > 0:
                self.messages.append({"role": "assistant", "content": turns[-1].assistant})
                self.messages.append({"role": "user", "content": self.perform(action, t)})
            action = self.next_action(t + 1)
            reply = self.reply(action)
            turns.append(Turn(index=t, messages=tuple(dict(m) for m in self.messages), assistant=reply))
        header = {"format": FORMAT, "generator": dataclasses.asdict(spec)}
        return Session(turns=tuple(turns), header=header)

    def next_action(self, t: int) -> tuple[str, str]:
        """The tool call the reply of turn ``t - 1`` makes; its result is turn ``t``'s new message."""
        every = self.spec.rewrite_every
        earlier = list(self.shown)
        if every and t % every == 0 and earlier:
            return ("replace_in_file", self.rng.choice(earlier))
        if t == 1 or not earlier:
            return ("read_file", self.new_path())
        r = self.rng.random()
        if r < 0.5:
            return ("read_file", self.new_path())
        if r < 0.7:
            return ("execute_command", f"python -m pytest tests/test_{self.rng.choice(_NOUNS)}.py -x -q")
        if r < 0.9:
            return ("search_files", f"{self.rng.choice(_VERBS)}_{self.rng.choice(_NOUNS)}\\(")
        return ("list_files", f"src/{self.rng.choice(_PACKAGES)}")

    def reply(self, action: tuple[str, str]) -> str:
        tool, arg = action
        param = {
            "read_file": "path",
            "replace_in_file": "path",
            "execute_command": "command",
            "search_files": "regex",
            "list_files": "path",
        }[tool]
        what = {
            "read_file": f"to read {arg}",
            "replace_in_file": f"to clean up {arg}",
            "execute_command": "the test results",
            "search_files": "every call site",
            "list_files": "the package layout",
        }[tool]
        return _thinking(self.rng, what) + f"<{tool}>\n<{param}>{arg}</{param}>\n</{tool}>"

    def budget(self, t: int) -> int:
        """Characters this turn's new messages should add for the last turn to reach the target."""
        left = self.chars(self.spec.target_tokens) - self.size()
        return max(self.chars(32), left // (self.spec.turns - t))

    def perform(self, action: tuple[str, str], t: int) -> str:
        rng, tool, arg = self.rng, *action
        budget = round(self.budget(t) * rng.uniform(0.6, 1.4)) - len(self.messages[-1]["content"])
        visible = arg if tool in ("read_file", "replace_in_file") else next(reversed(self.shown), "(none)")
        env = _env_details(t, visible, list(self.shown)[-4:])
        if rng.random() < 0.15:
            env = "\n\n<feedback>\n" + rng.choice(_FEEDBACK).format(**_words(rng)) + "\n</feedback>" + env
        if tool == "read_file":
            head = f"[read_file for '{arg}'] Result:\n"
            blocks = _file_blocks(rng, arg, max(self.chars(48), budget - len(head) - len(env)))
            self.shown[arg] = _Shown(len(self.messages), head, env, blocks)
            return head + _render_file(blocks) + env
        if tool == "replace_in_file":
            return self.edit(arg, t) + env
        if tool == "execute_command":
            return (
                f"[execute_command for '{arg}'] Result:\nCommand executed.\nOutput:\n"
                + _pytest_output(rng, max(self.chars(32), budget - len(env)), list(self.shown))
                + env
            )
        if tool == "search_files":
            return (
                f"[search_files for '{arg}'] Result:\n"
                + _search_output(rng, max(self.chars(32), budget - len(env)), arg)
                + env
            )
        return f"[list_files for '{arg}'] Result:\n" + _list_output(rng) + env

    def edit(self, path: str, t: int) -> str:
        """Edit a file shown earlier and rewrite that earlier message in place with its new content."""
        shown = self.shown[path]
        old = _render_file(shown.blocks)
        kind = EDIT_KINDS[self.rewrites % len(EDIT_KINDS)]
        self.rewrites += 1
        if len(shown.blocks) < 3:  # a file edited down to one function: modify that one, never delete it
            kind = "modify"
        k = self.rng.randint(
            1, max(1, len(shown.blocks) - 2)
        )  # never the module header; the last block only when alone
        if kind == "delete":
            del shown.blocks[k]
        else:
            lines = shown.blocks[k].split("\n")
            j = self.rng.randint(2, len(lines) - 2)  # a body line: not the signature or docstring, not the return
            lines[j] = _stmt(self.rng, "    ")
            shown.blocks[k] = "\n".join(lines)
        new = _render_file(shown.blocks)
        self.messages[shown.message]["content"] = shown.head + new + shown.tail
        diff = "".join(
            difflib.unified_diff(
                old.splitlines(keepends=True), new.splitlines(keepends=True), fromfile=f"a/{path}", tofile=f"b/{path}"
            )
        )
        return (
            f"[replace_in_file for '{path}'] Result:\nThe content was successfully saved to {path}. The earlier "
            f"read of the file above now shows its updated content.\n\nHere is the diff:\n{diff}"
        )


def generate(spec: WorkloadSpec) -> Session:
    """A synthetic agentic coding session; the same spec gives the same session."""
    return _Generator(spec).run()
