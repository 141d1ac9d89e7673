"""Decode against its limit, and where the experts live: the report section of issue 31. Pure: the store in, blocks
out.

Beside every configuration's decode (llama-bench ``tg`` at its shallowest depth and llama-server's decode at the
shortest prompt length), the theory's memory-bandwidth limit for its placement (the bytes per token resident on the
CPU and on the GPU at this host's bandwidths, :func:`xover.analysis.theory.roofline_limit`), the share of it reached,
the buffers llama.cpp put the model's weights in (``CPU_Mapped``, ``CUDA_Host``, ``CPU_REPACK``, ``AMX``... per
device, from each process's load log), and for a tuned variant the settings that moved it from its base.

Then physics apart from settings: per base configuration, the decode time per token at llama.cpp's defaults, what
the best measured setting removed of it, and how far that best still lies from the limit (what no searched setting
moved).
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

from xover.analysis.rounds import paired_ratio
from xover.analysis.theory import ModelTerms, offload_of, roofline_limit
from xover.domain import llama_options as opts
from xover.domain.config import LlamaConfig
from xover.domain.profiles import Hardware, hardware_from_dict
from xover.domain.units import format_tokens
from xover.errors import XoverError
from xover.report.blocks import Block, table
from xover.report.tables import format_size
from xover.report.translate import stored_terms
from xover.report.tune import Layout
from xover.results.read_model import StudyData, crossover_inputs


def model_buffers(data: StudyData) -> dict[str, tuple[str, tuple[tuple[str, int], ...]]]:
    """Label -> (the process that logged them, ((device, bytes) of every model buffer)), from the latest memory
    artifact of each configuration; a llama-server's log is preferred to llama-bench's (it is what is served)."""
    out: dict[str, tuple[str, tuple[tuple[str, int], ...]]] = {}
    for body in data.artifact_bodies("memory"):
        if not isinstance(body, Mapping):
            continue
        label = data.labels.get(str(body.get("config_key")), str(body.get("label", "")))
        source = str(body.get("source", ""))
        found = tuple((str(d), int(b)) for d, kind, b in body.get("buffers") or () if kind == "model")
        if not found or not label:
            continue
        if label in out and out[label][0] == "llama-server" and source != "llama-server":
            continue
        out[label] = (source, found)
    return out


def buffers_text(found: Sequence[tuple[str, int]]) -> str:
    """``CUDA0 10.20 GiB, CUDA_Host 6.80 GiB``, the host buffers (where CPU-resident experts live) marked."""
    return ", ".join(f"{dev} {format_size(b)}" for dev, b in found)


def _bench_decode(data: StudyData) -> dict[str, tuple[int, float]]:
    """Label -> (depth, t/s) of its llama-bench decode at the shallowest depth measured (the latest result)."""
    out: dict[str, tuple[int, float]] = {}
    for label, r in data.bench:
        if r.n_gen and not r.n_prompt and (label not in out or r.n_depth <= out[label][0]):
            out[label] = (r.n_depth, r.avg_ts)
    return out


def _server_decode(data: StudyData) -> tuple[dict[str, tuple[int, float]], dict[str, dict[int, float]]]:
    """Label -> (prompt length, median t/s) of llama-server's decode at the shortest length with any, and label ->
    round -> that round's median decode t/s at that length (empty for a store measured before rounds)."""
    out, by_round = {}, {}
    for c in crossover_inputs(data):
        lengths = sorted(L for L, xs in c.decode_tps.items() if xs)
        if lengths:
            out[c.label] = (lengths[0], statistics.median(c.decode_tps[lengths[0]]))
            by_round[c.label] = {r: tps for r, (_, tps) in c.rounds.get(lengths[0], {}).items() if tps > 0}
    return out, by_round


def _hardware(data: StudyData) -> Hardware | None:
    pred = data.prediction()
    return hardware_from_dict(pred.hardware) if pred is not None and pred.hardware is not None else None


def _limit(terms: ModelTerms, hw: Hardware, config: LlamaConfig | None, depth: int) -> float | None:
    if config is None or config.url is not None:
        return None
    try:
        return roofline_limit(terms, hw, offload_of(config), depth).decode_tps
    except (XoverError, ValueError):
        return None


def _moved(config: LlamaConfig | None, base: LlamaConfig | None) -> str:
    """The settings a variant runs that its base does not (its placement too, where a budget moved it)."""
    if config is None or base is None or config is base:
        return ""
    theirs = dict(base.settings)
    return " ".join(
        f"{opts.option(name).short}={value}" for name, value in config.settings if theirs.get(name) != value
    )


def _pct(measured: float, limit: float | None) -> str:
    return f"{measured:,.1f} ({100 * measured / limit:.0f}%)" if limit else f"{measured:,.1f}"


def decode_blocks(data: StudyData, lay: Layout) -> list[Block]:
    """The section; empty where nothing decoded was measured."""
    bench, (served, served_rounds) = _bench_decode(data), _server_decode(data)
    if not bench and not served:
        return []
    terms, hw = stored_terms(data), _hardware(data)
    configs = {c.name: c for c in data.configs}
    buffers = model_buffers(data)
    base_of = lay.base_of
    order = [x for b in lay.bases for x in lay.family(b)]
    labels = [lb for lb in dict.fromkeys([*order, *bench, *served]) if lb in bench or lb in served]
    rows: list[list[str]] = []
    limits: dict[str, float] = {}
    for label in labels:
        cfg = configs.get(label)
        lim0 = _limit(terms, hw, cfg, bench[label][0] if label in bench else 0) if terms and hw else None
        limL = _limit(terms, hw, cfg, served[label][0]) if terms and hw and label in served else None
        read = limL if label in served else lim0  # the limit of the rate the physics line reads (the server's first)
        if read:
            limits[label] = read
        b, s = bench.get(label), served.get(label)
        source, found = buffers.get(label, ("", ()))
        base = base_of.get(label)
        moved = _moved(cfg, configs.get(base)) if base else ""
        rows.append(
            [
                label,
                f"{_pct(b[1], lim0)} @ d{format_tokens(b[0])}" if b else "—",
                f"{_pct(s[1], limL)} @ {format_tokens(s[0])}" if s else "—",
                f"{lim0:,.1f}" if lim0 else "—",
                f"{buffers_text(found)} ({source})" if found else "not logged",
                f"{moved} (from {base})" if moved else ("—" if base is None else "nothing"),
            ]
        )
    out = [
        Block("h2", "Decode against its limit, and where the weights live"),
        Block(
            "p",
            "Each configuration's decode beside the theory's memory-bandwidth limit for its placement (the bytes "
            "read per token from host memory and from the GPU, at this host's bandwidths) and the share of it "
            "reached; the model buffers llama.cpp logged when it loaded (CPU_Mapped: the mapped file; CUDA_Host: "
            "the GPU's pinned host buffer, where CPU-resident experts go with a GPU present; CPU_REPACK: experts "
            "repacked for the CPU's kernels, only with --no-host); and the settings that moved a tuned variant from "
            "its base. A setting that did not take effect shows here: the same buffers as its base.",
        ),
        table(
            [
                "config",
                "llama-bench decode t/s (% of limit)",
                "llama-server decode t/s (% of limit)",
                "limit t/s",
                "model buffers (logged by)",
                "settings that moved it",
            ],
            rows,
        ),
    ]
    out += _physics(lay, bench, served, served_rounds, limits)
    return out


def _physics(
    lay: Layout,
    bench: Mapping[str, tuple[int, float]],
    served: Mapping[str, tuple[int, float]],
    served_rounds: Mapping[str, Mapping[int, float]],
    limits: Mapping[str, float],
) -> list[Block]:
    """Per base: what tuning removed of decode's time per token, and what is left against the limit. A variant is
    credited only where its decode is faster than its base's beyond the noise between rounds of fresh servers (the
    rounds rule on seconds per token, paired by round); without rounds, the comparison is said to rest on one
    process each."""
    lines = []
    for base in lay.bases:
        rates = {x: rate for x in lay.family(base) if (rate := served.get(x) or bench.get(x)) is not None}
        if base not in rates or len(rates) < 2:
            continue
        d0 = rates[base][1]
        best = max(rates, key=lambda x: rates[x][1])
        text = f"{base}: decode at llama.cpp's defaults {d0:,.1f} t/s"
        if best == base:
            text += " (no setting beat it)"
        else:
            r = paired_ratio(
                {n: 1 / t for n, t in served_rounds.get(best, {}).items()},
                {n: 1 / t for n, t in served_rounds.get(base, {}).items()},
            )
            if r is not None and r.sign >= 0:  # not faster beyond the noise between rounds
                text += (
                    f"; the fastest measured, {best}, {rates[best][1]:,.1f} t/s, is not faster than it beyond the "
                    f"noise between {r.n} rounds of fresh servers, so no setting is credited"
                )
                best = base
            else:
                removed = 1 - d0 / rates[best][1]
                text += f"; the best measured, {best}, {rates[best][1]:,.1f} t/s ({removed:.0%} of the time per token "
                text += "removed by settings" + (f", over {r.n} rounds)" if r is not None else ", one process each)")
        d1, limit = rates[best][1], limits.get(best)
        if limit:
            text += (
                f"; the limit here is {limit:,.1f} t/s, so {d1 / limit:.0%} of it is reached and the remaining "
                f"{max(0.0, 1 / d1 - 1 / limit) * 1000:,.1f} ms a token are what no searched setting moved"
            )
        lines.append(text + ".")
    if not lines:
        return []
    return [
        Block("p", "Physics apart from settings (llama-server's decode where measured, else llama-bench's):"),
        Block("ul", items=tuple(lines)),
    ]
