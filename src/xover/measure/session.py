"""Replay an agentic coding session through llama-server's chat endpoint, turn by turn.

For every configuration x cache mode a fresh server starts, answers one discarded warm-up request,
then receives the session's turns in order on ``/v1/chat/completions`` (streamed, with
``stream_options.include_usage``, exactly ``response_tokens`` back: ``max_tokens`` + ``ignore_eos``,
greedy so every mode of a configuration feeds back the same replies wherever the numerics agree).
The reply the server generated is fed back into the conversation as a client would (``feed =
"generated"``), or the file's recorded replies are sent as they are (``"recorded"``, ``--exact``).

Cache modes (each on a freshly started server):

* ``default``: llama-server's defaults: ``cache_prompt`` true, several slots, the host-memory
  prompt cache (``--cache-ram``). Only the prompt's longest common prefix with a cached one is reused.
* ``off``: every turn cold: ``cache_prompt: false`` on a server with ``-np 1 --cache-ram 0``.
* ``reuse``: the defaults plus ``--cache-reuse N`` (256): after the common prefix, runs of at least
  N tokens of the old cache that reappear in the new prompt are shifted into place. Note the server
  scans the old cache for the *new* prompt's next tokens, so a turn that deleted text earlier on
  gets the rest back, while one that replaced text with new text gets nothing more than ``default``.

Per turn, outside the timed request, the prompt is rendered (``/apply-template``) and tokenized by
the same server, which gives ``prefix_tokens``: the longest common prefix with the previous turn's
prompt. Everything is stored per turn as it is measured (``session_turns``); the session's time is
the sum of its turn times (the client waits on nothing else: tools run in zero time here).

The server's context is sized once per run, unless given: a sizing server (the first
configuration's arguments, ``-ngl 0``, a small ``-c``) tokenizes every turn, and for generated
replies measures how many tokens a generated reply becomes when fed back. A configuration's own
``-c`` wins over the sized context; each turn is checked against the context the server reports.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from xover.client.chat import ChatClient, chat_body
from xover.domain.config import LlamaConfig, command_configs
from xover.domain.llama_options import LlamaOption
from xover.domain.prompts import WORDS
from xover.domain.records import Failure, SessionTurn
from xover.domain.turn_shape import (
    Block,
    ShapeSession,
    filler,
    from_log,
    is_shape_only,
    loads_shapes,
    realize,
    turn_count,
    without_template,
)
from xover.domain.workload import (
    Session,
    WorkloadSpec,
    check_feedable,
    dumps,
    fit_to_context,
    generate,
    last_turn_tokens,
    loads,
    messages_for_turn,
    session_id,
)
from xover.errors import XoverError
from xover.gguf.inspect import check_offload_and_context, model_context
from xover.llamacpp.binaries import Binaries, resolve
from xover.llamacpp.server import LlamaServer, ServerLaunch, check_explicit_context, context_size, has_flag
from xover.measure.events import Note, ReplayDone, ServerUp, SessionEvent, Sized, TurnDone
from xover.measure.recorder import Recording
from xover.measure.server_session import props_n_ctx, started_server, warmup_lengths
from xover.results.read_model import series_from_rows
from xover.results.store import Store

if TYPE_CHECKING:
    from xover.gguf.inspect import ModelContext
    from xover.results.read_model import SessionSeries

P = ParamSpec("P")
T = TypeVar("T")

MODES = ("default", "off", "reuse")
CACHE_REUSE = 256  # the --cache-reuse chunk the llama.cpp maintainers suggest starting with
PROBE_PROMPT_TOKENS = 64  # room for the sizing server's one short prompt, whose reply measures re-tokenization
REPLY_MARGIN = 1.25  # fed-back reply tokens allowed beyond the measured growth, as a factor
WARMUP = ({"role": "user", "content": "Say hello."},)
GROWTH_NOTE = 2.0  # a generated reply that re-tokenizes to more than this many times its length gets a note

# ---- cache modes and request bodies (pure) ------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ModeSettings:
    cold_cache: bool  # ServerLaunch.cold_cache: -np 1 --cache-ram 0
    args: tuple[str, ...]  # extra llama-server arguments
    cache_prompt: bool  # the request's cache_prompt


def mode_settings(mode: str, cache_reuse: int = CACHE_REUSE) -> ModeSettings:
    if mode == "default":
        return ModeSettings(cold_cache=False, args=(), cache_prompt=True)
    if mode == "off":
        return ModeSettings(cold_cache=True, args=(), cache_prompt=False)
    if mode == "reuse":
        return ModeSettings(cold_cache=False, args=("--cache-reuse", str(cache_reuse)), cache_prompt=True)
    raise XoverError(f"cache mode {mode!r} is not one of {', '.join(MODES)}")


def parse_modes(text: str) -> tuple[str, ...]:
    """``default,off,reuse`` (any non-empty subset, in the order given)."""
    modes = tuple(m.strip() for m in text.split(",") if m.strip())
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise XoverError(f"--cache-modes {text!r}: use a comma-separated subset of {','.join(MODES)}")
    if len(set(modes)) != len(modes):
        raise XoverError(f"--cache-modes {text!r} repeats a mode: give each once")
    return modes


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def context_for(turn_tokens: Sequence[int], response_tokens: int, reply_tokens: int = 0) -> int:
    """``-c`` for a session whose turn ``i`` prompt is ``turn_tokens[i]`` tokens, plus ``reply_tokens``
    for each of its ``i`` earlier replies (fed-back replies are not in ``turn_tokens``)."""
    return context_size(need_for(turn_tokens, 0, reply_tokens), response_tokens)


def need_for(turn_tokens: Sequence[int], response_tokens: int, reply_tokens: int = 0) -> int:
    """The tokens a slot must hold for the session's longest turn: its prompt, ``reply_tokens`` for each
    earlier reply fed back, and the response. (llama-server caps a slot at the model's training context.)"""
    return max(n + i * reply_tokens for i, n in enumerate(turn_tokens)) + response_tokens


# ---- outcome ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SessionOutcome:
    run_id: int
    session_id: str
    ctx_size: int  # the -c every server of the replay ran with
    turns: tuple[SessionTurn, ...]
    failures: tuple[Failure, ...]
    labels: Mapping[str, str]  # config key -> label


class _ReplayError(Exception):
    """A turn could not be measured: this configuration and mode stop."""


# ---- the runner ---------------------------------------------------------------------------------


def write_workload(study_dir: Path, spec: WorkloadSpec) -> Path:
    """Generate the session for ``spec`` into ``study_dir`` (a name that says the spec) and return its path.
    Rewriting it is harmless: the same spec gives the same bytes."""
    study_dir.mkdir(parents=True, exist_ok=True)
    path = study_dir / (
        f"session-seed{spec.seed}-turns{spec.turns}-sys{spec.system_tokens}-target{spec.target_tokens}"
        f"-rw{spec.rewrite_every}-cpt{spec.chars_per_token:g}.jsonl"
    )
    path.write_text(dumps(generate(spec)), encoding="utf-8")
    return path


async def run_session_async(
    study_dir: Path,
    binaries: Binaries,
    model: Path,
    workload_path: Path,
    configs: Sequence[LlamaConfig],
    modes: Sequence[str] = MODES,
    response_tokens: int = 64,
    *,
    exact: bool = False,
    cache_reuse: int = CACHE_REUSE,
    ctx_size: int | None = None,
    command: Sequence[str] = (),
    startup_timeout_s: float = 600.0,
    on_event: Callable[[SessionEvent], None] = lambda ev: None,
) -> SessionOutcome:
    """Replay ``workload_path`` on every configuration x cache mode, storing each turn in
    ``study_dir``'s results store; stops every server it started whatever the way out. Configuration
    or turn failures are stored and reported, not raised; a workload or sizing problem raises
    :class:`XoverError` before anything is measured. A configuration placed for a context (a "fit" level,
    its ``max_context``) that the session's context does not fit in is recorded as a failure and not started. :func:`run_session` is the same for callers without an event loop."""
    if not configs:
        raise XoverError("no configurations to replay the session on: give at least one (e.g. --ncmoe 12)")
    if len({c.name for c in configs}) != len(configs):
        raise XoverError("two configurations share a label: give each its own")
    for m in modes:
        mode_settings(m, cache_reuse)
    if response_tokens < 1:
        raise XoverError("--response-tokens must be at least 1")
    if cache_reuse < 1:
        raise XoverError("--cache-reuse must be at least 1 token")
    try:
        text = workload_path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise XoverError(f"cannot read the workload {workload_path} ({e}): fix --workload") from None
    log_dir = study_dir / "logs"
    fit_off = has_flag(binaries.server, "-fit")
    if is_shape_only(text):
        shapes = loads_shapes(text, source=str(workload_path))
        session = await realize_on_server(binaries, model, configs[0], shapes, log_dir, fit_off, startup_timeout_s)
        on_event(Note(f"{workload_path} is shape-only: replayed as synthetic text of its {len(shapes.blocks()):,} "
                      "blocks' token lengths, equal where their hashes are equal"))  # fmt: skip
    else:
        session = loads(text, source=str(workload_path))
    if not exact:
        check_feedable(session)
    if ctx_size is None:
        sized = await size_context(
            binaries, model, configs[0], session, exact, response_tokens, log_dir, fit_off, startup_timeout_s
        )
        on_event(sized)
        ctx_size = sized.ctx_size
    with Store(study_dir) as store:
        replay = _Replay(
            store,
            binaries,
            model,
            session,
            session_id(text),
            "recorded" if exact else "generated",
            response_tokens,
            cache_reuse,
            ctx_size,
            fit_off,
            log_dir,
            list(command),
            startup_timeout_s,
            on_event,
        )
        return await replay.run(configs, modes)


def _blocking(coroutine: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, T]:
    """``coroutine`` as a plain function that runs it in its own event loop."""

    def run(*args: P.args, **kwargs: P.kwargs) -> T:
        return asyncio.run(coroutine(*args, **kwargs))

    return run


run_session = _blocking(run_session_async)
""":func:`run_session_async`, synchronous: runs its own event loop."""


@contextlib.asynccontextmanager
async def _cpu_server(
    binaries: Binaries,
    model: Path,
    config: LlamaConfig,
    name: str,
    reply_tokens: int,
    log_dir: Path,
    fit_off: bool,
    startup_timeout_s: float,
) -> AsyncIterator[ChatClient]:
    """A small CPU-only server of ``config``'s build (its chat template and tokenizer), with room for a short probe
    prompt and a ``reply_tokens`` reply (tokenizing needs no context), and a client of it."""
    cpu_only = config.with_values({"n-gpu-layers": "0"}, name=name)
    spec = ServerLaunch(cpu_only, model, context_size(PROBE_PROMPT_TOKENS, reply_tokens), fit_off=fit_off)
    async with (
        LlamaServer(binaries.for_config(config).server, spec, log_dir, startup_timeout_s=startup_timeout_s) as srv,
        ChatClient(srv.url) as client,
    ):
        yield client


async def text_of_tokens(client: ChatClient, block: Block) -> str:
    """Synthetic text of exactly ``block.tokens`` tokens of the server's vocabulary: the block's :func:`filler`,
    drafted long enough, tokenized, cut to the length and turned back into text."""
    if block.tokens == 0:
        return ""
    chars = block.tokens * 6 + 32
    while len(ids := await client.tokenize(filler(block.hash, chars), add_special=False)) < block.tokens:
        chars *= 2
    return await client.detokenize(ids[: block.tokens])


async def realize_on_server(
    binaries: Binaries,
    model: Path,
    config: LlamaConfig,
    shapes: ShapeSession,
    log_dir: Path,
    fit_off: bool = True,
    startup_timeout_s: float = 600.0,
) -> Session:
    """A shape-only session as synthetic text in ``model``'s tokens, made on a small CPU-only server of
    ``config``'s build (as the sizing server is)."""
    async with _cpu_server(binaries, model, config, "shapes", 1, log_dir, fit_off, startup_timeout_s) as client:
        if from_log(shapes):  # its prompt counts hold the template's tokens, which the replay adds again
            shapes = without_template(shapes, len(await client.prompt_tokens([{"role": "user", "content": ""}])))
        texts = {b: await text_of_tokens(client, b) for b in sorted(shapes.blocks(), key=lambda b: (b.hash, b.tokens))}
    return realize(shapes, texts.__getitem__)


async def size_context(
    binaries: Binaries,
    model: Path,
    config: LlamaConfig,
    session: Session,
    exact: bool,
    response_tokens: int,
    log_dir: Path,
    fit_off: bool = True,
    startup_timeout_s: float = 600.0,
) -> Sized:
    """Tokenize every turn on a small CPU-only server (``config``'s, for its chat template) and size ``-c`` for
    the whole session."""
    async with _cpu_server(
        binaries, model, config, "sizing", response_tokens, log_dir, fit_off, startup_timeout_s
    ) as client:
        turn_tokens = []
        for t in session.turns:
            msgs = messages_for_turn(session, t.index, None if exact else [""] * t.index)
            turn_tokens.append(len(await client.prompt_tokens(msgs)))
        if exact:
            return Sized(
                context_for(turn_tokens, response_tokens),
                max(turn_tokens),
                None,
                need_for(turn_tokens, response_tokens),
            )
        rec = await client.stream_chat(chat_body(WARMUP, response_tokens, cache_prompt=False))
        if rec.result.error is not None:
            raise XoverError(
                f"sizing server: a {response_tokens}-token reply failed ({rec.result.error}); check the "
                "model, or pass --ctx-size"
            )
        generated = rec.result.completion_tokens or response_tokens
        growth = len(await client.tokenize(rec.result.content, add_special=False)) / generated
    per_reply = reply_allowance(growth, response_tokens)
    return Sized(
        context_for(turn_tokens, response_tokens, per_reply),
        max(turn_tokens),
        growth,
        need_for(turn_tokens, response_tokens, per_reply),
    )


def reply_allowance(growth: float | None, response_tokens: int) -> int:
    """Tokens one fed-back generated reply is allowed in the context (what :func:`size_context` budgets)."""
    return math.ceil(max(growth or 1.0, 1.0) * response_tokens * REPLY_MARGIN) + 8


class _Replay:
    """One run: a run record, then every configuration x mode on its own server."""

    def __init__(
        self,
        store: Store,
        binaries: Binaries,
        model: Path,
        session: Session,
        sid: str,
        feed: str,
        response_tokens: int,
        cache_reuse: int,
        ctx_size: int,
        fit_off: bool,
        log_dir: Path,
        command: list[str],
        startup_timeout_s: float,
        on_event: Callable[[SessionEvent], None],
    ) -> None:
        self.store, self.binaries, self.model, self.session = store, binaries, model, session
        self.sid, self.feed, self.response_tokens, self.cache_reuse = sid, feed, response_tokens, cache_reuse
        self.ctx_size, self.fit_off, self.log_dir = ctx_size, fit_off, log_dir
        self.startup_timeout_s, self.on_event = startup_timeout_s, on_event
        self.rec = Recording(store, "session", command, binaries=binaries, model=model, on_event=on_event)
        self.turns: list[SessionTurn] = []
        self.labels: dict[str, str] = {}
        self.noted: set[str] = set()  # notes already given once in this run

    async def run(self, configs: Sequence[LlamaConfig], modes: Sequence[str]) -> SessionOutcome:
        with self.rec:  # ends the run: interrupted, failed or done (xover.measure.recorder)
            for config in configs:
                for mode in modes:
                    await self._one(config, mode)
        assert self.rec.run_id is not None
        return SessionOutcome(
            self.rec.run_id, self.sid, self.ctx_size, tuple(self.turns), tuple(self.rec.failures), dict(self.labels)
        )

    def _fail(self, config: LlamaConfig, mode: str, point: str, reason: str, skipped: int) -> None:
        self.rec.fail(
            config,
            Failure(config_key=config.key, stage="session", point=f"{mode} {point}", reason=reason),
            skipped=skipped,
            mode=mode,
        )

    async def _one(self, config: LlamaConfig, mode: str) -> None:
        settings = mode_settings(mode, self.cache_reuse)
        label = config.name
        spec = ServerLaunch(
            config,
            self.model,
            self.ctx_size,
            cold_cache=settings.cold_cache,
            fit_off=self.fit_off,
            own_args=settings.args,
            label=f"{label}-{mode}",
        )
        self.labels[config.key] = label  # the mode is in every turn
        placed = config.max_context
        if placed is not None and self.ctx_size > placed:
            self._fail(
                config,
                mode,
                "replay",
                f"{label} is placed for {placed:,} tokens (its fit level) and the session needs a "
                f"{self.ctx_size:,}-token context: not replayed on it (lower [study] session-target-tokens, or place "
                "it for a longer context with fit@L)",
                len(self.session.turns),
            )
            return
        before = len(self.turns)
        try:
            async with (
                started_server(
                    self.rec,
                    self.binaries,
                    spec,
                    self.log_dir,
                    config=config,
                    startup_timeout_s=self.startup_timeout_s,
                    mode=mode,
                ) as srv,
                ChatClient(srv.url) as client,
            ):
                run_id = self.rec.ensure(build=config.build)
                self.on_event(
                    ServerUp(
                        label=label,
                        url=srv.url,
                        log_path=srv.log_path,
                        build_info=str(srv.props.get("build_info") or "") or None,
                        mode=mode,
                    )
                )
                n_ctx = props_n_ctx(srv.props) or self.ctx_size
                done = await self._turns(client, config, mode, settings.cache_prompt, n_ctx, run_id)
        except (_ReplayError, XoverError) as e:  # XoverError: start-up, or /apply-template, /tokenize between turns
            self._fail(config, mode, "replay", str(e), len(self.session.turns) - (len(self.turns) - before))
            return
        self.on_event(ReplayDone(label, mode, done))

    async def _warm(self, client: ChatClient, config: LlamaConfig, n_ctx: int) -> None:
        """The discarded warm-up chats: one whose prompt fills the server's largest ubatch (a few-token warm-up
        leaves the first turn paying the prompt path's one-time costs: :func:`warmup_lengths`), then the short one
        that warms the chat template's path. Plain words are at least a token each, so as many words as the ubatch
        has tokens fill it; halved until they fit the context."""
        backend = self.binaries.for_config(config).expected_backend
        fill = warmup_lengths(config, backend, n_ctx, None)[0]
        words = [WORDS[i % len(WORDS)] for i in range(fill)]
        long = [{"role": "user", "content": " ".join(words)}]
        while len(words) > 8 and len(await client.prompt_tokens(long)) > n_ctx - 16:
            words = words[: len(words) // 2]
            long = [{"role": "user", "content": " ".join(words)}]
        for msgs in (long, WARMUP):
            warm = await client.stream_chat(chat_body(msgs, 1, cache_prompt=False))
            if warm.result.error is not None:
                raise _ReplayError(f"warm-up request failed: {warm.result.error}")

    async def _turns(
        self, client: ChatClient, config: LlamaConfig, mode: str, cache_prompt: bool, n_ctx: int, run_id: int
    ) -> int:
        """Every turn in order, after the discarded warm-ups (:meth:`_warm`); returns the session time (sum of turn
        times, ns)."""
        await self._warm(client, config, n_ctx)
        generated = self.feed == "generated"
        replies: list[str] = []
        prev: list[int] | None = None
        total = 0
        for t in self.session.turns:
            msgs = messages_for_turn(self.session, t.index, replies if generated else None)
            tokens = await client.prompt_tokens(msgs)
            if len(tokens) + self.response_tokens > n_ctx:
                hint = " or replay with --exact" if generated else ""
                raise _ReplayError(
                    f"turn {t.index}: {len(tokens)} prompt + {self.response_tokens} response tokens exceed "
                    f"the server's {n_ctx}-token context: pass a larger --ctx-size{hint}"
                )
            rec = await client.stream_chat(chat_body(msgs, self.response_tokens, cache_prompt=cache_prompt))
            res = rec.result
            reply_tokens = None
            if generated and res.error is None:
                reply_tokens = len(await client.tokenize(res.content, add_special=False))
            turn = SessionTurn(
                config_key=config.key,
                mode=mode,
                session_id=self.sid,
                feed=self.feed,
                turn=t.index,
                rewrite=bool(self.session.rewrites(t.index)),
                sent_at_unix_ns=rec.sent_at_unix_ns,
                prompt_tokens=res.prompt_tokens,
                prefix_tokens=common_prefix(prev, tokens) if prev is not None else None,
                cached_tokens=res.cached_tokens,
                completion_tokens=res.completion_tokens,
                first_byte_ns=res.first_byte_ns,
                first_token_ns=res.first_token_ns,
                last_token_ns=res.last_token_ns,
                end_ns=res.end_ns,
                n_content_events=res.n_content_events,
                reply=res.content,
                reply_tokens=reply_tokens,
                timings=res.timings,
                error=res.error,
            )
            self.store.add_session_turn(run_id, self.rec.model_key, turn)
            self.turns.append(turn)
            self.on_event(TurnDone(config.label, turn))
            if res.error is not None or res.end_ns is None:
                raise _ReplayError(f"turn {t.index}: {res.error}")
            self._notes(config.label, mode, turn, len(tokens))
            replies.append(res.content)
            prev = tokens
            total += res.end_ns
        return total

    def _notes(self, label: str, mode: str, turn: SessionTurn, counted: int) -> None:
        """Warnings worth giving once per run."""
        if "count" not in self.noted and turn.prompt_tokens is not None and turn.prompt_tokens != counted:
            self.noted.add("count")
            self.on_event(
                Note(
                    f"{label} {mode} turn {turn.turn}: the server evaluated {turn.prompt_tokens} prompt tokens "
                    f"but /apply-template + /tokenize give {counted}, so prefix_tokens may be off"
                )
            )
        n = turn.completion_tokens
        if "growth" not in self.noted and turn.reply_tokens is not None and n and turn.reply_tokens > GROWTH_NOTE * n:
            self.noted.add("growth")
            self.on_event(
                Note(
                    f"the generated reply of {n} tokens comes back as {turn.reply_tokens} tokens when fed back "
                    "(a synthetic vocabulary's padding tokens return as text), so every turn re-prefills it at "
                    "that size: replay with --exact to feed the recorded replies"
                )
            )


# ---- `xover session`: from its options to the replayed series ------------------------------------------

GENERATION_OPTIONS = ("turns", "seed", "system_tokens", "target_tokens", "rewrite_every", "chars_per_token")
"""The options a session is generated from: the fields of :class:`~xover.domain.workload.WorkloadSpec`, which
:class:`SessionRequest` holds under the same names."""
_SCALABLE = ("turns", "system_tokens", "target_tokens")  # the sizes fit_to_context scales unless they are given


@dataclasses.dataclass(frozen=True)
class SessionRequest:
    """What ``xover session`` was asked: the configurations (every combination of the swept values, with
    ``server_args`` after ``--``), the session (the ``workload`` file, or one generated from the fields below) and
    how to replay it."""

    model: Path
    study_dir: Path
    sweeps: tuple[tuple[LlamaOption, tuple[str, ...]], ...] = ()
    server_args: tuple[str, ...] = ()
    workload: Path | None = None  # replay this file; None: generate a session
    turns: int = 30
    seed: int = 0
    system_tokens: int = 10_240
    target_tokens: int = 40_960
    rewrite_every: int = 6
    chars_per_token: float | None = None  # None: 1 for xover's synthetic byte vocabularies, else 4
    explicit: tuple[str, ...] = ()  # the GENERATION_OPTIONS given explicitly (a given size is kept, never scaled)
    modes: tuple[str, ...] = MODES
    response_tokens: int = 64
    cache_reuse: int = CACHE_REUSE
    exact: bool = False
    ctx_size: int | None = None  # None: sized by a short tokenizing run
    llama_bin_dir: Path | None = None
    startup_timeout_s: float = 600.0


@dataclasses.dataclass(frozen=True)
class SessionStarted:
    """Sent once the session is ready, before the first server of the replay starts."""

    total: int  # turns planned: configurations x cache modes x turns
    sizing: str = ""  # what was scaled to the model, and why ("" when nothing was)
    written: Path | None = None  # the generated session's file
    sized: str = ""  # the context the sizing run chose, in words ("" when it did not run)


@dataclasses.dataclass(frozen=True)
class SessionResult:
    outcome: SessionOutcome
    series: tuple[SessionSeries, ...]  # the replayed series, for the summary table and the verdict


def _session_configs(request: SessionRequest) -> list[LlamaConfig]:
    """One configuration per combination of the swept values; the arguments after ``--`` that the option table
    knows become settings of each, the rest pass through."""

    return command_configs(request.sweeps, (), request.server_args)


def _requested(request: SessionRequest, context: ModelContext) -> WorkloadSpec:
    """The session the options ask for, before it is fitted to the model."""
    byte_vocab = request.chars_per_token is None and context.byte_vocab
    generation = {name: getattr(request, name) for name in GENERATION_OPTIONS}
    generation["chars_per_token"] = request.chars_per_token or (1.0 if byte_vocab else 4.0)
    return WorkloadSpec(**generation)


def _check_replay(request: SessionRequest, configs: Sequence[LlamaConfig], spec: WorkloadSpec | None) -> None:
    """Fail before anything starts when a configuration or the context cannot hold the session, or when a
    replayed file is missing or is shaped by options that only shape a generated one."""

    need = None if spec is None else spec.target_tokens + request.response_tokens
    check_offload_and_context(request.model, [c.n_cpu_moe for c in configs if c.get("n-cpu-moe") is not None], need)
    if need is not None:
        check_explicit_context(request.server_args, need)
        if request.ctx_size is not None and request.ctx_size < need:
            raise XoverError(
                f"--ctx-size {request.ctx_size} is shorter than the session's last turn plus its response "
                f"(about {need} tokens): raise it or leave it out (xover sizes it)"
            )
    if spec is None:
        assert request.workload is not None
        shaping = [name for name in GENERATION_OPTIONS if name in request.explicit]
        if shaping:
            raise XoverError(
                f"--{shaping[0].replace('_', '-')} shapes a generated session; --workload replays a file: drop one"
            )
        if not request.workload.is_file():
            raise XoverError(f"workload {request.workload} does not exist: fix --workload")


def replay_session(
    request: SessionRequest,
    *,
    command: Sequence[str] = (),
    on_event: Callable[[SessionEvent | SessionStarted], None] = lambda ev: None,
) -> SessionResult:
    """``xover session``: the request checked against the model and its context (before any server starts), the
    session generated and sized for the model (or the file read), then :func:`run_session` on every configuration
    x cache mode. ``on_event`` gets :class:`SessionStarted` first, then :data:`xover.measure.events.SessionEvent`
    (a :class:`xover.measure.events.Note` after a :class:`xover.measure.events.Sized` whose longest turn does not
    fit the model's training context)."""

    model = request.model
    if not model.is_file():
        raise XoverError(f"model {model} does not exist: fix -m")
    context = model_context(model)
    given = frozenset(n for n in _SCALABLE if n in request.explicit)
    requested = _requested(request, context) if request.workload is None else None
    spec, line = (
        fit_to_context(requested, context.n_ctx_train, request.response_tokens, given, context.name)
        if requested is not None
        else (None, None)
    )
    configs = _session_configs(request)
    _check_replay(request, configs, spec)
    binaries = resolve(request.llama_bin_dir)
    ctx_size, started = request.ctx_size, SessionStarted(0)
    if spec is not None and requested is not None:
        sized_text = ""
        if context.n_ctx_train and ctx_size is None:
            # the real token counts, and what the server's own replies become when fed back, decide
            spec, line, sized = _fit_by_sizing(
                request, requested, spec, line, given, context, binaries, model.resolve(), configs[0]
            )
            ctx_size = sized.ctx_size
            sized_text = (
                f"context sized to {sized.ctx_size} tokens (longest turn {sized.max_prompt_tokens} "
                f"tokens; llama-server holds at most {context.n_ctx_train:,} per slot)"
            )
        vocab = (
            "sized at 1 character per token (xover's synthetic byte vocabulary)"
            if request.chars_per_token is None and context.byte_vocab
            else ""
        )
        path = write_workload(request.study_dir, spec)
        started = SessionStarted(0, "; ".join(x for x in (line, vocab) if x), path, sized_text)
    else:
        assert request.workload is not None
        path = request.workload
    n_turns = turn_count(path.read_text(encoding="utf-8"), source=str(path))
    on_event(dataclasses.replace(started, total=len(configs) * len(request.modes) * n_turns))

    def forward(ev: SessionEvent) -> None:
        on_event(ev)
        if isinstance(ev, Sized) and context.n_ctx_train and ev.need_tokens > context.n_ctx_train:
            on_event(Note(_beyond_training(ev, context, request.response_tokens)))

    outcome = run_session(
        request.study_dir,
        binaries,
        model.resolve(),
        path,
        configs,
        request.modes,
        request.response_tokens,
        exact=request.exact,
        cache_reuse=request.cache_reuse,
        ctx_size=ctx_size,
        command=command,
        startup_timeout_s=request.startup_timeout_s,
        on_event=forward,
    )
    series = series_from_rows((outcome.run_id, outcome.labels[t.config_key], t) for t in outcome.turns)
    return SessionResult(outcome, tuple(series))


def _beyond_training(sized: Sized, context: ModelContext, response_tokens: int) -> str:
    """Why turns will fail: the sized session's longest turn does not fit the model's training context."""
    replies = (
        ""
        if sized.reply_growth is None
        else f"; each fed-back reply of {response_tokens} tokens comes back as about "
        f"{sized.reply_growth * response_tokens:,.0f} (--exact feeds the recorded replies)"
    )
    return (
        f"the longest turn needs {sized.need_tokens:,} tokens, beyond {context.name}'s training context "
        f"of {context.n_ctx_train:,}: llama-server caps a slot there, so turns past it fail{replies}"
    )


def _fit_by_sizing(
    request: SessionRequest,
    requested: WorkloadSpec,
    spec: WorkloadSpec,
    line: str | None,
    given: frozenset[str],
    context: ModelContext,
    binaries: Binaries,
    model: Path,
    config: LlamaConfig,
) -> tuple[WorkloadSpec, str | None, Sized]:
    """The generated session refitted until its real size fits the model's training context.

    llama-server caps a slot at the training context, so the longest turn, with the replies fed back
    and the response, must fit it. A sizing server (what the replay would start anyway) tokenizes every
    turn and measures what a generated reply becomes when fed back; while the session does not fit, it
    is refitted with that reply size and the tokenizer's excess over the estimate reserved. Returns the
    session spec, its one-line description and the sizing (whose context the replay then uses)."""

    exact, response_tokens = request.exact, request.response_tokens
    reply, slack = 0, 0
    for _ in range(4):
        sized = asyncio.run(
            size_context(
                binaries,
                model,
                config,
                generate(spec),
                exact,
                response_tokens,
                request.study_dir / "logs",
                has_flag(binaries.server, "-fit"),
                request.startup_timeout_s,
            )
        )
        if sized.need_tokens <= context.n_ctx_train:
            return spec, line, sized
        if not exact:
            reply = max(reply, reply_allowance(sized.reply_growth, response_tokens))
        slack += max(0, sized.max_prompt_tokens - last_turn_tokens(spec)) + 64
        spec, line = fit_to_context(
            requested, context.n_ctx_train, response_tokens, given, context.name, reply_tokens=reply, slack=slack
        )
        if line is None:  # every size was given: nothing left to scale
            break
    raise XoverError(
        f"the session's longest turn needs {sized.need_tokens:,} tokens with its response"
        + ("" if exact else " and the fed-back replies")
        + f", beyond {context.name}'s training context of "
        f"{context.n_ctx_train:,} (llama-server caps a slot there): lower --target-tokens or --turns"
        + ("" if exact else ", or replay --exact")
    )
