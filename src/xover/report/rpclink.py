"""The "RPC link" section: the link to each RPC worker as the study probed it (artifact ``rpc-link``, written by
:mod:`xover.measure.workers`), and each RPC configuration's measured llama-bench speeds beside the most the link
alone allows (:mod:`xover.analysis.rpclink`: a lower bound on the time, so an upper bound on the speed)."""

from __future__ import annotations

import statistics
from typing import Any

from xover.analysis.rpclink import (
    ASSUMPTIONS,
    Link,
    LinkModel,
    Placement,
    decode_limit_tps,
    expert_layers_on_workers,
    prefill_limit_tps,
    worker_ranges,
)
from xover.domain import llama_options
from xover.domain.records import RPC_WORKER_KEY
from xover.report.blocks import Block, table
from xover.report.translate import stored_terms
from xover.results.read_model import StudyData

MIB = 1 << 20


def _link_of(entry: dict[str, Any]) -> Link | None:
    if entry.get("error") or not entry.get("rtt_ms"):
        return None
    return Link.from_probe(entry["rtt_ms"], entry["up_mib_s"], entry["down_mib_s"])


def _workers(data: StudyData) -> dict[str, str]:
    """Endpoint -> what the runs' provenance says of each RPC worker (its build, backend and devices, or that the
    user runs it), the latest run's word for each."""
    found: dict[str, str] = {}
    for run in data.runs:
        for key, value in run.provenance.extra:
            if key.startswith(RPC_WORKER_KEY):
                found[key.removeprefix(RPC_WORKER_KEY)] = value
    return found


def _link_rows(links: list[dict[str, Any]], workers: dict[str, str]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for x in links:
        what = workers.get(x["endpoint"], "-")
        if x.get("error"):
            rows.append((x["endpoint"], what, "-", "-", "-", "-", f"not probed: {str(x['error'])[:160]}"))
            continue
        rtt, up, down = x["rtt_ms"], x["up_mib_s"], x["down_mib_s"]
        rows.append(
            (
                x["endpoint"],
                what,
                str(x.get("protocol", "-")),
                f"{statistics.median(rtt):.3f} ({min(rtt):.3f}-{max(rtt):.3f}, n={len(rtt)})",
                f"{statistics.median(up):,.0f} ({min(up):,.0f}-{max(up):,.0f})",
                f"{statistics.median(down):,.0f} ({min(down):,.0f}-{max(down):,.0f})",
                f"{int(x['block_bytes']) // MIB} MiB blocks",
            )
        )
    return rows


def _fastest(endpoints: list[str], by_endpoint: dict[str, Link]) -> Link | None:
    """The best figures among a configuration's workers (each range crosses its own worker's link; taking the
    best keeps the time a lower bound)."""
    found = [by_endpoint[e] for e in endpoints if e in by_endpoint]
    if not found:
        return None
    return Link(min(x.rtt_s for x in found), max(x.up_bytes_s for x in found), max(x.down_bytes_s for x in found))


def _limit_rows(data: StudyData, model: LinkModel, by_endpoint: dict[str, Link]) -> list[tuple[str, ...]]:
    rpc_configs: dict[str, tuple[list[str], int]] = {}  # config key -> (workers, layers with experts on them)
    ot = llama_options.OVERRIDE_TENSOR
    for c in data.configs:
        if c.rpc:
            experts = expert_layers_on_workers(ot.bench_value(c.get(ot.name) or ""), model.n_layer)
            rpc_configs[c.key] = (list(c.rpc), experts)
    rows: list[tuple[str, ...]] = []
    for label, r in data.bench:
        if r.config_key not in rpc_configs or not r.samples_ts:
            continue
        endpoints, experts = rpc_configs[r.config_key]
        link = _fastest(endpoints, by_endpoint)
        ngl = int(r.record.get("n_gpu_layers", 0))
        local_gpu = any(b not in ("CPU", "RPC", "BLAS") for b in str(r.record.get("backends", "")).split(","))
        placement = Placement(ngl, len(endpoints), experts, local_gpu)
        # A layer split with experts on a worker besides is not modelled (which crossings overlap depends on the
        # split): no limit rather than a wrong one.
        mixed = experts and worker_ranges(model, placement)
        if r.n_prompt and not r.n_gen:
            ub = int(r.record.get("n_ubatch", 512))
            limit = prefill_limit_tps(model, placement, r.n_prompt, ub, link) if link else None
        elif r.n_gen and not r.n_prompt:
            limit = decode_limit_tps(model, placement, link) if link else None
        else:
            continue
        limit = None if mixed else limit
        measured = statistics.median(r.samples_ts)
        rows.append(
            (
                label,
                r.test_name,
                str(ngl),
                str(experts) if experts else "-",
                str(len(endpoints)),
                f"{measured:,.1f}",
                f"{limit:,.0f}" if limit else ("not modelled (layers and experts both on workers)" if mixed else "-"),
                f"{measured / limit:.1%}" if limit else "-",
            )
        )
    return rows


def rpc_link_blocks(data: StudyData) -> list[Block]:
    stored = data.artifact_bodies("rpc-link")
    if not stored or not stored[-1]:
        return []
    links: list[dict[str, Any]] = stored[-1]
    by_endpoint = {x["endpoint"]: link for x in links if (link := _link_of(x)) is not None}
    blocks = [
        Block("h2", "RPC link"),
        Block(
            "p",
            "The link to each RPC worker, probed once at the start of the study's last run through ggml-rpc-server's "
            "own protocol on the same TCP path llama.cpp uses: round trip = a GET_ALIGNMENT request and its reply; "
            "up = a SET_TENSOR of the block (the command activations travel with) closed by one round trip; down = "
            "a GET_TENSOR of the block. Medians (range); each bandwidth sample includes one round trip.",
        ),
        table(
            ("worker", "what it is (provenance)", "protocol", "round trip ms", "up MiB/s", "down MiB/s", "block"),
            _link_rows(links, _workers(data)),
        ),
    ]
    terms = stored_terms(data)
    if terms is None:
        return [*blocks, Block("p", "The model's dimensions are not stored: no link limit computed.")]
    rows = _limit_rows(data, LinkModel.from_terms(terms), by_endpoint)
    if not rows:
        return blocks
    return [
        *blocks,
        Block(
            "p",
            "Measured llama-bench speed of each RPC configuration against the most the link alone allows "
            "(median figures of the probe above). The limit is an upper bound on speed from a lower bound on "
            "link time: per ubatch and worker range one round trip and the hidden state each way, and per layer "
            "whose experts are on a worker one round trip, its input and routing up and its output back; the rest "
            "of what crosses, and all compute, come on top. 'share' is the part of the measured time that the "
            "link's least time accounts for.",
        ),
        table(
            (
                "config",
                "test",
                "-ngl",
                "layers with experts on workers",
                "workers",
                "measured t/s",
                "link limit t/s (upper bound)",
                "share",
            ),
            rows,
        ),
        Block("ul", items=ASSUMPTIONS),
    ]
