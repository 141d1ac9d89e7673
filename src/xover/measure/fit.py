"""``n-cpu-moe = "fit"`` configurations: the placement planner's level, and llama.cpp's word on it.

A spec may name a configuration by what it must hold instead of a number: ``"fit"`` is the smallest
``--n-cpu-moe`` whose GPU buffers hold the study's longest prompt and response, ``"fit@8k"`` the smallest
that holds an 8K context, under the study's VRAM budget (``[study] vram-budget``; without one, the GPU's
free memory). ``fit@8k`` against ``fit@32k`` is the seed's pair: the minimum offload for short turns
against the offload a long context forces.

:func:`resolve_fits` replaces each ``fit`` by the planner's number (:func:`xover.analysis.theory.plan_placement`,
the same buffer arithmetic as llama.cpp's load log, plus the measured headroom) before anything is measured,
and stores what it chose as artifact ``fit``. :func:`check_fits` then asks llama.cpp itself: it starts
llama-server at the chosen level and one below it, with the same context, and sends each one request as long
as a ubatch (loading is not enough: on an H200 under a 16 GiB budget a level that loaded crashed at its first
request, allocating the cuBLAS workspace). Both answers are stored as artifact ``fit-check``.

A tuned variant is placed by its server instead (:func:`place_by_server`, artifact ``fit-check-tuned``): the
tuning trials run in llama-bench, whose placement (:func:`refit_variants`) reserves a whole ubatch of logits that
llama-server never allocates, so the variant's level is the lowest at which its own llama-server loads and serves,
found by bisection with real loads, not llama-bench's.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from xover.analysis.theory import DEFAULT_HEADROOM_BYTES, compute_per_token, lowest_serving, plan_placement
from xover.analysis.theory import model_terms as terms_of
from xover.client.http import completion_body
from xover.domain import llama_options as opts
from xover.domain.config import LlamaConfig
from xover.domain.option_values import FIT
from xover.domain.study_spec import StudySpec
from xover.errors import XoverError
from xover.gguf.inspect import model_table
from xover.hardware.detect import detect_gpu
from xover.llamacpp.binaries import Binaries
from xover.llamacpp.fitparams import FitChoice, run_fit_params
from xover.llamacpp.memory import buffer_lines_in, is_local_accelerator, parse_buffer_lines
from xover.llamacpp.server import LlamaServer, ServerLaunch, buffer_log_verbosity, context_size, device_problem
from xover.measure.tune import base_name

GIB = 1 << 30


def budget_for_fit(spec: StudySpec) -> int:
    """The VRAM a ``fit`` level must fit: the study's budget, else the GPU's free memory."""
    if spec.vram_budget is not None:
        return spec.vram_budget

    gpu = detect_gpu()
    if gpu is None or not gpu.free_bytes:
        raise XoverError(
            "n-cpu-moe = 'fit' needs a VRAM budget ([study] vram-budget = '16GiB') or a GPU whose free "
            "memory nvidia-smi reports"
        )
    return gpu.free_bytes


def has_fits(spec: StudySpec) -> bool:
    return any(c.fit_request is not None for c in spec.configs)


def resolve_fits(spec: StudySpec, terms: Any) -> tuple[StudySpec, list[dict[str, Any]]]:
    """``spec`` with every ``fit`` level replaced by the planner's number for the model's ``terms``
    (:func:`model_terms`), and one record per replacement."""
    if not has_fits(spec):
        return spec, []

    budget = budget_for_fit(spec)
    study_ctx = context_size(max(spec.lengths), max(spec.response_tokens))
    configs, records = [], []
    for c in spec.configs:
        want = c.fit_request
        if want is None:
            configs.append(c)
            continue
        ctx = study_ctx if want is True else context_size(int(want), max(spec.response_tokens))
        plan = _plan(terms, budget, ctx, c)
        if plan.n_cpu_moe is None:
            raise XoverError(
                f"{c.name}: the model does not fit {budget / GIB:.1f} GiB at {ctx:,} tokens of context "
                "even with every expert on the CPU: raise vram-budget or shorten the context"
            )
        n = plan.n_cpu_moe
        placed = with_level(c, n)
        configs.append(placed if want is True else dataclasses.replace(placed, max_context=ctx))
        records.append(
            {
                "config": c.name,
                "request": c.get("n-cpu-moe"),
                "n_ctx": ctx,
                "n_cpu_moe": n,
                "budget_bytes": budget,
                **_placement_fields(plan, c),
            }
        )
    return dataclasses.replace(spec, configs=tuple(configs)), records


def with_level(config: LlamaConfig, n: int) -> LlamaConfig:
    """``config`` with ``--n-cpu-moe n``."""
    return config.with_values({"n-cpu-moe": str(n)})


def _plan(
    terms: Any, budget: int, ctx: int, config: LlamaConfig, compute_per_token: float | None = None, server: bool = False
) -> Any:
    """The planner's placement of ``config`` (its own ubatch, attention and KV cache types) at ``ctx`` under
    ``budget``; ``compute_per_token``: the compute buffer's per-token bytes calibrated from a logged load
    (:func:`calibration`), else the planner's estimate. ``server``: llama-server's least, one row of logits and no
    headroom (the lower end of :func:`place_by_server`'s range), instead of llama-bench's ubatch of logits plus
    the headroom."""

    (plan,) = plan_placement(
        terms.with_cache_types(*cache_types(config)),
        budget,
        (ctx,),
        _ubatch(config),
        flash_attn=_flash_attn(config),
        compute_per_token=compute_per_token,
        headroom_bytes=0 if server else DEFAULT_HEADROOM_BYTES,
        n_outputs=1 if server else None,
    )
    return plan


def calibration(terms: Any, record: dict[str, Any]) -> float | None:
    """The compute buffer's bytes per ubatch token that llama.cpp logged when the fit check loaded ``record``'s
    configuration (the check at the level it is measured at, else any that loaded), the KQ mask taken out: what
    a trial with another ubatch is planned with (:func:`xover.analysis.theory.compute_per_token`). None before
    the check, or when no compute buffer was logged."""

    checks = [c for c in record.get("checks") or () if c.get("compute_bytes")]
    if not checks:
        return None
    at = int(record.get("measured_at", record["n_cpu_moe"]))
    chosen = next((c for c in checks if int(c["n_cpu_moe"]) == at), checks[0])
    fa = record.get("flash_attn", True)
    return compute_per_token(terms, int(chosen["compute_bytes"]), int(record["ubatch"]), int(record["n_ctx"]), fa)


def cache_types(config: LlamaConfig) -> tuple[str, str]:
    """The KV cache's (K, V) ggml types a configuration runs with (``-ctk``/``-ctv``; llama.cpp's f16 default)."""
    k = config.get(opts.CACHE_TYPE_K.name) or opts.CACHE_TYPE_K.default
    v = config.get(opts.CACHE_TYPE_V.name) or opts.CACHE_TYPE_V.default
    return k.upper(), v.upper()


def _placement_fields(plan: Any, config: LlamaConfig) -> dict[str, Any]:
    """What a fit record keeps of a plan: the headroom, the ubatch it was planned for and the GPU buffers."""
    e = plan.estimate
    return {
        "headroom_bytes": plan.headroom_bytes,
        "ubatch": _ubatch(config),
        "cache_types": list(cache_types(config)),
        "flash_attn": _flash_attn(config),
        "estimate": {
            "model_bytes": e.model_bytes,
            "kv_bytes": e.kv_bytes,
            "compute_bytes": e.compute_bytes,
            "total_bytes": e.total_bytes,
        },
    }


def _planned_level(terms: Any, record: dict[str, Any], config: LlamaConfig) -> tuple[int, Any]:
    """The smallest level that holds ``record``'s context under its budget with ``config``'s own ubatch, attention
    and KV cache types, plus the levels llama.cpp's check added above the planner's for the base configuration
    (``config``'s level over the record's), and the plan. A larger ubatch can raise the level, a smaller cache
    lower it."""
    plan = _plan(terms, int(record["budget_bytes"]), int(record["n_ctx"]), config, calibration(terms, record))
    n = plan.n_cpu_moe if plan.n_cpu_moe is not None else terms.n_layer
    correction = max(0, _level(config) - int(record["n_cpu_moe"]))
    return min(terms.n_layer, n + correction), plan


def _ubatch(config: LlamaConfig) -> int:
    return int(config.get("ubatch-size") or 512)


def _flash_attn(config: LlamaConfig) -> bool:
    """Whether it runs with flash attention (llama.cpp's auto enables it where the backend has it)."""
    return config.get("flash-attn") != "off"


def _level(config: LlamaConfig) -> int:
    """A placed configuration's level (a ``fit`` not yet placed counts as 0)."""
    return 0 if config.fit_request is not None else config.n_cpu_moe


def model_terms(model: Path) -> Any:
    """The placement planner's view of a model file (:func:`xover.analysis.theory.model_terms` of its header)."""

    return terms_of(model_table(str(model))[0])


def placer(terms: Any, records: list[dict[str, Any]]) -> Callable[[LlamaConfig, str], LlamaConfig] | None:
    """For the tuning stage under a budget: a trial setting of a ``fit`` configuration placed for its own ubatch and
    KV cache types (``place(trial, base name)``), so the search weighs a larger ubatch together with the experts it
    pushes to the CPU, and a smaller cache with the experts it brings back, as a user of that card must. A setting
    that cannot be placed at all raises a one-line error (the search records it as failed). None without fit
    configurations."""
    if not records:
        return None
    by_base = {r["config"]: r for r in records}

    def place(config: LlamaConfig, base: str) -> LlamaConfig:
        r = by_base.get(base)
        if r is None:
            return config
        n, plan = _planned_level(terms, r, config)
        if plan.n_cpu_moe is None:
            raise XoverError(
                f"could not place under the budget: {plan.estimate.total_bytes / GIB:.2f} GiB of GPU buffers with "
                f"every expert on the CPU, plus {plan.headroom_bytes / GIB:.1f} GiB headroom, exceed "
                f"{plan.budget_bytes / GIB:.1f} GiB at {int(r['n_ctx']):,} tokens of context"
            )
        return with_level(config, n)

    return place


def refit_variants(
    spec: StudySpec, terms: Any, records: list[dict[str, Any]], variants: tuple[LlamaConfig, ...]
) -> tuple[tuple[LlamaConfig, ...], list[dict[str, Any]]]:
    """Tuned variants of ``fit`` configurations planned again for their own settings: a larger ubatch needs a
    larger compute buffer, which under a budget can push more experts to the CPU. One record per variant of a
    fit configuration (the same shape as :func:`resolve_fits`' records)."""

    by_base = {r["config"]: r for r in records}
    if not any(base_name(v.name) in by_base for v in variants):
        return variants, []
    out, refits = [], []
    for v in variants:
        r = by_base.get(base_name(v.name))
        if r is None:
            out.append(v)
            continue
        n, plan = _planned_level(terms, r, v)
        out.append(with_level(v, n))
        refits.append({**r, "config": v.name, "n_cpu_moe": n, **_placement_fields(plan, v)})
    return tuple(out), refits


def apply_checks(configs: tuple[LlamaConfig, ...], checks: list[dict[str, Any]]) -> tuple[LlamaConfig, ...]:
    """Each checked configuration at the level it is measured at: the planner's, unless llama.cpp refused it
    and a level above served (``measured_at``)."""
    level = {c["config"]: int(c.get("measured_at", c["n_cpu_moe"])) for c in checks}
    return tuple(with_level(c, level[c.name]) if c.name in level else c for c in configs)


def describe(record: dict[str, Any]) -> str:
    e = record["estimate"]
    return (
        f"{record['config']}: --n-cpu-moe {record['n_cpu_moe']} (planner: {e['total_bytes'] / GIB:.2f} GiB of GPU "
        f"buffers at {record['n_ctx']:,} tokens of context, plus {record['headroom_bytes'] / GIB:.1f} GiB headroom, "
        f"within {record['budget_bytes'] / GIB:.1f} GiB)"
    )


@dataclasses.dataclass(frozen=True)
class LevelCheck:
    """llama.cpp's answer for one level: did the server load, and did it serve one ubatch-long request?"""

    n_cpu_moe: int
    loaded: bool
    served: bool
    reason: str | None  # why not, from the server's log or the request's error
    compute_bytes: int | None = None  # the accelerator's compute buffer llama.cpp logged at load (None: none logged)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


async def _check_level(
    binaries: Binaries, model: Path, config: LlamaConfig, n: int, ctx: int, log_dir: Path, timeout_s: float | None
) -> LevelCheck:

    at = config.with_values({"n-cpu-moe": str(n)}, name=f"{config.name} at {n}")
    kwargs = {} if timeout_s is None else {"startup_timeout_s": timeout_s}
    try:
        bins = binaries.for_config(config)
        server = bins.server
        # the load log's buffer sizes (-lv 4) calibrate the planner's compute buffer for the tuning trials
        sspec = ServerLaunch(
            at, model, ctx, label=f"fitcheck-{config.name}-{n}", log_verbosity=buffer_log_verbosity(server)
        )
        async with LlamaServer(server, sspec, log_dir, **kwargs) as srv:
            # a GPU build that found no device "fits" every level on the CPU: not a fit
            problem, _ = device_problem(srv.log_path, bins.expected_backend)
            if problem is not None:
                return LevelCheck(n, True, False, problem)
            # one whole ubatch (the first request's allocations grow with it), in ordinary ids of any vocabulary
            prompt = tuple(100 + (i % 150) for i in range(min(_ubatch(at), ctx // 2)))
            assert srv.client is not None  # set once the server is up
            rec = await srv.client.stream_completion(completion_body(prompt, 4, cache_prompt=False))
            compute = logged_compute_bytes(srv.log_path)
            if rec.result.error is not None:
                return LevelCheck(n, True, False, str(rec.result.error), compute)
            return LevelCheck(n, True, True, None, compute)
    except XoverError as e:
        return LevelCheck(n, False, False, str(e))


def logged_compute_bytes(log: Path | None) -> int | None:
    """The largest accelerator compute buffer a llama.cpp log reports (``CUDA0 compute buffer size``), or None."""

    if log is None:
        return None
    found = [
        b
        for dev, kind, b in parse_buffer_lines(buffer_lines_in(log))
        if kind == "compute" and is_local_accelerator(dev)
    ]
    return max(found) if found else None


def check_fits(
    spec: StudySpec,
    configs: tuple[LlamaConfig, ...],
    model: Path,
    binaries: Binaries,
    records: list[dict[str, Any]],
    log_dir: Path,
    note: Callable[[str], None],
) -> list[dict[str, Any]]:
    """For each resolved ``fit``: llama.cpp at the planner's level and one level below it, and what llama.cpp's
    own ``--fit`` would choose at the same context (``llama-fit-params``). When the planner's level does not
    serve, the levels above it are tried (at most :data:`MAX_CORRECTION`) and the configuration is measured at
    the first that serves (``measured_at``): llama.cpp's word wins over the planner's, and the report says so."""
    out = []
    by_name = {c.name: c for c in configs}
    for r in records:
        config, n, ctx = by_name[r["config"]], int(r["n_cpu_moe"]), int(r["n_ctx"])
        levels = [m for m in (n, n - 1) if m >= 0]
        checks = [asyncio.run(_check_level(binaries, model, config, m, ctx, log_dir, spec.timeout_s)) for m in levels]
        measured_at = n
        if not checks[0].served:
            for m in range(n + 1, n + 1 + MAX_CORRECTION):
                checks.append(asyncio.run(_check_level(binaries, model, config, m, ctx, log_dir, spec.timeout_s)))
                if checks[-1].served:
                    measured_at = m
                    break
        entry: dict[str, Any] = {**r, "checks": [c.as_dict() for c in checks], "measured_at": measured_at}
        entry = _with_llama_fit(entry, binaries, model, ctx, config)
        out.append(entry)
        note(check_line(entry))
    return out


MAX_CORRECTION = 4  # levels above the planner's tried when llama.cpp refuses the planner's


def _with_llama_fit(
    entry: dict[str, Any], binaries: Binaries, model: Path, ctx: int, config: LlamaConfig
) -> dict[str, Any]:
    """``entry`` with what llama.cpp's own ``--fit`` (llama-fit-params) would choose at the same context, where the
    build has it (``llama_fit``: its choice or None, ``llama_fit_log``: why)."""

    if binaries.fit_params is not None:
        choice, why = run_fit_params(binaries.fit_params, model, ctx, config)
        entry = {**entry, "llama_fit": choice.to_dict() if choice is not None else None, "llama_fit_log": why}
    return entry


PLACED_BY_SERVER = "server"  # a fit record's ``placed_by`` where llama-server's own loads chose the level


def place_by_server(
    spec: StudySpec,
    configs: tuple[LlamaConfig, ...],
    model: Path,
    binaries: Binaries,
    records: list[dict[str, Any]],
    terms: Any,
    log_dir: Path,
    note: Callable[[str], None],
) -> list[dict[str, Any]]:
    """Each tuned variant of a ``fit`` configuration at the lowest level its own llama-server serves: real loads at
    the variant's settings and the configuration's context, each proven by one request that fills its ubatch,
    under the study's budget (held by :mod:`xover.hardware.vram`), bisected between the planner's least level for
    a server (one row of logits, no headroom) and the level llama-bench's placement needs (a whole ubatch of
    logits plus the headroom: :func:`refit_variants`' record), which is tried first
    (:func:`xover.analysis.theory.lowest_serving`). llama-bench reserves a ubatch of logits that llama-server never
    does (2,732 MiB against 962 MiB at ``-ub 4096`` for qwen3-30b-a3b), so its level wastes GPU memory that the
    server would spend on experts, and decode with them. Every level asked is stored with what it did, and the
    record says ``placed_by = "server"``, with ``bench_level`` and ``server_plan`` beside the level it is measured
    at (``measured_at``)."""

    out = []
    by_name = {c.name: c for c in configs}
    for r in records:
        config, high, ctx = by_name[r["config"]], int(r["n_cpu_moe"]), int(r["n_ctx"])
        plan = _plan(terms, int(r["budget_bytes"]), ctx, config, calibration(terms, r), server=True)
        low = plan.n_cpu_moe if plan.n_cpu_moe is not None else terms.n_layer
        asked: dict[int, LevelCheck] = {}

        def serves(
            level: int, config: LlamaConfig = config, ctx: int = ctx, asked: dict[int, LevelCheck] = asked
        ) -> bool:
            asked[level] = asyncio.run(_check_level(binaries, model, config, level, ctx, log_dir, spec.timeout_s))
            return asked[level].served

        level, order = lowest_serving(serves, low, high, terms.n_layer, MAX_CORRECTION)
        entry: dict[str, Any] = {
            **r,
            "checks": [asked[m].as_dict() for m in order],
            "measured_at": high if level is None else level,
            "placed_by": PLACED_BY_SERVER,
            "bench_level": high,
            "server_plan": low,
        }
        entry = _with_llama_fit(entry, binaries, model, ctx, config)
        out.append(entry)
        note(check_line(entry))
    return out


def not_benched(records: Any) -> dict[str, str]:
    """Variant -> why the bench stage leaves it out: placed by its server below the level llama-bench's own
    placement needs (``records``: FitRecords), where a llama-bench process would
    not fit the budget (its ubatch of logits). Such a variant is measured through llama-server alone (cold TTFT,
    cached turns and their decode), at the level it will run at, never at llama-bench's."""
    return {
        r.config: (
            f"placed by llama-server at --n-cpu-moe {r.level}, below the {r.bench_level} llama-bench's ubatch of "
            "logits needs under the budget: measured through llama-server only"
        )
        for r in records
        if r.by_server and r.bench_level is not None and r.level < r.bench_level
    }


def check_line(entry: dict[str, Any]) -> str:
    """One line: the planner's level against what llama.cpp did at it and one below."""
    parts = []
    for c in entry["checks"]:
        what = "serves" if c["served"] else ("loads but fails its first request" if c["loaded"] else "does not load")
        why = f" ({c['reason'][:160]})" if c["reason"] and not c["served"] else ""
        parts.append(f"--n-cpu-moe {c['n_cpu_moe']} {what}{why}")
    n = entry["n_cpu_moe"]
    below = next((c for c in entry["checks"] if c["n_cpu_moe"] == n - 1), None)
    if entry.get("placed_by") == PLACED_BY_SERVER:
        at = entry["measured_at"]
        served = any(c["served"] and c["n_cpu_moe"] == at for c in entry["checks"])
        verdict = (
            f"placed by llama-server at {at} (llama-bench's placement: {n}; the planner's least for the server: "
            f"{entry['server_plan']})"
            if served
            else f"no level llama-server was asked served: measured at llama-bench's {n}, where it fails"
        )
    elif entry.get("measured_at", n) != n:
        verdict = f"llama.cpp refuses the planner's level: measured at {entry['measured_at']}"
    elif below is None:
        verdict = "nothing below it to try"
    elif below["served"]:
        verdict = "the planner is conservative here: one level less also serves"
    else:
        verdict = "llama.cpp confirms the edge"
    line = f"{entry['config']} ({entry['request'] or FIT}) at {entry['n_ctx']:,} tokens: " + "; ".join(parts)
    line += f": {verdict}"
    own = entry.get("llama_fit")
    if own is not None:
        line += f"; llama.cpp's own --fit: {FitChoice.from_dict(own).describe()}"
    return line
