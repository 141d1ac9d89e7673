"""The "On a desktop" section: a budgeted study's measurements carried to the consumer machines the budget
emulates, through the theory (:mod:`xover.analysis.translate`). Every number here is a prediction and says so;
the measured value it comes from stands beside it."""

from __future__ import annotations

import statistics

from xover.analysis.theory import ModelTerms, Offload, model_terms, offload_of
from xover.analysis.translate import Setup, setup_assumptions, setups_for_budget, translate
from xover.domain.codec import decode
from xover.domain.presets import preset
from xover.domain.profiles import Hardware, hardware_from_dict
from xover.domain.shapes import tensor_table
from xover.domain.units import format_tokens
from xover.report.blocks import Block, table
from xover.results.read_model import StudyData, crossover_inputs, vram_budgets

SHORT_DECODE_SHARE = 0.5
"""Below this share of its own decode limit, this host's decode is called short of it, and the report says what
carrying that share to a desktop means."""


def stored_terms(data: StudyData) -> ModelTerms | None:
    """The theory's view of the model: stored by the theory stage, else rebuilt from a synthetic preset."""

    stored = data.artifact_bodies("model-terms")
    if stored:
        return decode(ModelTerms, stored[-1])
    inspected = data.artifact_bodies("inspect")
    name = inspected[-1].get("synthetic_preset") if inspected else None
    if not name:
        return None

    return model_terms(tensor_table(preset(str(name))))


def _source(data: StudyData) -> Hardware | None:
    pred = data.prediction()
    if pred is None or pred.hardware is None:
        return None
    hw = hardware_from_dict(pred.hardware)
    return hw if hw.gpu is not None else None


def _measured(data: StudyData) -> dict[str, list[tuple[int, float, float]]]:
    """Per configuration: (length, median cold TTFT s, median decode t/s) where both were measured (the same
    inputs the crossover reads: the server's decode at each length, llama-bench's where the server gave none)."""
    out: dict[str, list[tuple[int, float, float]]] = {}
    for c in crossover_inputs(data):
        rows = [
            (L, statistics.median(t), statistics.median(c.decode_tps[L]))
            for L, t in sorted(c.ttft_s.items())
            if c.decode_tps.get(L)
        ]
        if rows:
            out[c.label] = rows
    return out


def _configs(data: StudyData) -> dict[str, Offload]:
    out: dict[str, Offload] = {}
    for c in data.configs:
        if c.url is None and c.name not in out:
            out[c.name] = offload_of(c)
    return out


def translation_blocks(data: StudyData, response: int) -> list[Block]:
    budgets = vram_budgets(data)
    terms, source = stored_terms(data), _source(data)
    if not budgets or terms is None or source is None:
        return []
    setups = setups_for_budget(budgets[-1].budget)
    measured, configs = _measured(data), _configs(data)
    labels = [label for label in measured if label in configs]
    if not setups or not labels:
        return []
    out = [
        Block("h2", "On a desktop: the measurements carried to consumer machines (predicted, not measured)"),
        Block(
            "p",
            f"The budget made llama.cpp see a {budgets[-1].budget / 2**30:.0f} GiB card, but the link, cores and memory "
            "bandwidth were this host's. Each measured median below is carried to a desktop with a card of that size "
            "by the theory's ratio between the two machines. These are predictions: they are never mixed with the "
            "measurements above, and they hold only as far as the assumptions listed after the tables.",
        ),
    ]
    shares: list[float] = []
    for setup in setups:
        blocks, setup_shares = _setup_blocks(setup, terms, source, configs, measured, labels, response)
        out += blocks
        shares += setup_shares
    out += _short_decode(shares)
    out.append(Block("p", "Assumptions: " + "; ".join(setup_assumptions(source)) + "."))
    return out


def _setup_blocks(
    setup: Setup,
    terms: ModelTerms,
    source: Hardware,
    configs: dict[str, Offload],
    measured: dict[str, list[tuple[int, float, float]]],
    labels: list[str],
    response: int,
) -> tuple[list[Block], list[float]]:
    target = setup.hardware()
    rows: list[tuple[str, ...]] = []
    best: dict[int, tuple[float, str]] = {}
    candidates: dict[int, int] = {}
    shares: list[float] = []
    for label in labels:
        for t in translate(terms, source, target, configs[label], measured[label], response):
            rows.append(
                (
                    label,
                    format_tokens(t.length),
                    f"{t.measured_ttft_s:.2f} s → {t.ttft_s:.2f} s",
                    f"{t.measured_decode_tps:.1f} → {t.decode_tps:.1f} (limit {t.decode_limit_tps:.1f})",
                    f"{t.measured_total_s:.2f} s → {t.total_s:.2f} s (at the limit {t.limit_total_s:.2f} s)",
                )
            )
            shares.append(t.source_decode_share)
            candidates[t.length] = candidates.get(t.length, 0) + 1
            if t.length not in best or t.total_s < best[t.length][0]:
                best[t.length] = (t.total_s, label)
    fastest = "; ".join(
        f"{format_tokens(L)} {label}" + ("" if candidates[L] > 1 else " (the only one measured there)")
        for L, (_, label) in sorted(best.items())
    )
    out = [
        Block("h3", f"{setup.key}: {setup.describe()}"),
        table(
            (
                "config",
                "prompt",
                "cold TTFT: measured → predicted",
                "decode t/s: measured → predicted (target's limit)",
                f"total per turn ({response}-token response): measured → predicted (decode at the limit)",
            ),
            rows,
        ),
    ]
    if max(candidates.values(), default=0) > 1:  # one configuration alone is no answer to "which is fastest"
        out.append(Block("p", f"Predicted fastest per turn on this machine: {fastest}."))
    return out, shares


def _short_decode(shares: list[float]) -> list[Block]:
    """What carrying this host's decode share means, where that share is short of its limit."""
    if not shares or min(shares) >= SHORT_DECODE_SHARE:
        return []
    lo, hi = f"{min(shares):.0%}", f"{max(shares):.0%}"
    span = lo if lo == hi else f"{lo}-{hi}"
    return [
        Block(
            "p",
            f"Decode here ran at {span} of this host's limit for the same placement (the theory's memory-bandwidth "
            "bound), and the predictions carry that share to each desktop. If the shortfall is this host's own (its "
            "CPU threads or memory under virtualisation, not the model), a desktop may decode closer to its limit: "
            "read the predicted decode as the low end and the limit in brackets as a bound that no machine reaches.",
        )
    ]
