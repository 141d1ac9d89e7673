"""Time-to-first-token through llama-server: plan, run, check, summarise.

* **Plan** (pure): lengths x repetitions, for each server configuration, rep-major so that slow
  drift spreads over all lengths instead of piling onto one.
* **Run**: one server per configuration (started once, or the one at ``--url``), one discarded
  warm-up request, then every point; each sample is written to the store the moment it is
  measured, so a fault or Ctrl-C keeps everything before it. Progress is a stream of events.
* **Check** (pure): cold samples must show ``cache_n == 0`` and ``prompt_n == L``; warm samples
  ``cache_n == L - 1`` and ``prompt_n == 1``. A sample that fails is stored with
  ``cache_ok=False``, never averaged, and re-run with a fresh prompt a bounded number of times.
* **Summarise** (pure): per configuration and length, from stored samples alone.

Client clocks (offsets from the send, integer ns): first body byte, first event with generated
content (TTFT), final event. Server clocks: the ``timings`` of the final event. The client-server
gap is client TTFT minus the server's ``prompt_ms``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import statistics
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import gguf

from xover.analysis.rounds import rotated
from xover.analysis.stats import Summary, summarize_present
from xover.client.chat import ChatClient, ChatRecord, chat_body
from xover.client.http import LlamaClient, StreamRecord, completion_body, wait_healthy
from xover.domain.artifacts import TTFT_SKIPPED, SkippedPoint
from xover.domain.chat_prompts import ChatPrompt, ChatPrompts
from xover.domain.config import LlamaConfig, command_configs
from xover.domain.llama_options import LlamaOption
from xover.domain.prompts import WORDS, Prompt, TextPrompts, TokenPrompts, token_pool
from xover.domain.records import CHAT_MODE, TTFT_MODES, Failure, ServerTimings, TtftPoint, TtftSample, cached_depth
from xover.domain.sse import CompletionStream
from xover.errors import XoverError
from xover.gguf.inspect import check_offload_and_context
from xover.hardware.vram import holding
from xover.llamacpp import memory
from xover.llamacpp.binaries import Binaries, resolve
from xover.llamacpp.server import (
    LlamaServer,
    ServerLaunch,
    buffer_log_verbosity,
    check_explicit_context,
    context_size,
    has_flag,
)
from xover.measure.bench import describe_memory, memory_by_config
from xover.measure.budget import planner_notes
from xover.measure.events import Note, Rerun, SampleDone, ServerUp, TtftEvent
from xover.measure.recorder import Recording
from xover.measure.server_session import props_n_ctx, started_server, warm_up, warmup_lengths
from xover.results.store import Store

MODES = TTFT_MODES
# A client-server gap is worth a warning above this many ms, or above this share of TTFT (and 1 ms).
GAP_WARN_MS = 5.0
GAP_WARN_SHARE = 0.05


# ---- plan (pure) ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TtftPlan:
    """What each server measures: every length ``reps`` times, or exactly ``points`` when given
    (a resumed study asks only for the samples it still lacks)."""

    lengths: tuple[int, ...]
    reps: int
    response_tokens: int
    mode: str = "cold"
    text: bool = False
    seed: int = 0  # prompts are unique within a run; a different seed keeps runs apart too
    max_retries: int = 2  # re-runs of a sample that fails its cache check
    points: tuple[TtftPoint, ...] | None = None
    # Skip a point whose TTFT, scaled linearly from the longest shorter length measured on the configuration
    # (this run's samples and ``known``: stored medians, length -> seconds), would exceed this many seconds.
    max_ttft_s: float | None = None
    known: tuple[tuple[str, int, float], ...] = ()  # (config key, length, median seconds) measured before
    round: int | None = None  # the round of fresh servers it is (xover.domain.records.ROUND_DOC)
    # tokens a cached agentic turn generates (None: response_tokens): the whole response, so that its decode, which
    # the cached-turn verdicts use, is measured over enough tokens to be steady and not scaled from a few
    cached_response_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise XoverError(f"mode {self.mode!r} is not one of {', '.join(MODES)}")
        if not self.lengths or min(self.lengths) < 1:
            raise XoverError("prompt lengths must be at least 1 token")
        if self.mode == "warm" and min(self.lengths) < 2:
            raise XoverError("warm mode needs prompts of at least 2 tokens (one cached, one evaluated)")
        if self.reps < 1:
            raise XoverError("repetitions (-r) must be at least 1")
        if self.response_tokens < 1 or (self.cached_response_tokens is not None and self.cached_response_tokens < 1):
            raise XoverError("--response-tokens must be at least 1")
        if self.max_retries < 0:
            raise XoverError("retries must be >= 0")
        if self.points is not None and not {p.length for p in self.points if p.mode == "cold"} <= set(self.lengths):
            raise XoverError("every planned point's length must be one of the plan's lengths")
        if any(p.depth or p.chat for p in self.points or ()) and (self.mode != "cold" or self.text):
            raise XoverError("cached turns and chat prompts are measured beside cold samples, on token-id prompts")


def linear_estimate(length: int, medians: Mapping[int, float], inclusive: bool = False) -> tuple[float, int] | None:
    """TTFT at ``length`` scaled linearly from the longest shorter length with a median (``inclusive``: or that
    length itself), and that length; None without one. Linear is a floor for prefill (attention adds a quadratic
    term): a cap on it errs towards measuring."""
    shorter = [L for L in medians if L < length or (inclusive and L == length)]
    if not shorter:
        return None
    base = max(shorter)
    return medians[base] * length / base, base


def _shortest(points: Sequence[TtftPoint]) -> int | None:
    """The shortest cold prompt a server's points send (they come first), else its fewest cached-turn new tokens."""
    cold = [p.length for p in points if not p.depth]
    return min(cold or [p.length for p in points], default=None)


def expand(plan: TtftPlan) -> tuple[TtftPoint, ...]:
    """The points one server measures, in order: every length once per repetition, rep-major, each repetition
    begun one length further on (:func:`xover.analysis.rounds.rotated`), so that no length is always first."""
    if plan.points is not None:
        return plan.points
    return tuple(TtftPoint(length=L, rep=r) for r in range(plan.reps) for L in rotated(plan.lengths, r))


# ---- checks and per-sample metrics (pure) -----------------------------------------------------


def check_cache(mode: str, length: int, timings: ServerTimings | None) -> str | None:
    """None when the declared cache state held, else why not (one line).

    A cached turn (``cached:DEPTH``) may also show ``cache_n = DEPTH - 1`` and ``prompt_n = L + 1``: where the turn
    leaves the cached conversation at DEPTH and a sliding-window (SWA) cache no longer reaches back there (gpt-oss at
    ``-ub 512``: the window plus one ubatch of cells), llama-server restores the context checkpoint taken at DEPTH and
    resumes at its last position (``n_past = pos_max``), so that one token is processed again. The context came from
    the cache; an earlier checkpoint (more tokens again) still fails."""
    if timings is None or timings.cache_n is None or timings.prompt_n is None:
        return "no cache_n/prompt_n in the server's timings"
    depth = cached_depth(mode)
    want = (0, length) if mode in ("cold", CHAT_MODE) else (depth, length) if depth is not None else (length - 1, 1)
    if (timings.cache_n, timings.prompt_n) == want:
        return None
    if depth is not None and (timings.cache_n, timings.prompt_n) == (depth - 1, length + 1):
        return None  # a checkpoint restored at the depth: its last token again
    return (
        f"{mode} check failed: cache_n={timings.cache_n} prompt_n={timings.prompt_n}, "
        f"expected cache_n={want[0]} prompt_n={want[1]}"
    )


@dataclasses.dataclass(frozen=True)
class SampleMetrics:
    """Numbers derived from one stored sample; None where an input is missing."""

    ttft_ns: int | None
    gap_ns: int | None  # client TTFT - server prompt_ms
    prefill_tps_client: float | None  # L / client TTFT (cold samples; a warm one evaluates a single token)
    prefill_tps_server: float | None  # server prompt_per_second
    decode_tps_client: float | None  # tokens after the first / time from first to last
    decode_tps_server: float | None  # server predicted_per_second
    first_two_together: bool  # tokens 1 and 2 became visible at once: TTFT includes a decode step


def sample_metrics(s: TtftSample) -> SampleMetrics:
    t = s.timings
    ttft = s.first_token_ns
    gap = ttft - round(t.prompt_ms * 1e6) if ttft is not None and t is not None and t.prompt_ms is not None else None
    times = s.token_times_ns
    span = times[-1] - times[0] if len(times) >= 2 else 0
    return SampleMetrics(
        ttft_ns=ttft,
        gap_ns=gap,
        prefill_tps_client=s.length / (ttft / 1e9) if ttft and s.mode == "cold" else None,
        prefill_tps_server=t.prompt_per_second if t else None,
        decode_tps_client=(len(times) - 1) / (span / 1e9) if span > 0 else None,
        decode_tps_server=t.predicted_per_second if t else None,
        first_two_together=len(times) >= 2 and times[0] == times[1],
    )


# ---- summaries (pure) -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PointSummary:
    """One configuration at one length: cache-checked samples summarised, every sample counted."""

    config_key: str
    mode: str
    length: int
    n_samples: int  # every stored sample, failed checks and errors included
    n_ok: int  # samples that passed the cache check (the only ones summarised)
    n_reps: int  # repetitions attempted
    n_reruns: int  # extra attempts after failed checks
    n_errors: int
    n_first_two_together: int
    ttft_ns: Summary | None
    prefill_tps_client: Summary | None
    prefill_tps_server: Summary | None
    decode_tps_client: Summary | None
    decode_tps_server: Summary | None
    gap_ns: Summary | None

    @property
    def gap_is_large(self) -> bool:
        if self.gap_ns is None or self.ttft_ns is None:
            return False
        gap_ms = self.gap_ns.median / 1e6
        return gap_ms > GAP_WARN_MS or (gap_ms > 1.0 and gap_ms > GAP_WARN_SHARE * self.ttft_ns.median / 1e6)


def summarize_points(samples: Sequence[TtftSample]) -> list[PointSummary]:
    """Per (configuration, mode, length), in first-seen order."""
    groups: dict[tuple[str, str, int], list[TtftSample]] = {}
    for s in samples:
        groups.setdefault((s.config_key, s.mode, s.length), []).append(s)
    out = []
    for (key, mode, length), group in groups.items():
        ok = [sample_metrics(s) for s in group if s.counted]
        reps = {s.rep for s in group}
        out.append(
            PointSummary(
                config_key=key,
                mode=mode,
                length=length,
                n_samples=len(group),
                n_ok=len(ok),
                n_reps=len(reps),
                n_reruns=len(group) - len(reps),
                n_errors=sum(1 for s in group if s.error is not None),
                n_first_two_together=sum(1 for m in ok if m.first_two_together),
                ttft_ns=summarize_present([m.ttft_ns for m in ok]),
                prefill_tps_client=summarize_present([m.prefill_tps_client for m in ok]),
                prefill_tps_server=summarize_present([m.prefill_tps_server for m in ok]),
                decode_tps_client=summarize_present([m.decode_tps_client for m in ok]),
                decode_tps_server=summarize_present([m.decode_tps_server for m in ok]),
                gap_ns=summarize_present([m.gap_ns for m in ok]),
            )
        )
    return out


def gap_note(p: PointSummary, label: str, cold_cache: bool | None, slots: int | None = None) -> str | None:
    """A warning that names the likely cause when the median client-server gap is large, resting only
    on what is known about the server.

    ``cold_cache``: whether xover started the server with ``-np 1 --cache-ram 0`` (None: it did not
    start it, ``--url``). ``slots``: the slot count the server reports (``/props`` ``total_slots``;
    None when it does not say). llama-server's ``/props`` does not report ``--cache-ram``.
    """
    if not p.gap_is_large or p.gap_ns is None:
        return None
    head = (
        f"{label} L={p.length}: client TTFT exceeds the server's prompt_ms by {p.gap_ns.median / 1e6:.1f} ms (median)"
    )
    outside = "HTTP and tokenization, a busy CPU, or a first token held back by the server"
    if cold_cache:
        return f"{head}; the server has one slot and no prompt cache, so the time is spent outside prefill: {outside}"
    if cold_cache is False:
        return (
            f"{head}; likely the server saving the previous slot's state to host memory before the new prompt "
            "(--cache-ram, on by default, and several slots): start it with -np 1 --cache-ram 0"
        )
    saving = (
        "saving the previous prompt's state to its host-memory prompt cache before each new prompt (--cache-ram, "
        "on by default)"
    )
    if slots == 1:
        return (
            f"{head}; the server reports 1 slot (/props) but not whether --cache-ram is on: if it is, {saving} "
            f"is the likely cause (start it with --cache-ram 0); if not, the time is spent outside prefill: {outside}"
        )
    if slots is not None:
        return (
            f"{head}; the server reports {slots} slots (/props) but not whether --cache-ram is on: if it is, "
            f"{saving} is the likely cause: start it with -np 1 --cache-ram 0"
        )
    return (
        f"{head}; the server reports neither its slots nor --cache-ram (/props), so the cause is unknown: {saving} "
        f"with several slots, or time outside prefill: {outside}"
    )


# ---- run --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RunOutcome:
    run_id: int
    samples: tuple[TtftSample, ...]
    failures: tuple[Failure, ...]
    labels: Mapping[str, str]  # config key -> label
    cold_cache: Mapping[str, bool | None]  # config key -> started with -np 1 --cache-ram 0 (None: unknown)
    slots: Mapping[str, int | None] = dataclasses.field(default_factory=dict)  # config key -> /props total_slots


class _PointFailedError(Exception):
    """A request failed: the configuration's remaining points are skipped.

    ``counted``: the failed request was stored as a sample (so progress already counted it).
    """

    def __init__(self, message: str, counted: bool) -> None:
        super().__init__(message)
        self.counted = counted


def launches(
    model: Path,
    sweeps: Sequence[tuple[LlamaOption, Sequence[str]]],
    env: Sequence[tuple[str, Sequence[str]]],
    server_args: Sequence[str],
    plan: TtftPlan,
    fit_off: bool,
    log_verbosity: int | None,
) -> list[ServerLaunch]:
    """``xover ttft``'s servers: one per combination of the swept values (:func:`xover.domain.config.matrix`,
    labelled like ``xover bench``'s), each with ``-c`` sized to the plan's longest prompt and response. Of the
    arguments given after ``--``, those the option table knows become settings of every configuration, the rest
    are passed through after them."""

    ctx = context_size(max(plan.lengths), plan.response_tokens)
    return [
        ServerLaunch(c, model.resolve(), ctx, fit_off=fit_off, log_verbosity=log_verbosity)
        for c in command_configs(sweeps, env, server_args)
    ]


def gguf_token_types(model: Path) -> list[int]:
    """``tokenizer.ggml.token_type`` of a GGUF (empty when the file has none)."""

    try:
        field = gguf.GGUFReader(str(model)).get_field("tokenizer.ggml.token_type")
    except (OSError, ValueError) as e:
        raise XoverError(f"{model}: cannot read its vocabulary ({e}); check -m") from None
    return [int(t) for t in field.contents()] if field is not None else []


class TtftRun:
    """One ``xover ttft`` run writing into ``store``: a run record, samples, failures, server props."""

    def __init__(
        self,
        store: Store,
        plan: TtftPlan,
        command: Sequence[str],
        *,
        binaries: Binaries | None = None,
        model: Path | None = None,
        on_event: Callable[[TtftEvent], None] = lambda ev: None,
    ) -> None:
        self.store = store
        self.plan = plan
        self.binaries = binaries
        self.model = model
        self.on_event = on_event
        self.rec = Recording(store, "ttft", command, binaries=binaries, model=model, on_event=on_event)
        self.samples: list[TtftSample] = []
        self.labels: dict[str, str] = {}
        self.cold_cache: dict[str, bool | None] = {}
        self.slots: dict[str, int | None] = {}
        self._index = itertools.count()  # prompt index: every request of the run gets its own prompt
        self._token_prompts: TokenPrompts | None = None
        self._chat_prompts: ChatPrompts | None = None
        self._contexts: dict[int, Prompt] = {}  # depth -> this server's primed cached-turn context
        self._text_prompts = TextPrompts(plan.seed)

    # -- the two ways to run ------------------------------------------------------------------

    async def run_managed(
        self, specs: Sequence[ServerLaunch], log_dir: Path, startup_timeout_s: float = 600.0
    ) -> RunOutcome:
        """Start each configuration's server once, measure its points, stop it."""
        assert self.binaries is not None
        return await self._guard(self._managed(specs, log_dir, startup_timeout_s))

    async def run_url(self, url: str, *, api_key: str | None = None, startup_timeout_s: float = 60.0) -> RunOutcome:
        """Measure the server already running at ``url`` (same checks; no lifecycle)."""
        return await self._guard(self._url(url, api_key, startup_timeout_s))

    async def _guard(self, body: Awaitable[None]) -> RunOutcome:
        with self.rec:  # ends the run: interrupted, failed or done (xover.measure.recorder)
            await body
        assert self.rec.run_id is not None
        return RunOutcome(
            self.rec.run_id,
            tuple(self.samples),
            tuple(self.rec.failures),
            dict(self.labels),
            dict(self.cold_cache),
            dict(self.slots),
        )

    async def _managed(self, specs: Sequence[ServerLaunch], log_dir: Path, startup_timeout_s: float) -> None:
        assert self.binaries is not None
        points = expand(self.plan)
        for spec in specs:
            config = spec.config
            self.labels[config.key] = config.name
            self.cold_cache[config.key] = spec.cold_cache
            try:
                async with started_server(
                    self.rec, self.binaries, spec, log_dir, startup_timeout_s=startup_timeout_s
                ) as srv:
                    assert srv.client is not None
                    backend = self.binaries.for_config(config).expected_backend
                    await self._measure(
                        srv.client, config, srv.props, srv.model_meta, points, srv.log_path,
                        warmup_lengths(config, backend, spec.ctx_size, _shortest(points)),
                    )  # fmt: skip
                    self._record_memory(config, srv)
            except XoverError as e:
                self._fail(config, "server-start", "llama-server start", str(e), len(points))

    async def _url(self, url: str, api_key: str | None, startup_timeout_s: float) -> None:
        config = LlamaConfig(name=url, url=url)
        self.labels[config.key] = url
        self.cold_cache[config.key] = None
        points = expand(self.plan)
        async with ChatClient(url, api_key=api_key) as client:
            try:
                await wait_healthy(client, startup_timeout_s)
                props = await client.get_json("/props")
                models = await client.get_json("/v1/models")
            except XoverError as e:
                self._fail(config, "server-start", f"llama-server at {url}", str(e), len(points))
                return
            data = models.get("data") if isinstance(models, dict) else None
            meta = dict(data[0].get("meta") or {}) if isinstance(data, list) and data else {}
            self.rec.server_props(config, props, meta, url=url)
            # a server of the user's: its ubatch unknown here, llama.cpp's default is the guess
            ctx = props_n_ctx(props) or max(p.length + p.depth for p in points) + 2 * self.plan.response_tokens
            warmup = warmup_lengths(config, None, ctx, _shortest(points))
            await self._measure(client, config, props, meta, points, None, warmup)

    # -- one server -----------------------------------------------------------------------------

    def _record_memory(self, config: LlamaConfig, srv: LlamaServer) -> None:
        """The server's peak memory, read before it stops: VmHWM, and the buffers its log reports."""
        if srv.pid is None or srv.log_path is None:
            return
        use = memory.MemoryUse(
            memory.peak_rss_bytes(srv.pid), memory.parse_buffer_lines(memory.buffer_lines_in(srv.log_path))
        )
        self.rec.artifact(
            memory.ARTIFACT,
            {"config_key": config.key, "label": config.label, "source": "llama-server", **use.to_dict()},
            build=config.build,
        )

    def _fail(self, config: LlamaConfig, stage: str, point: str, reason: str, skipped: int) -> None:
        self.rec.fail(config, Failure(config_key=config.key, stage=stage, point=point, reason=reason), skipped=skipped)

    async def _measure(
        self,
        client: ChatClient,
        config: LlamaConfig,
        props: Mapping[str, Any],
        model_meta: Mapping[str, Any],
        points: Sequence[TtftPoint],
        log_path: Path | None,
        warmup: Sequence[int],
    ) -> None:
        """Every point on a server whose props are stored (:meth:`Recording.server_props`), after the discarded
        warm-up prompts of ``warmup`` tokens (:func:`xover.measure.server_session.warmup_lengths`)."""
        run_id = self.rec.ensure(props=props, build=config.build)
        reported = props.get("total_slots")
        slots = reported if isinstance(reported, int) and not isinstance(reported, bool) and reported > 0 else None
        self.slots[config.key] = slots
        if slots is not None and slots > 1 and self.cold_cache.get(config.key):  # -np in extra arguments overrode -np 1
            self.cold_cache[config.key] = False
        self.on_event(
            ServerUp(
                label=config.label,
                url=client.base_url,
                log_path=log_path,
                build_info=str(props.get("build_info")) if props.get("build_info") else None,
            )
        )
        done, where = 0, "warm-up"
        self._contexts = {}  # a cached-turn context is primed once per server
        try:
            failed = await warm_up(client, [(await self._prompt(client, model_meta, n)).prompt for n in warmup])
            if failed is not None:
                raise _PointFailedError(failed, counted=False)
            for point in points:
                where = f"L={point.length} rep {point.rep + 1}"
                if self._over_cap(config, point, run_id):
                    done += 1
                    continue
                await self._point(client, config, model_meta, point, run_id)
                done += 1
        except _PointFailedError as e:
            self._fail(config, "ttft", where, str(e), len(points) - done - int(e.counted))
        except XoverError as e:  # a request outside the measured stream failed (/tokenize, /props...)
            self._fail(config, "ttft", where, str(e), len(points) - done)

    def _over_cap(self, config: LlamaConfig, point: TtftPoint, run_id: int) -> bool:
        """Whether ``point`` is skipped under the plan's ``max_ttft_s`` (stored as artifact ``ttft-skipped``)."""
        cap = self.plan.max_ttft_s
        if cap is None:
            return False
        by_length: dict[int, list[float]] = {}
        for key, L, median_s in self.plan.known:
            if key == config.key:
                by_length.setdefault(L, []).append(median_s)
        for s in self.samples:
            if s.config_key == config.key and s.counted and s.mode == "cold" and s.first_token_ns is not None:
                by_length.setdefault(s.length, []).append(s.first_token_ns / 1e9)
        # a cached turn's new tokens cost at least what a cold prompt of as many does: the cold samples decide
        medians = {L: statistics.median(v) for L, v in by_length.items()}
        est = linear_estimate(point.length, medians, inclusive=bool(point.depth))
        if est is None or est[0] <= cap:
            return False
        if point.depth:  # told, not stored as a cold point too slow to measure
            self.on_event(
                Note(
                    f"{config.label}: a cached turn of {point.length} new tokens skipped: about {est[0]:.0f} s to "
                    f"prefill (from its cold samples) > max-ttft {cap:.0f} s",
                    label=config.label,
                )
            )
            return True
        skipped = SkippedPoint(config.label, point.length, est[0], est[1], cap, config_key=config.key, rep=point.rep)
        self.store.add_artifact(run_id, TTFT_SKIPPED, skipped.to_body())
        self.on_event(skipped)
        return True

    async def _point(
        self, client: ChatClient, config: LlamaConfig, model_meta: Mapping[str, Any], point: TtftPoint, run_id: int
    ) -> None:
        plan = self.plan
        mode = point.mode if plan.mode == "cold" else plan.mode
        for attempt in range(1, plan.max_retries + 2):
            if point.chat:
                sample, check = await self._send_chat(client, config, model_meta, point)
            else:
                sample, check = await self._send(client, config, model_meta, point, mode)
            self.store.add_ttft_sample(run_id, self.rec.model_key, sample)
            self.samples.append(sample)
            self.on_event(SampleDone(label=config.label, sample=sample, attempt=attempt, check=check))
            if sample.error is not None:
                raise _PointFailedError(f"L={point.length} rep {point.rep + 1}: {sample.error}", counted=True)
            if check is None:
                return
            if attempt <= plan.max_retries:
                self.on_event(Rerun(config.label, point, check))
        self.on_event(
            Note(
                f"{config.label} L={point.length} rep {point.rep + 1}: no sample passed the {mode} "
                f"check in {plan.max_retries + 1} attempts; it is left out of the summary",
                label=config.label,
            )
        )

    async def _send(
        self, client: ChatClient, config: LlamaConfig, model_meta: Mapping[str, Any], point: TtftPoint, mode: str
    ) -> tuple[TtftSample, str | None]:
        """One request on ``/completion``: a cold prompt, a warm one (primed first) or a cached turn."""
        plan = self.plan
        prompt = await self._prompt(client, model_meta, point.length)
        if point.depth:  # the cached context, then this turn's new tokens
            prompt = await self._cached_turn(client, model_meta, point, prompt)
        elif plan.mode == "warm":
            prime = await client.stream_completion(completion_body(prompt.prompt, 1, cache_prompt=True))
            if prime.result.error is not None:
                raise _PointFailedError(
                    f"L={point.length}: priming request for the warm sample failed: {prime.result.error}", counted=False
                )
        generate = plan.response_tokens
        if point.depth and plan.cached_response_tokens is not None:
            generate = plan.cached_response_tokens
        rec = await client.stream_completion(completion_body(prompt.prompt, generate, cache_prompt=mode != "cold"))
        check = None if rec.result.error else check_cache(mode, point.length, rec.result.timings)
        return build_sample(config.key, mode, point, prompt, rec, check, plan.round), check

    async def _send_chat(
        self, client: ChatClient, config: LlamaConfig, model_meta: Mapping[str, Any], point: TtftPoint
    ) -> tuple[TtftSample, str | None]:
        """One cold request of ``point.length`` tokens as many chat messages on ``/v1/chat/completions``."""
        if self._chat_prompts is None:
            self._chat_prompts = ChatPrompts(await self._pool(client, model_meta), self.plan.seed)
        chat = await self._chat_prompts.make(next(self._index), point.length, client)
        rec = await client.stream_chat(chat_body(chat.messages, self.plan.response_tokens, cache_prompt=False))
        check = None if rec.result.error else check_cache(CHAT_MODE, point.length, rec.result.timings)
        return chat_sample(config.key, point, chat, rec, check, self.plan.round), check

    async def _cached_turn(
        self, client: LlamaClient, model_meta: Mapping[str, Any], point: TtftPoint, turn: Prompt
    ) -> Prompt:
        """A cached agentic turn's prompt: this server's context of ``point.depth`` tokens, sent once (primed) with
        ``cache_prompt`` the first time it is needed, then ``turn``'s new tokens after it. The slot then holds the
        context and the last turn: the next turn's common prefix is the context, which ``cache_n`` proves."""
        context = self._contexts.get(point.depth)
        if context is None:
            context = await self._prompt(client, model_meta, point.depth)
            prime = await client.stream_completion(completion_body(context.prompt, 1, cache_prompt=True))
            if prime.result.error is not None:
                raise _PointFailedError(
                    f"the {point.depth}-token context of the cached turns could not be primed: {prime.result.error}",
                    counted=False,
                )
            self._contexts[point.depth] = context
        assert isinstance(context.prompt, tuple) and isinstance(turn.prompt, tuple)  # token ids (the plan checks)
        return Prompt(context.prompt + turn.prompt, turn.length, f"{context.prompt_id}+{turn.prompt_id}")

    async def _prompt(self, client: LlamaClient, model_meta: Mapping[str, Any], length: int) -> Prompt:
        index = next(self._index)
        if self.plan.text:

            async def count(text: str) -> int:
                return len(await client.tokenize(text, add_special=True))

            return await self._text_prompts.make(index, length, count)
        if self._token_prompts is None:
            self._token_prompts = TokenPrompts(await self._pool(client, model_meta), self.plan.seed)
        return self._token_prompts.make(index, length)

    async def _pool(self, client: LlamaClient, model_meta: Mapping[str, Any]) -> tuple[int, ...]:
        return await ordinary_tokens(client, self.model, model_meta)


async def ordinary_tokens(client: LlamaClient, model: Path | None, model_meta: Mapping[str, Any]) -> tuple[int, ...]:
    """Ordinary token ids: from the GGUF's token types when the model file is here, else the tokens the server
    itself makes of plain words (ordinary by construction)."""
    types = await asyncio.to_thread(gguf_token_types, model) if model is not None else []
    if types:
        pool = token_pool(types)
    else:
        words = " ".join(WORDS) + " " + " ".join(w.upper() for w in WORDS)
        pool = tuple(sorted(set(await client.tokenize(words, add_special=False))))
    n_vocab = model_meta.get("n_vocab")
    if isinstance(n_vocab, int):
        pool = tuple(i for i in pool if i < n_vocab)
    if len(pool) < 2:
        raise XoverError("found fewer than 2 ordinary token ids for this model: try --text")
    return pool


async def warm_only(
    binaries: Binaries, spec: ServerLaunch, log_dir: Path, shortest: int | None, startup_timeout_s: float
) -> str | None:
    """A server of ``spec`` started, warmed as a measured one is (:func:`warmup_lengths`) and stopped, with nothing
    stored: what the first process of a build pays once on a machine (a lazy-pipeline backend's shader compilation,
    the model's pages read from disk, the driver's first context) kept out of the first round's numbers. Why it
    failed, or None."""
    bins = binaries.for_config(spec.config)
    try:
        async with LlamaServer(bins.server, spec, log_dir, startup_timeout_s=startup_timeout_s) as srv:
            assert srv.client is not None
            pool = await ordinary_tokens(srv.client, spec.model, srv.model_meta)
            prompts = TokenPrompts(pool, time.time_ns() % 2**31)
            lengths = warmup_lengths(spec.config, bins.expected_backend, spec.ctx_size, shortest)
            return await warm_up(srv.client, [prompts.make(i, n).prompt for i, n in enumerate(lengths)])
    except (XoverError, OSError) as e:  # its round starts the server again and records what is the configuration's
        return str(e)


def build_sample(
    config_key: str,
    mode: str,
    point: TtftPoint,
    prompt: Prompt,
    rec: StreamRecord,
    check: str | None,
    round: int | None = None,
) -> TtftSample:
    """The stored record of one request; ``check`` is :func:`check_cache`'s verdict (None: passed); ``round`` the
    round of fresh servers it was measured in."""
    r = rec.result
    return TtftSample(
        config_key=config_key,
        mode=mode,
        length=point.length,
        rep=point.rep,
        prompt_id=prompt.prompt_id,
        sent_at_unix_ns=rec.sent_at_unix_ns,
        first_byte_ns=r.first_byte_ns,
        first_token_ns=r.first_token_ns,
        end_ns=r.end_ns,
        token_times_ns=r.token_times_ns,
        n_tokens_received=len(r.token_times_ns),
        timings=r.timings,
        cache_ok=r.error is None and check is None,
        error=r.error,
        round=round,
    )


def chat_sample(
    config_key: str, point: TtftPoint, prompt: ChatPrompt, rec: ChatRecord, check: str | None, round: int | None = None
) -> TtftSample:
    """The stored record of one chat request (mode ``chat``): the chat stream carries no per-token clock, so its
    decode is the server's ``predicted_per_second`` and its token count the usage's."""
    r = rec.result
    stream = CompletionStream(r.first_byte_ns, r.first_token_ns, r.end_ns, (), None, r.timings, r.error)
    as_completion = StreamRecord(rec.sent_at_unix_ns, rec.t0_ns, rec.status, rec.chunks, stream)
    sample = build_sample(config_key, CHAT_MODE, point, prompt, as_completion, check, round)
    return dataclasses.replace(sample, n_tokens_received=r.completion_tokens or 0)


# ---- `xover ttft`: from its options to its summaries ----------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TtftRequest:
    """What ``xover ttft`` was asked: the plan, and either the servers to start (``model``, one per combination
    of the swept values and ``env`` values, with ``server_args`` after ``--``) or the one running at ``url``."""

    plan: TtftPlan
    study_dir: Path
    model: Path | None = None
    sweeps: tuple[tuple[LlamaOption, tuple[str, ...]], ...] = ()
    env: tuple[tuple[str, tuple[str, ...]], ...] = ()
    server_args: tuple[str, ...] = ()
    url: str | None = None
    api_key: str | None = None  # sent only to ``url``
    llama_bin_dir: Path | None = None
    startup_timeout_s: float = 600.0
    vram_budget: int | None = None  # bytes of GPU memory left to llama.cpp (xover.hardware.vram)


@dataclasses.dataclass(frozen=True)
class TtftStarted:
    """Sent once the request is checked, before the first server starts: the requests planned, the VRAM budget
    held (in words; None without one) and the placement planner's expectations under it, one line each."""

    total: int
    hold: str | None = None
    expected: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class TtftResult:
    """A ``xover ttft`` run: its outcome, the summaries of its samples, and what is worth saying about them."""

    outcome: RunOutcome
    summaries: tuple[PointSummary, ...]
    warnings: tuple[str, ...]  # one line each, point by point in the summaries' order
    memory: tuple[tuple[str, str], ...]  # (label, its server's peak memory in words), per configuration
    store_path: Path


def _checked_servers(request: TtftRequest) -> tuple[list[ServerLaunch], Binaries | None, tuple[int, ...]]:
    """``request`` checked against the model, its context and the binaries before anything starts: the servers to
    start (none with ``url``), the binaries and the ``--n-cpu-moe`` levels swept."""
    model, plan = request.model, request.plan
    if request.vram_budget is not None and request.url is not None:
        raise XoverError("--vram-budget does not apply with --url: start that server under the budget yourself")
    if request.url is not None:
        given = [o.cli[-1] for o, _ in request.sweeps] + [
            name
            for name, v in (
                ("--env", request.env),
                ("--llama-bin-dir", request.llama_bin_dir),
                ("llama-server args", request.server_args),
            )
            if v
        ]
        if given:
            raise XoverError(f"{given[0]} does not apply with --url: that server's flags are already set; drop it")
        if model is not None and not model.is_file():
            raise XoverError(f"model {model} does not exist: fix -m or leave it out with --url")
        return [], None, ()
    if model is None:
        raise XoverError("no model: pass -m MODEL.gguf (or --url URL to measure a running server)")
    if not model.is_file():
        raise XoverError(f"model {model} does not exist: fix -m")

    levels = tuple(int(v) for o, values in request.sweeps if o.name == "n-cpu-moe" for v in values)
    check_offload_and_context(model, levels, lengths=plan.lengths, extra_tokens=plan.response_tokens)
    check_explicit_context(request.server_args, max(plan.lengths) + plan.response_tokens)
    binaries = resolve(request.llama_bin_dir)
    servers = launches(
        model,
        request.sweeps,
        request.env,
        request.server_args,
        plan,
        has_flag(binaries.server, "-fit"),
        buffer_log_verbosity(binaries.server),
    )
    return servers, binaries, levels


def ttft_warnings(summaries: Sequence[PointSummary], outcome: RunOutcome) -> list[str]:
    """What is worth a warning about each point: a large client-server gap (:func:`gap_note`), first tokens that
    arrived together, repetitions that did not pass the cache check."""
    out = []
    for p in summaries:
        label = outcome.labels.get(p.config_key, p.config_key)
        note = gap_note(p, label, outcome.cold_cache.get(p.config_key), outcome.slots.get(p.config_key))
        if note:
            out.append(note)
        if p.n_first_two_together:
            out.append(
                f"{label} L={p.length}: in {p.n_first_two_together} of {p.n_ok} samples the first two tokens arrived "
                "together (the server held the first one back inside a UTF-8 character, or the client read late): "
                "their TTFT includes a decode step"
            )
        if p.n_ok < p.n_reps:
            errored = f" ({p.n_errors} failed with an error)" if p.n_errors else ""
            out.append(
                f"{label} L={p.length}: only {p.n_ok} of {p.n_reps} repetitions passed the {p.mode} check{errored}"
            )
    return out


def run_ttft(
    request: TtftRequest,
    *,
    command: Sequence[str] = (),
    on_event: Callable[[TtftEvent | TtftStarted], None] = lambda ev: None,
) -> TtftResult:
    """``xover ttft``: check the request (before any server starts or any store is written), hold the VRAM budget,
    then measure every configuration's servers (or the server at ``url``) into ``study_dir``'s store.
    ``on_event`` gets :class:`TtftStarted` first, then :data:`xover.measure.events.TtftEvent`."""

    servers, binaries, levels = _checked_servers(request)
    plan, model = request.plan, request.model
    total = len(expand(plan)) * (len(servers) if request.url is None else 1)
    with holding(request.vram_budget) as hold, Store(request.study_dir) as store:
        expected: list[str] = []
        if hold is not None and model is not None:
            ctx = context_size(max(plan.lengths), plan.response_tokens)  # the -c every server gets
            expected = planner_notes(model, levels or (0,), ctx, request.vram_budget or 0)
        on_event(TtftStarted(total, hold.describe() if hold is not None else None, tuple(expected)))
        run = TtftRun(store, plan, list(command), binaries=binaries, model=model, on_event=on_event)
        if request.url is not None:
            outcome = asyncio.run(
                run.run_url(request.url, api_key=request.api_key, startup_timeout_s=request.startup_timeout_s)
            )
        else:
            outcome = asyncio.run(
                run.run_managed(servers, request.study_dir / "logs", startup_timeout_s=request.startup_timeout_s)
            )
        peaks = memory_by_config(store, source="llama-server")
        store_path = store.path
    summaries = summarize_points(outcome.samples)
    memory_lines = tuple((label, describe_memory(peaks[key])) for key, label in outcome.labels.items() if key in peaks)
    return TtftResult(outcome, tuple(summaries), tuple(ttft_warnings(summaries, outcome)), memory_lines, store_path)
