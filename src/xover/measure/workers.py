"""A study's local RPC workers: the configurations' ``rpc-local = N`` as running ``ggml-rpc-server`` processes.

:func:`plan` (pure) shares workers between configurations: workers with the same threads serve every
configuration that asks for that many threads per worker (one configuration's llama process ends before the
next one's starts, and a worker frees what a client allocated when it disconnects), so a study starts the
largest ``rpc-local`` of each thread count once, on the ports it used last time where they are free (else the
first free ports from 50052): a resumed study finds its configurations, ``--rpc`` included, as it stored them.
:func:`study_workers` runs them around the whole study and yields the spec with each configuration's
``--rpc``; the workers stop on every way out (:mod:`xover.llamacpp.rpc`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import statistics
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from xover.domain.study_spec import LlamaConfig, StudySpec
from xover.errors import XoverError
from xover.hardware.detect import gpu_count
from xover.llamacpp import rpc, rpclink
from xover.llamacpp.binaries import Binaries
from xover.llamacpp.build import cached_builds
from xover.results.store import Store

ARTIFACT = "rpc-workers"
"""The study's local workers as last started (port, threads, what each was): a resumed study takes the same ports
where they are free, so its configurations' ``--rpc`` and the measurements stored under them still match."""


LINK_ARTIFACT = "rpc-link"
"""The link to each worker (local and user-run), probed once per study run while no llama process is connected:
round-trip times and bandwidth both ways through the RPC protocol (:mod:`xover.llamacpp.rpclink`)."""


def probe_links(endpoints: tuple[str, ...], info: Callable[[str], None]) -> list[dict[str, Any]]:
    """One :func:`rpclink.probe` per endpoint; a worker that cannot be probed is recorded with its error and the
    study goes on (the probe is context, not a measurement the study depends on)."""
    out: list[dict[str, Any]] = []
    for endpoint in endpoints:
        try:
            p = rpclink.probe(endpoint)
        except (OSError, XoverError) as e:
            info(f"RPC link {endpoint}: not probed ({e})")
            out.append({"endpoint": endpoint, "error": str(e)})
            continue
        info(
            f"RPC link {endpoint}: RTT {statistics.median(p.rtt_ms):.3f} ms (median of {len(p.rtt_ms)}), "
            f"{p.block_bytes >> 20} MiB blocks up {statistics.median(p.up_mib_s):,.0f} MiB/s, "
            f"down {statistics.median(p.down_mib_s):,.0f} MiB/s"
        )
        out.append(dataclasses.asdict(p))
    return out


@dataclasses.dataclass(frozen=True)
class WorkerPlan:
    """Workers to start (threads of each, in start order) and, per configuration, the indices of its workers."""

    threads: tuple[int, ...]
    assigned: tuple[tuple[str, tuple[int, ...]], ...]


def plan(configs: tuple[LlamaConfig, ...], cpu_count: int) -> WorkerPlan:
    """Which workers a study starts and which configuration uses which. Pure."""
    need: dict[int, int] = {}  # threads -> workers
    wanted: list[tuple[str, int, int]] = []
    for c in configs:
        if not c.rpc_local:
            continue
        threads = c.rpc_threads or max(1, cpu_count // c.rpc_local)
        need[threads] = max(need.get(threads, 0), c.rpc_local)
        wanted.append((c.name, threads, c.rpc_local))
    threads_list: list[int] = []
    first: dict[int, int] = {}
    for t, n in need.items():
        first[t] = len(threads_list)
        threads_list += [t] * n
    return WorkerPlan(
        threads=tuple(threads_list),
        assigned=tuple((name, tuple(range(first[t], first[t] + n))) for name, t, n in wanted),
    )


def resolve(spec: StudySpec, endpoints: tuple[str, ...], worker_plan: WorkerPlan) -> StudySpec:
    """``spec`` with each ``rpc-local`` configuration given its workers' endpoints as ``--rpc``. Pure."""
    assigned = dict(worker_plan.assigned)
    configs = tuple(
        c.with_rpc(tuple(endpoints[i] for i in assigned[c.name])) if c.name in assigned else c for c in spec.configs
    )
    return dataclasses.replace(spec, configs=configs)


def _worker_gpus(n_workers: int, backend: str | None) -> tuple[str, ...]:
    """Each local worker's GPU (:func:`rpc.worker_gpus`): the machine's GPUs that this process's own variable
    (``CUDA_VISIBLE_DEVICES``) leaves to the workers, where it is set."""
    var = rpc.visible_devices_variable(backend)
    visible = os.environ.get(var) if var else None
    if not visible:
        return rpc.worker_gpus(n_workers, None, 0)

    return rpc.worker_gpus(n_workers, visible, gpu_count())


@contextlib.contextmanager
def study_workers(
    spec: StudySpec, study_dir: Path, binaries: Binaries, info: Callable[[str], None] = lambda s: None
) -> Iterator[StudySpec]:
    """Run the study's local workers (``rpc-local``), check its user-run ones (``rpc``), yield the spec every
    configuration of which can be measured; stop the workers whatever the way out."""
    worker_plan = plan(spec.configs, os.cpu_count() or 1)
    user = tuple(dict.fromkeys(e for c in spec.configs for e in c.rpc))
    if not worker_plan.threads and not user:
        yield spec
        return
    binary = binaries.rpc_server
    if worker_plan.threads and binary is None:
        raise XoverError(
            f"rpc-local needs llama.cpp's ggml-rpc-server beside {binaries.server}: run `xover llama build` (it builds "
            "it with -DGGML_RPC=ON), or pass --llama-bin-dir with a build that has it"
        )
    manifest = binaries.manifest or next((m for m in cached_builds() if Path(m.bin_dir) == binaries.bin_dir), None)
    backend = manifest.backend if manifest is not None else None
    build = f"{manifest.commit[:7]} {manifest.backend}" if manifest is not None else None
    with Store(study_dir) as store:
        stored = store.artifacts(ARTIFACT)
    before: list[dict[str, Any]] = stored[-1][2] if stored else []
    ports = rpc.free_ports(len(worker_plan.threads), preferred=[int(w["port"]) for w in before])
    gpus = _worker_gpus(len(worker_plan.threads), backend)
    specs = [
        rpc.WorkerSpec(port=p, threads=t, env=rpc.cuda_env(g, backend))
        for p, t, g in zip(ports, worker_plan.threads, gpus)
    ]
    assert binary is not None or not specs
    with rpc.running(specs, binary or Path(), study_dir / "logs", build=build, user_endpoints=user) as infos:
        for w in infos:
            info("RPC worker " + w.describe())
        body = [{"port": s.port, "threads": s.threads, "worker": w.describe()} for s, w in zip(specs, infos)]
        links = probe_links(tuple(w.endpoint for w in infos), info)
        with Store(study_dir) as store:
            if body != before:
                store.add_artifact(None, ARTIFACT, body)
            store.add_artifact(None, LINK_ARTIFACT, links)
        yield resolve(spec, tuple(s.endpoint for s in specs), worker_plan)
