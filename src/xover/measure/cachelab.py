"""Prompt-cache lab, run: each scenario of :mod:`xover.analysis.cachelab`'s plan on a freshly started
llama-server, every response stored as a TTFT sample and checked against the plan (see that module).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import itertools
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from xover.analysis.cachelab import (  # noqa: F401 (the plan and analysis, re-exported)
    APPENDED,
    CACHE_RAM_DEFAULT_BYTES,
    CASES,
    INSERTED,
    MIN_LENGTH,
    MODE_PREFIX,
    OPENING,
    OTHERS,
    PREFIX,
    RESPONSE_TOKENS,
    REUSE_MIN,
    SHORT,
    STATE_ARTIFACT,
    EraseSlots,
    LabAnalysis,
    LabRequest,
    LabRow,
    LabServer,
    _cold,
    _groups,
    _headlines,
    _median_gap_ms,
    _ms,
    _verdict,
    analyse,
    build_prompts,
    complete_scenarios,
    declared_state,
    host_cache_note,
    lab_mode,
    lab_plan,
    lab_samples,
    parse_mode,
    plan_requests,
)
from xover.client.http import LlamaClient, completion_body
from xover.domain.config import LlamaConfig, command_configs
from xover.domain.llama_options import LlamaOption
from xover.domain.prompts import Prompt, TokenPrompts, token_pool
from xover.domain.records import Failure, TtftSample
from xover.domain.shapes import kv_bytes_per_token
from xover.errors import XoverError
from xover.gguf.inspect import check_offload_and_context, model_table
from xover.llamacpp.binaries import Binaries, resolve
from xover.llamacpp.server import ServerLaunch, check_explicit_context, context_size, has_flag
from xover.measure.events import LabEvent, LabRequestDone, ServerUp
from xover.measure.recorder import Recording
from xover.measure.server_session import started_server, warm_up, warmup_lengths
from xover.measure.ttft import TtftPoint, build_sample, gguf_token_types
from xover.results.store import Store


def state_bytes_per_token(model: Path, config: LlamaConfig | None = None) -> int | None:
    """KV cache bytes per token of ``model`` with ``config``'s cache types (``-ctk``/``-ctv``, F16 by default):
    the size of a prompt's saved state per token. None where it cannot be told."""

    types = {"k": "F16", "v": "F16"}
    if config is not None:
        types = {"k": (config.get("cache-type-k") or "F16").upper(), "v": (config.get("cache-type-v") or "F16").upper()}
    if types["k"] != types["v"]:
        return None
    try:
        hp = model_table(model)[0].hparams
        return kv_bytes_per_token(hp, types["k"])
    except (XoverError, KeyError, ValueError):
        return None


# ---- run ----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CacheLabOutcome:
    run_id: int
    label: str
    samples: tuple[TtftSample, ...]
    failures: tuple[Failure, ...]
    analysis: LabAnalysis


class _ScenarioFailedError(Exception):
    def __init__(self, message: str, skipped: int) -> None:
        super().__init__(message)
        self.skipped = skipped


def lab_context(length: int) -> int:
    """The ``-c`` the lab's servers get for prompts of ``length`` tokens: the longest request (a chunk inserted)
    plus its response."""
    return context_size(length + INSERTED, RESPONSE_TOKENS)


def run_cache_lab(
    store_dir: Path,
    binaries: Binaries,
    model: Path,
    length: int,
    config: LlamaConfig,
    *,
    command: Sequence[str] = (),
    seed: int = 0,
    startup_timeout_s: float = 600.0,
    on_event: Callable[[LabEvent], None] = lambda ev: None,
    only: Collection[str] | None = None,
) -> CacheLabOutcome:
    """Run every scenario of the lab (synchronous; it drives its own event loop) into the store
    of ``store_dir``: one run of kind ``cache``, one sample per request, failures kept as data.

    ``config`` is the configuration the lab's servers run (its llama-server arguments follow the lab's own,
    its environment is set for the servers only). A scenario whose server fails to
    start or whose request fails is recorded as a failure and the next scenario runs. ``only`` names
    the scenarios to run (a resumed study runs those :func:`complete_scenarios` does not list).
    """
    if not model.is_file():
        raise XoverError(f"model {model} does not exist: fix -m")
    bpt = state_bytes_per_token(model, config)
    label = config.name
    plan = tuple(srv for srv in lab_plan(length, bpt) if only is None or srv.scenario in only)
    pool = token_pool(gguf_token_types(model))
    if len(pool) < 2:
        raise XoverError(
            f"{model} lists fewer than 2 ordinary tokens (tokenizer.ggml.token_type): use a model with a vocabulary"
        )
    lab = _LabRun(
        Store(store_dir),
        binaries,
        model,
        config,
        list(command),
        on_event,
        TokenPrompts(pool, seed),
        length,
        {label: bpt} if bpt is not None else {},
        startup_timeout_s,
    )
    if bpt is not None:
        lab.store.add_artifact(None, STATE_ARTIFACT, {"label": label, "length": length, "state_bytes_per_token": bpt})
    try:
        return asyncio.run(lab.run(plan, store_dir))
    finally:
        lab.store.close()


class _LabRun:
    def __init__(
        self,
        store: Store,
        binaries: Binaries,
        model: Path,
        config: LlamaConfig,
        command: list[str],
        on_event: Callable[[LabEvent], None],
        prompts: TokenPrompts,
        length: int,
        state_bytes: dict[str, int],
        startup_timeout_s: float,
    ) -> None:
        self.store, self.binaries, self.model, self.config, self.label = store, binaries, model, config, config.name
        self.on_event, self.prompts = on_event, prompts
        self.rec = Recording(store, "cache", command, binaries=binaries, model=model, on_event=on_event)
        self.ctx = lab_context(length)
        self.samples: list[TtftSample] = []
        self.done = 0
        self.total = 0
        self._index = itertools.count()
        self.state_bytes = state_bytes  # label -> prompt state bytes per token, for the analysis
        self.startup_timeout_s = startup_timeout_s

    async def run(self, plan: Sequence[LabServer], store_dir: Path) -> CacheLabOutcome:
        self.total = sum(len(srv.requests()) for srv in plan)
        fit_off = has_flag(self.binaries.server, "-fit")
        with self.rec:  # ends the run: interrupted, failed or done (xover.measure.recorder)
            for srv in plan:
                await self._scenario(srv, self._spec(srv, store_dir, fit_off), store_dir / "logs")
        assert self.rec.run_id is not None
        samples = tuple(self.samples)
        return CacheLabOutcome(
            self.rec.run_id,
            self.label,
            samples,
            tuple(self.rec.failures),
            analyse([(self.label, s) for s in samples], self.state_bytes),
        )

    def _spec(self, srv: LabServer, store_dir: Path, fit_off: bool) -> ServerLaunch:
        lab_args: list[str] = []
        if srv.cache_reuse is not None:
            lab_args += ["--cache-reuse", str(srv.cache_reuse)]
        if srv.slot_save:
            slots = store_dir / "cache-lab-slots"
            slots.mkdir(parents=True, exist_ok=True)
            lab_args += ["--slot-save-path", str(slots.resolve())]
        return ServerLaunch(
            self.config,
            self.model.resolve(),
            self.ctx,
            cold_cache=not srv.defaults,
            fit_off=fit_off,
            own_args=tuple(lab_args),
        )

    def _fail(self, srv: LabServer, spec: ServerLaunch, stage: str, reason: str, skipped: int) -> None:
        config = spec.config
        self.done += skipped
        self.rec.fail(
            config,
            Failure(config_key=config.key, stage=stage, point=f"cache lab {srv.scenario}", reason=reason),
            skipped=skipped,
            scenario=srv.scenario,
        )

    async def _scenario(self, srv: LabServer, spec: ServerLaunch, log_dir: Path) -> None:
        try:
            async with started_server(
                self.rec, self.binaries, spec, log_dir, startup_timeout_s=self.startup_timeout_s, scenario=srv.scenario
            ) as s:
                assert s.client is not None
                config = spec.config
                run_id = self.rec.ensure(build=config.build)
                self.on_event(
                    ServerUp(
                        label=config.label,
                        url=s.url,
                        log_path=s.log_path,
                        build_info=str(s.props.get("build_info") or "") or None,
                        scenario=srv.scenario,
                        settings=srv.settings,
                        pid=s.pid,
                    )
                )
                await self._steps(s.client, srv, config.key, run_id, s.props)
        except _ScenarioFailedError as e:
            self._fail(srv, spec, "cache", str(e), e.skipped)
        except XoverError as e:
            self._fail(srv, spec, "server-start", str(e), len(srv.requests()))

    async def _steps(
        self, client: LlamaClient, srv: LabServer, config_key: str, run_id: int, props: Mapping[str, Any]
    ) -> None:
        """Send every step; a failed request (or erase) raises _ScenarioFailedError with the requests left."""
        prompts = build_prompts(srv, self.prompts, lambda: next(self._index))
        backend = self.binaries.for_config(self.config).expected_backend
        warmup = warmup_lengths(self.config, backend, self.ctx, None)  # a whole lab prompt more would cost minutes
        failed = await warm_up(client, [self.prompts.make(next(self._index), n).prompt for n in warmup])
        remaining = len(srv.requests())
        if failed is not None:
            raise _ScenarioFailedError(f"{srv.scenario}: {failed}", remaining)
        for step in srv.steps:
            if isinstance(step, EraseSlots):
                n_slots = props.get("total_slots")
                try:
                    for slot in range(n_slots if isinstance(n_slots, int) and n_slots > 0 else 1):
                        await client.post_json(f"/slots/{slot}?action=erase", {})
                except XoverError as e:
                    raise _ScenarioFailedError(f"{srv.scenario}: erasing the slots failed: {e}", remaining) from None
                continue
            ids = prompts[step]
            extra = {"n_cache_reuse": step.n_cache_reuse} if step.n_cache_reuse is not None else None
            rec = await client.stream_completion(completion_body(ids, RESPONSE_TOKENS, cache_prompt=True, extra=extra))
            t = rec.result.timings
            ok = rec.result.error is None and t is not None and (t.cache_n, t.prompt_n) == step.expect
            check = None if ok else "not as predicted"
            prompt = Prompt(ids, step.length, f"lab:s{self.prompts.seed}:{step.case}:{step.request}:{_hash(ids)}")
            sample = build_sample(config_key, step.mode, TtftPoint(step.length, 0), prompt, rec, check)
            self.store.add_ttft_sample(run_id, self.rec.model_key, sample)
            self.samples.append(sample)
            remaining -= 1
            self.done += 1
            self.on_event(LabRequestDone(srv.scenario, sample, ok, self.done, self.total))
            if rec.result.error is not None:
                raise _ScenarioFailedError(f"{srv.scenario} {step.request}: {rec.result.error}", remaining)


def _hash(ids: Sequence[int]) -> str:
    return hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()[:12]


# ---- `xover cache`: from its options to the lab's analysis ------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CacheLabRequest:
    """What ``xover cache`` was asked: the model and prompt length, the one configuration (the table's options,
    one value each, with ``server_args`` after ``--``) and the study to store the samples in."""

    model: Path | None
    length: int
    study_dir: Path
    sweeps: tuple[tuple[LlamaOption, tuple[str, ...]], ...] = ()
    server_args: tuple[str, ...] = ()
    llama_bin_dir: Path | None = None
    startup_timeout_s: float = 600.0


@dataclasses.dataclass(frozen=True)
class LabStarted:
    """Sent once the request is checked, before the first scenario's server starts."""

    total: int  # requests planned


def run_lab(
    request: CacheLabRequest,
    *,
    command: Sequence[str] = (),
    on_event: Callable[[LabEvent | LabStarted], None] = lambda ev: None,
) -> CacheLabOutcome:
    """``xover cache``: the request checked against the lab's plan, the model, its context and the binaries
    (before any server starts), then :func:`run_cache_lab`. ``on_event`` gets :class:`LabStarted` first."""

    model, tokens = request.model, request.length
    if model is None:
        raise XoverError("no model: pass -m MODEL.gguf")
    if not model.is_file():
        raise XoverError(f"model {model} does not exist: fix -m")
    planned = sum(len(srv.requests()) for srv in lab_plan(tokens))  # a length the lab cannot use fails here
    several = next((o.cli[-1] for o, values in request.sweeps if len(values) > 1), None)
    if several:
        raise XoverError(f"{several}: the cache lab runs one configuration; give one value")
    (config,) = command_configs(request.sweeps, (), request.server_args)
    need = tokens + INSERTED + RESPONSE_TOKENS
    check_offload_and_context(model, [config.n_cpu_moe] if config.get("n-cpu-moe") else [], need)
    check_explicit_context(request.server_args, need)
    binaries = resolve(request.llama_bin_dir)
    on_event(LabStarted(planned))
    return run_cache_lab(
        request.study_dir,
        binaries,
        model,
        tokens,
        config,
        command=command,
        startup_timeout_s=request.startup_timeout_s,
        on_event=on_event,
    )
