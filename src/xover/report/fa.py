"""Flash attention on vs off: the same llama-bench tests with only ``-fa`` changed. Pure: data in, text out.

Results are paired by what llama-bench itself reports it ran (its JSON record), not by configuration
names: two tests pair when every setting but ``flash_attn`` is equal. Per test the table shows each
mode's speed and the on/off ratio; per test kind (pp, tg) a sentence says whether the ratio moves with
depth (flash attention changes the shape of the curve) or stays put (it only shifts it), and the
buffers llama.cpp allocated in each mode say how much longer a context it lets fit.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from xover.domain import llama_options
from xover.domain.records import BenchResult

# What makes two llama-bench tests comparable: the model, the build and every setting llama-bench reports (the
# option table's record fields), but flash_attn, the one varied.
_SAME = (
    "model_filename",
    "model_type",
    "backends",
    *(f for f in llama_options.record_fields() if f != llama_options.FLASH_ATTN.record_field),
    "split_mode",
    "tensor_buft_overrides",
    "devices",
    "build_commit",
)
MODES = {-1: "auto", 0: "off", 1: "on"}
SHAPE_CHANGE = 0.10
"""A ratio that moves by more than this (and by more than two standard deviations of the change, from
llama-bench's own spreads) between the shallowest and the deepest test changes the shape."""


def fa_mode(value: Any) -> str:
    """llama-bench's ``flash_attn`` (-1/0/1, or a bool or string in other versions) as auto/off/on."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, int):
        return MODES.get(value, str(value))
    return str(value)


@dataclasses.dataclass(frozen=True)
class FaTest:
    labels: str  # the configurations involved, as the study names them
    test: str  # pp512 @ d4096
    kind: str  # pp or tg
    depth: int
    tps: Mapping[str, tuple[float, float]]  # mode -> (avg t/s, stddev)
    config_keys: Mapping[str, str]  # mode -> config key (for the memory each mode allocated)

    @property
    def ratio_rel_sd(self) -> float:
        """Relative standard deviation of :attr:`ratio` (the two speeds' relative sds in quadrature)."""
        on = self.tps.get("on") or self.tps.get("auto")
        off = self.tps.get("off")
        if not on or not off or on[0] <= 0 or off[0] <= 0:
            return 0.0
        return ((on[1] / on[0]) ** 2 + (off[1] / off[0]) ** 2) ** 0.5

    @property
    def ratio(self) -> float | None:
        """on / off speed (auto stands in for on when on was not run), None without both."""
        on = self.tps.get("on") or self.tps.get("auto")
        off = self.tps.get("off")
        return on[0] / off[0] if on and off and off[0] > 0 else None


def fa_tests(bench: Sequence[tuple[str, BenchResult]]) -> list[FaTest]:
    """Every test measured in two or more flash-attention modes with everything else equal."""
    groups: dict[tuple[Any, ...], dict[str, tuple[str, BenchResult]]] = defaultdict(dict)
    for label, r in bench:
        if "flash_attn" not in r.record:
            continue
        key = (tuple(str(r.record.get(f)) for f in _SAME), r.n_prompt, r.n_gen, r.n_depth)
        groups[key][fa_mode(r.record["flash_attn"])] = (label, r)  # the latest result of a mode wins
    out = []
    for (_, n_prompt, n_gen, depth), by_mode in groups.items():
        if len(by_mode) < 2:
            continue
        any_r = next(iter(by_mode.values()))[1]
        order = {"on": 0, "auto": 1, "off": 2}
        labels = " / ".join(
            label if "fa" in label else f"{label} (fa {mode})"
            for mode, (label, _) in sorted(by_mode.items(), key=lambda kv: order.get(kv[0], 3))
        )
        out.append(
            FaTest(
                labels=labels,
                test=any_r.test_name,
                kind="pp" if n_prompt and not n_gen else "tg",
                depth=depth,
                tps={m: (r.avg_ts, r.stddev_ts) for m, (_, r) in by_mode.items()},
                config_keys={m: r.config_key for m, (_, r) in by_mode.items()},
            )
        )
    return sorted(out, key=lambda t: (t.labels, t.kind, t.depth, t.test))


def fa_table(tests: Sequence[FaTest]) -> tuple[list[str], list[list[str]]]:
    modes = [m for m in ("on", "auto", "off") if any(m in t.tps for t in tests)]
    header = ["configurations", "test", *(f"t/s fa {m}" for m in modes), "on/off"]
    rows = []
    for t in tests:
        cells = [f"{t.tps[m][0]:.2f} ± {t.tps[m][1]:.2f}" if m in t.tps else "—" for m in modes]
        rows.append([t.labels, t.test, *cells, f"{t.ratio:.2f}x" if t.ratio else "—"])
    return header, rows


def fa_findings(tests: Sequence[FaTest], memory: Mapping[str, Mapping[str, Any]] | None = None) -> list[str]:
    """One sentence per configuration pair and test kind: the ratio at the shallowest and deepest
    depth and what that means; then the KV and compute buffers of each mode where llama-bench logged them."""
    out = []
    by: dict[tuple[str, str], list[FaTest]] = defaultdict(list)
    for t in tests:
        if t.ratio is not None:
            by[(t.labels, t.kind)].append(t)
    for (labels, kind), ts in sorted(by.items()):
        ts.sort(key=lambda t: t.depth)
        lo, hi = ts[0], ts[-1]
        assert lo.ratio is not None and hi.ratio is not None
        what = "prefill" if kind == "pp" else "decode"
        if len(ts) < 2 or lo.depth == hi.depth:
            out.append(
                f"{labels}: {what} {lo.ratio:.2f}x with flash attention at depth {lo.depth:,} (one depth measured)"
            )
            continue
        moved = hi.ratio / lo.ratio - 1
        noise = 2 * (lo.ratio_rel_sd**2 + hi.ratio_rel_sd**2) ** 0.5  # two standard deviations of the change
        if abs(moved) <= max(SHAPE_CHANGE, noise):
            shape = "shifts the curve without changing its shape" + (
                f" (the {moved:+.0%} change with depth is within noise, ±{noise:.0%})"
                if abs(moved) > SHAPE_CHANGE
                else ""
            )
        else:
            shape = (
                "changes the shape of the curve: its advantage " + ("grows" if moved > 0 else "shrinks") + " with depth"
            )
        out.append(
            f"{labels}: {what} on/off {lo.ratio:.2f}x at depth {lo.depth:,} and {hi.ratio:.2f}x at {hi.depth:,}: "
            f"flash attention {shape}"
        )
    if memory:
        seen: set[tuple[str, str]] = set()
        for t in tests:
            for mode, key in sorted(t.config_keys.items()):
                mem = memory.get(key)
                if mem is None or (t.labels, mode) in seen:
                    continue
                seen.add((t.labels, mode))
                kv = sum(b for _, kind, b in mem.get("buffers", []) if kind == "KV")
                compute = sum(b for _, kind, b in mem.get("buffers", []) if kind == "compute")
                out.append(
                    f"{t.labels}: fa {mode} allocated KV {kv / 2**20:,.0f} MiB and compute buffers "
                    f"{compute / 2**20:,.0f} MiB (peak, as llama-bench logged them)"
                )
    return out
