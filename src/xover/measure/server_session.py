"""The steps every llama-server runner takes for a configuration (ttft, session, cache lab): start its
server and wait until it answers ``/health`` (:class:`xover.llamacpp.server.LlamaServer`), store the run
(begun with the server's build), the configuration and its ``/props`` (:meth:`Recording.server_props`),
then send the discarded warm-up requests that warm its prompt path before anything is measured (:func:`warm_up`,
:func:`warmup_lengths`).

The server is stopped on the way out of :func:`started_server`, whatever the way.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from xover.client.http import LlamaClient, completion_body
from xover.domain.config import LlamaConfig
from xover.domain.llama_options import BACKEND_TRAITS, BATCH_SIZE, UBATCH_SIZE
from xover.errors import XoverError
from xover.llamacpp.binaries import Binaries
from xover.llamacpp.server import LlamaServer, ServerLaunch, device_problem, overridden_defaults
from xover.measure.recorder import Recording

WARMUP_LENGTH = 8  # the fewest tokens a warm-up prompt has
WARMUP_RESPONSE = 4


@contextlib.asynccontextmanager
async def started_server(
    recording: Recording,
    binaries: Binaries,
    spec: ServerLaunch,
    log_dir: Path,
    *,
    config: LlamaConfig | None = None,
    startup_timeout_s: float | None = None,
    **where: Any,
) -> AsyncIterator[LlamaServer]:
    """``spec``'s llama-server, healthy, with its props stored under ``recording`` as those of ``config``
    (default: ``spec.config``), ``where`` first (a mode, a scenario) and then its log, pid and whole argument
    list (xover's own flags with the configuration's: the server's provenance).
    ``startup_timeout_s`` None: :class:`LlamaServer`'s own."""
    timeout = {} if startup_timeout_s is None else {"startup_timeout_s": startup_timeout_s}
    bins = binaries.for_config(spec.config)
    async with LlamaServer(bins.server, spec, log_dir, **timeout) as srv:
        problem, devices = device_problem(srv.log_path, bins.expected_backend)
        if problem is not None:  # a GPU build that found no device: its numbers would be the CPU's
            raise XoverError(problem)
        recording.server_props(
            config or spec.config,
            srv.props,
            srv.model_meta,
            **where,
            log=str(srv.log_path),
            pid=srv.pid,
            args=list(spec.args()),
            overrode=overridden_defaults(spec, bins.server),
            **({"devices": ", ".join(f"{d} ({desc})" for d, desc in devices)} if devices else {}),
        )
        yield srv


def props_n_ctx(props: Mapping[str, Any]) -> int | None:
    """The context a running server reports in its ``/props`` (``default_generation_settings.n_ctx``), else None."""
    settings = props.get("default_generation_settings")
    n_ctx = settings.get("n_ctx") if isinstance(settings, dict) else None
    return int(n_ctx) if isinstance(n_ctx, int) and not isinstance(n_ctx, bool) else None


def warmup_lengths(config: LlamaConfig, backend: str | None, ctx_size: int, shortest: int | None) -> tuple[int, ...]:
    """The discarded warm-up prompts a server answers before anything is measured, in tokens, in order.

    A few-token warm-up leaves the prompt path cold: the first large batch pays one-time costs (graph allocation for
    the new shape, first touch of the compute and KV buffers), and a server's first measured prompt then costs
    1.4-2.2x the same prompt later (H200, CUDA; about 1.4x on 2 CPU cores with tiny-moe). So:

    1. a prompt that fills the largest ubatch the server runs (``min(-ub, -b)``, llama.cpp's defaults where unset);
       on a backend that compiles its pipelines as shapes first appear (:attr:`BackendTraits.lazy_pipelines`:
       Vulkan) one whole ubatch and a partial one more, reaching at least the backend's
       :attr:`BackendTraits.warmup_positions`, so that the compilation lands here and not in a measured prompt;
    2. a prompt of ``shortest`` tokens, the shortest the server measures (None: none), so that its size has been
       seen too.

    Each within the context, less room for its answer; a second prompt the first already covers is left out."""
    traits = BACKEND_TRAITS.get(backend) if backend is not None else None
    ubatch = config.int_value(UBATCH_SIZE.name) or int(UBATCH_SIZE.default)
    batch = config.int_value(BATCH_SIZE.name) or int(BATCH_SIZE.default)
    fill = min(ubatch, batch)
    if traits is not None and traits.lazy_pipelines:
        fill = max(ubatch, traits.warmup_positions) + 8 * WARMUP_LENGTH
    room = ctx_size - 2 * WARMUP_RESPONSE
    first = max(WARMUP_LENGTH, min(fill, room))
    if shortest is None or shortest <= 0:
        return (first,)
    second = max(WARMUP_LENGTH, min(shortest, room))
    return (first,) if second == first else (first, second)


async def warm_up(client: LlamaClient, prompts: Sequence[tuple[int, ...] | str]) -> str | None:
    """The discarded warm-up requests on ``/completion``, in order (``WARMUP_RESPONSE`` tokens back each, no prompt
    cache; :func:`warmup_lengths` says which): why one failed, or None."""
    for prompt in prompts:
        rec = await client.stream_completion(completion_body(prompt, WARMUP_RESPONSE, cache_prompt=False))
        if rec.result.error is not None:
            return f"warm-up request failed: {rec.result.error}"
    return None
