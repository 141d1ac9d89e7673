"""The steps every llama-server runner takes for a configuration (ttft, session, cache lab): start its
server and wait until it answers ``/health`` (:class:`xover.llamacpp.server.LlamaServer`), store the run
(begun with the server's build), the configuration and its ``/props`` (:meth:`Recording.server_props`),
then send one discarded warm-up request before anything is measured (:func:`warm_up`).

The server is stopped on the way out of :func:`started_server`, whatever the way.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from xover.client.http import LlamaClient, completion_body
from xover.domain.config import LlamaConfig
from xover.domain.llama_options import BACKEND_TRAITS, UBATCH_SIZE
from xover.errors import XoverError
from xover.llamacpp.binaries import Binaries
from xover.llamacpp.server import LlamaServer, ServerLaunch, device_problem
from xover.measure.recorder import Recording

WARMUP_LENGTH = 8  # tokens in the discarded warm-up prompt
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
            **({"devices": ", ".join(f"{d} ({desc})" for d, desc in devices)} if devices else {}),
        )
        yield srv


def warmup_length(config: LlamaConfig, backend: str | None, ctx_size: int) -> int:
    """Tokens in the discarded warm-up prompt: :data:`WARMUP_LENGTH`, or, on a backend that compiles its pipelines
    as shapes first appear (:attr:`BackendTraits.lazy_pipelines`: Vulkan), one whole ubatch and a partial one more,
    reaching at least the backend's :attr:`BackendTraits.warmup_positions`, so that the compilation lands in the
    warm-up and not in the first measured prompt (within the context, less room for the warm-up's answer)."""
    traits = BACKEND_TRAITS.get(backend) if backend is not None else None
    if traits is None or not traits.lazy_pipelines:
        return WARMUP_LENGTH
    ubatch = config.int_value(UBATCH_SIZE.name) or int(UBATCH_SIZE.default)
    wanted = max(ubatch, traits.warmup_positions) + 8 * WARMUP_LENGTH
    return max(WARMUP_LENGTH, min(wanted, ctx_size - 2 * WARMUP_RESPONSE))


async def warm_up(client: LlamaClient, prompt: tuple[int, ...] | str) -> str | None:
    """The discarded warm-up request on ``/completion`` (``WARMUP_RESPONSE`` tokens back, no prompt cache):
    why it failed, or None."""
    rec = await client.stream_completion(completion_body(prompt, WARMUP_RESPONSE, cache_prompt=False))
    return None if rec.result.error is None else f"warm-up request failed: {rec.result.error}"
