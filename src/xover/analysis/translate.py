"""Measured numbers carried to another machine through the theory: a prediction, never a measurement.

A VRAM budget makes llama.cpp see a smaller card, but the rest of the machine stays what it is: an H200 host's
PCIe gen 5 link, 16 server cores and their memory bandwidth are not a desktop's. With experts on the CPU, prefill
is bound by the host-to-device copies of those experts (or by the CPU) and decode by host memory bandwidth, so
the measured times do not transfer as they are.

:func:`translate` scales each measured value by the theory's ratio between the two machines for the same
configuration (the same placement, ubatch and load mode) at the same prompt length::

    TTFT on target  = measured TTFT  x  predicted TTFT(target) / predicted TTFT(this host)
    decode on target = measured t/s  x  predicted t/s(target)  / predicted t/s(this host)

so what the theory leaves out (kernel launches, synchronisation, the server's own overheads) is assumed to
scale alike on both machines; what it models (link rates, CPU and GPU rooflines, expert coverage, attention)
moves the number. The assumptions travel with every translated table (:func:`setup_assumptions`).

Scaling carries this host's efficiency to the target. Where this host's decode falls far short of its own
limit (a virtual machine's CPU threads or memory; gpt-oss-120b decoded at 11% of it on the H200 host), that
shortfall may be the host's and not the model's, so each translated decode also carries the target's limit
(:attr:`Translated.decode_limit_tps`, the bandwidth bound that no machine reaches) and the share of its own
limit this host reached (:attr:`Translated.source_decode_share`): the reader sees both ends.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from xover.analysis.theory import ModelTerms, Offload, predict_point
from xover.domain.profiles import HOSTS, PROFILES, Hardware


@dataclasses.dataclass(frozen=True)
class Setup:
    """A named consumer machine: a GPU profile and a host class."""

    key: str  # "rtx-4080+ddr4"
    gpu_profile: str
    host: str

    def hardware(self) -> Hardware:
        p = PROFILES[self.gpu_profile]
        return Hardware(name=self.key, gpu=p.gpu, cpu=HOSTS[self.host])

    def describe(self) -> str:
        hw = self.hardware()
        assert hw.gpu is not None
        g, c = hw.gpu, hw.cpu
        return (
            f"{g.name} ({g.mem_bytes / 2**30:.1f} GiB, {g.mem_bw_bytes_per_s / 1e9:.0f} GB/s; host link "
            f"{g.h2d_pinned_bytes_per_s / 1e9:.0f} GB/s pinned, {g.h2d_pageable_bytes_per_s / 1e9:.0f} GB/s pageable) "
            f"with a {c.name} ({c.mem_bw_bytes_per_s / 1e9:.0f} GB/s, {c.flops_per_s / 1e12:.1f} TFLOP/s)"
        )


# The desktops people run --n-cpu-moe on: 16 GB cards (RTX 4080 on PCIe 4 with DDR4, RTX 5080 on PCIe 5 with
# DDR5), 24 GB (RTX 3090 with DDR4, RTX 4090 with DDR5) and 32 GB (RTX 5090 with DDR5).
SETUPS: tuple[Setup, ...] = (
    Setup("rtx-4080+ddr4", "rtx-4080", "desktop-ddr4-12c"),
    Setup("rtx-5080+ddr5", "rtx-5080", "desktop-16c"),
    Setup("rtx-3090+ddr4", "rtx-3090", "desktop-ddr4-12c"),
    Setup("rtx-4090+ddr5", "rtx-4090", "desktop-16c"),
    Setup("rtx-5090+ddr5", "rtx-5090", "desktop-16c"),
)


def setups_for_budget(budget_bytes: int, slack_bytes: int = 1 << 30) -> tuple[Setup, ...]:
    """The setups whose card is the size the budget emulates (within ``slack_bytes``): their cards hold the
    same placement; a larger card would choose less offload, a smaller one would not load it."""
    out = []
    for s in SETUPS:
        gpu = PROFILES[s.gpu_profile].gpu
        if gpu is not None and abs(gpu.mem_bytes - budget_bytes) <= slack_bytes:
            out.append(s)
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class Ratio:
    """The theory's target-over-source ratios for one configuration at one prompt length."""

    ttft: float  # predicted TTFT on the target / on the source
    decode: float  # predicted decode t/s on the target / on the source
    source_decode_limit_tps: float  # the theory's decode bound on the source (datasheet and bandwidth ceilings)
    target_decode_limit_tps: float  # the same on the target


def ratio(terms: ModelTerms, source: Hardware, target: Hardware, config: Offload, length: int) -> Ratio:
    src = predict_point(terms, source, config, length)
    tgt = predict_point(terms, target, config, length)
    return Ratio(
        ttft=tgt.ttft_s / src.ttft_s,
        decode=tgt.decode_tps / src.decode_tps,
        source_decode_limit_tps=src.limit_decode_tps,
        target_decode_limit_tps=tgt.limit_decode_tps,
    )


@dataclasses.dataclass(frozen=True)
class Translated:
    """One measured point and its prediction on a target machine."""

    length: int
    measured_ttft_s: float
    measured_decode_tps: float
    ttft_s: float  # predicted on the target
    decode_tps: float  # predicted on the target
    response: int
    decode_limit_tps: float  # the target's decode bound for the same placement: an upper end, never reached
    source_decode_share: float  # the measured decode as a share of this host's own bound

    @property
    def limit_total_s(self) -> float:
        """The total per turn with the predicted TTFT and decode at the target's limit."""
        return self.ttft_s + self.response / self.decode_limit_tps

    @property
    def measured_total_s(self) -> float:
        return self.measured_ttft_s + self.response / self.measured_decode_tps

    @property
    def total_s(self) -> float:
        return self.ttft_s + self.response / self.decode_tps


def translate(
    terms: ModelTerms,
    source: Hardware,
    target: Hardware,
    config: Offload,
    measured: Sequence[tuple[int, float, float]],
    response: int,
) -> tuple[Translated, ...]:
    """``measured``: (prompt length, median TTFT s, median decode t/s) on ``source``; each carried to ``target``."""
    out = []
    for length, ttft_s, decode_tps in measured:
        r = ratio(terms, source, target, config, length)
        out.append(
            Translated(
                length,
                ttft_s,
                decode_tps,
                ttft_s * r.ttft,
                decode_tps * r.decode,
                response,
                r.target_decode_limit_tps,
                decode_tps / r.source_decode_limit_tps,
            )
        )
    return tuple(out)


def setup_assumptions(source: Hardware) -> list[str]:
    """What a translated number assumes, in sentences for the report."""
    g = source.gpu
    link = (
        f"{g.h2d_pinned_bytes_per_s / 1e9:.1f} GB/s pinned and {g.h2d_pageable_bytes_per_s / 1e9:.1f} GB/s pageable"
        if g is not None
        else "none"
    )
    return [
        "each measured value is scaled by the theory's ratio between the target and this host for the same "
        "configuration and prompt length; what the theory leaves out is assumed to scale alike",
        f"this host as the theory saw it: {source.cpu.name} ({source.cpu.mem_bw_bytes_per_s / 1e9:.0f} GB/s, "
        f"{source.cpu.flops_per_s / 1e12:.1f} TFLOP/s), host-to-device {link}",
        "the same placement (--n-cpu-moe), ubatch and load mode on the target, the same llama.cpp build; the "
        "target's figures are datasheet peaks and round figures for its host class, not measurements",
    ]
