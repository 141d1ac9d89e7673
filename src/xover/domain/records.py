"""Typed, immutable records: what was measured, under which configuration, on which machine.

No computation and no I/O here; :mod:`xover.domain.codec` turns them into JSON-shaped data and back, and
:mod:`xover.results.store` is the only place that stores them.
Times are integer nanoseconds (``_ns``) unless a name says otherwise; missing is ``None``, never 0.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any


@dataclasses.dataclass(frozen=True)
class ModelId:
    """A model file as identified in results: name, size and a hash of its GGUF header."""

    path: str
    name: str
    size_bytes: int
    header_sha256: str

    @property
    def key(self) -> str:
        return f"{self.name}:{self.size_bytes}:{self.header_sha256[:16]}"


@dataclasses.dataclass(frozen=True)
class Provenance:
    """Where and with what a number was produced. Attached to every run."""

    llama_build_commit: str | None
    llama_build_number: int | None
    llama_backend: str | None
    llama_bin_dir: str | None
    llama_bin_source: str | None  # how the binaries were chosen: flag, env, cache, PATH
    cpu_info: str | None
    gpu_info: str | None
    hostname: str
    os: str
    xover_version: str
    model: ModelId | None
    extra: tuple[tuple[str, str], ...] = ()
    # the engine whose binaries the run ran (xover.domain.llama_options.ENGINES); None in runs stored before xover
    # recorded it
    llama_engine: str | None = None


ROUND_DOC = """A sample's ``round``: a positive number is the round of fresh processes it was measured in (each round
starts every configuration's process afresh, in an order that alternates between rounds); a negative number is the
drift check after round ``-round`` (the first configuration measured again, in a fresh process, at the end of its
stage); None: measured before xover measured in rounds (one server or llama-bench process per configuration)."""

TTFT_MODES = ("cold", "warm")
"""A TTFT sample's ``mode`` where each request is the whole prompt: ``cold`` (no cache, ``cache_n == 0`` proves it)
or ``warm`` (the same prompt again, served from the slot's cache). The one list: ``xover ttft --mode``, its plan,
the audit and the report read it."""

CHAT_MODE = "chat"
"""A chat-shaped cold prompt's sample ``mode``: ``length`` tokens sent as many chat messages on
``/v1/chat/completions`` (:mod:`xover.domain.chat_prompts`), not one token array; cold as ``cold`` is
(``cache_n == 0`` and ``prompt_n == length`` prove it). Compared with the cold samples of the same length and server."""

CACHED_MODE = "cached:"
"""A cached agentic turn's sample ``mode``: ``cached:<depth>``. Its ``length`` is the turn's new tokens, sent after the
``depth`` tokens the slot's cache already holds (``cache_n == depth`` and ``prompt_n == length`` prove it)."""


def cached_mode(depth: int) -> str:
    return f"{CACHED_MODE}{depth}"


def cached_depth(mode: str) -> int | None:
    """The cached context of a ``cached:<depth>`` mode; None for any other mode."""
    if not mode.startswith(CACHED_MODE):
        return None
    try:
        return int(mode[len(CACHED_MODE) :])
    except ValueError:
        return None


RPC_WORKER_KEY = "rpc_worker "
"""A provenance ``extra`` key's prefix: ``rpc_worker host:port`` names an RPC worker a run used, its value says what
the worker is (its build, backend and devices, or that the user runs it)."""


@dataclasses.dataclass(frozen=True)
class BenchResult:
    """One llama-bench test (e.g. ``pp512 @ d4000``) with every repetition kept."""

    config_key: str
    n_prompt: int  # llama-bench's -p, -n and -d of the test
    n_gen: int
    n_depth: int
    samples_ns: tuple[int, ...]  # one per repetition, warm-up excluded (llama-bench's own)
    samples_ts: tuple[float, ...]
    avg_ts: float
    stddev_ts: float
    record: dict[str, Any]  # llama-bench's JSONL object, untouched
    round: int | None = None  # the round of fresh processes it was measured in (ROUND_DOC); None: not in rounds

    @property
    def test_name(self) -> str:
        """llama-bench's name for the test: ``pp512``, ``tg128``, ``pp512+tg128``, with `` @ dN``."""
        if self.n_prompt and self.n_gen:
            name = f"pp{self.n_prompt}+tg{self.n_gen}"
        elif self.n_prompt:
            name = f"pp{self.n_prompt}"
        else:
            name = f"tg{self.n_gen}"
        return f"{name} @ d{self.n_depth}" if self.n_depth else name


@dataclasses.dataclass(frozen=True)
class ServerTimings:
    """llama-server's own ``timings`` object from the final streamed event."""

    cache_n: int | None
    prompt_n: int | None
    prompt_ms: float | None
    prompt_per_second: float | None
    predicted_n: int | None
    predicted_ms: float | None
    predicted_per_second: float | None


@dataclasses.dataclass(frozen=True)
class TtftSample:
    """One streamed request: the client's clocks and the server's timings side by side.

    Client times are ``perf_counter_ns`` offsets from the moment the request was sent.
    ``first_byte_ns`` is the first byte of the response body, whatever it is: on a prefill longer
    than llama-server's ``--sse-ping-interval`` (30 s by default) that is its keep-alive comment
    ``:`` at 30 s, not a token. TTFT is ``first_token_ns``.
    """

    config_key: str
    mode: str  # "cold", "warm", a cached turn's "cached:<depth>" (CACHED_MODE) or a cache-lab request's "cache:..."
    length: int  # prompt tokens intended (a cached turn: its new tokens, after the cached depth)
    rep: int  # repetition index; warm-up requests are not stored as samples
    prompt_id: str  # identifies the exact prompt (seed), so uniqueness can be audited
    sent_at_unix_ns: int
    first_byte_ns: int | None
    first_token_ns: int | None
    end_ns: int | None
    token_times_ns: tuple[int, ...]
    n_tokens_received: int
    timings: ServerTimings | None
    cache_ok: bool  # the declared cache state held (cold: cache_n == 0 and prompt_n == length)
    error: str | None = None
    round: int | None = None  # the round of fresh server processes it was measured in (ROUND_DOC)

    @property
    def counted(self) -> bool:
        """It passed its cache check and completed with a first token: the only samples summarised."""
        return self.cache_ok and self.error is None and self.first_token_ns is not None

    @property
    def drift_check(self) -> bool:
        """Measured in a drift check (the first configuration again at the end of its stage), not in a round."""
        return self.round is not None and self.round < 0

    @property
    def counted_cold(self) -> bool:
        """A cold sample that is :attr:`counted`, of a round (or measured before rounds): the only samples averaged
        as cold TTFT."""
        return self.mode == "cold" and self.counted and not self.drift_check

    @property
    def counted_cached(self) -> bool:
        """A cached turn's sample that is :attr:`counted` (its cached part proven), of a round: the samples the
        cached-turn verdicts average."""
        return cached_depth(self.mode) is not None and self.counted and not self.drift_check


@dataclasses.dataclass(frozen=True)
class Failure:
    """A configuration or point that could not be measured, kept as data."""

    config_key: str
    stage: str  # "bench", "ttft", "server-start", ...
    point: str  # human description of what was being measured
    reason: str
    stderr_tail: str = ""


INTERRUPTED = "a signal xover did not send: an interrupted measurement"
"""What a llama-bench failure's reason says when the process died by a signal xover did not send (SIGKILL from the
OOM killer or a stray ``kill``, SIGSEGV): not a result of the configuration, so it is retried once in a fresh
process, and a resume retries it again (:func:`interrupted`)."""

RETRY_HINT = "run the study again to retry"


def interrupted(reason: str | None) -> bool:
    """Whether a stored failure's reason is an interrupted measurement (:data:`INTERRUPTED`), which a resume retries;
    a failure that is the configuration's own (a value llama.cpp rejects, out of memory at load, a timeout) is not."""
    return bool(reason) and INTERRUPTED in str(reason)


def failure_round(point: str) -> int | None:
    """The round a llama-bench failure's point names (``... in round 2``); None: measured outside rounds."""
    m = re.search(r" in round (-?\d+)$", point)
    return int(m.group(1)) if m else None


@dataclasses.dataclass(frozen=True)
class SessionTurn:
    """One turn of a replayed agentic session (:mod:`xover.measure.session`): client clocks, the
    server's usage and timings, and the reply that was fed back into the conversation.

    Client times are ``perf_counter_ns`` offsets from the send: ``first_token_ns`` is TTFT,
    ``end_ns`` (the ``[DONE]`` event) is the turn time. ``prompt_tokens`` is the server's count
    (``usage.prompt_tokens``, equal to ``cache_n + prompt_n``); ``prefix_tokens`` is the longest
    common prefix, in the server's tokens, of this turn's prompt and the previous turn's (None on
    turn 0): what a prefix cache can serve at best, short of the previous reply.
    """

    config_key: str
    mode: str  # cache mode: "default", "off" or "reuse"
    session_id: str  # the workload file's content hash
    feed: str  # "generated" (the server's replies fed back) or "recorded" (the file's replies)
    turn: int
    rewrite: bool  # the turn changed earlier messages in place
    sent_at_unix_ns: int
    prompt_tokens: int | None
    prefix_tokens: int | None
    cached_tokens: int | None  # usage.prompt_tokens_details.cached_tokens
    completion_tokens: int | None
    first_byte_ns: int | None
    first_token_ns: int | None
    last_token_ns: int | None  # the last event carrying reply text
    end_ns: int | None
    n_content_events: int
    reply: str  # the generated reply text
    reply_tokens: int | None  # the server's token count of the reply as fed back (generated feed only)
    timings: ServerTimings | None
    error: str | None = None


_BACKEND_NAMES = {
    "cpu": "CPU",
    "cuda": "CUDA",
    "hip": "HIP",
    "rocm": "HIP",
    "vulkan": "Vulkan",
    "metal": "Metal",
    "sycl": "SYCL",
    "musa": "MUSA",
    "blas": "BLAS",
}


def backend_name(text: str) -> str:
    """A backend as llama-bench spells it (``CUDA``, ``Vulkan``), whether it came from llama-bench's
    ``backends`` field or from a build manifest (``cuda``); comma-separated lists keep their order."""
    return ",".join(_BACKEND_NAMES.get(b.strip().lower(), b.strip()) for b in text.split(",") if b.strip())


@dataclasses.dataclass(frozen=True)
class TtftPoint:
    """One sample a TTFT plan asks for: a prompt length and repetition, cold or (``depth``) a cached turn."""

    length: int
    rep: int
    depth: int = 0  # a cached agentic turn's context in the slot's cache (``length`` new tokens after it); 0: cold
    chat: bool = False  # a cold prompt sent as chat messages (CHAT_MODE), not one token array

    @property
    def mode(self) -> str:
        """The mode its sample is stored with: ``cold``, ``chat`` or ``cached:<depth>``."""
        return cached_mode(self.depth) if self.depth else CHAT_MODE if self.chat else "cold"
