"""Shrink the prefill penalty: find the llama.cpp settings with the lowest expected time per turn,
with few measurements. Pure: measurements arrive through an injected ``measure(setting)``;
:mod:`xover.measure.advise` does the I/O.

**Objective.** A workload is a distribution of turns (prompt ``L`` tokens, response ``R`` tokens,
weight ``w``). The expected time per turn is ``sum w (TTFT(L) + R / decode_tps(L)) / sum w``, the
total of :mod:`xover.analysis.crossover` averaged over the workload.

**The cheap measurement (llama-bench).** Each configuration runs ``pp{P} @ dN`` (P new prompt tokens
on top of N cached ones) and ``tg{T} @ dN`` at the depths ``0`` and the workload's representative
lengths. From them:

* ``TTFT(L) ~ integral from 0 to L of s(x) dx``, where ``s(x)`` is the prefill time per token at depth
  x. The test at depth N gives ``s = 1 / pp_tps`` at ``x = N + P/2`` (the middle of its chunk);
  ``s`` is linear between those points (attention makes the cost per token grow linearly with
  depth), constant before the first, and continues the last segment's slope after the last (flat if
  that slope is negative: noise). The approximation: a cold prompt is prefilled chunk by chunk, each
  chunk costing what a P-token llama-bench test costs at its depth. It leaves out the prompt's last,
  partial ubatch (fewer tokens per expert copy), tokenization and HTTP; the server confirmation
  (``xover advise --confirm``) measures the real TTFT of the winner against the defaults.
* ``decode_tps(L)``: time per token interpolated linearly in depth between the ``tg`` tests.

**The search.** One knob at a time from llama.cpp's defaults (coordinate search):

1. measure the defaults;
2. for each knob, measure each candidate value with every other knob at its default; a candidate that
   llama.cpp would run as its default anyway (the value the defaults' own llama-bench record reports,
   e.g. the default thread count) is skipped;
3. measure the defaults again (:data:`RECHECK`): the drift between the two measurements is load that
   changed while the search ran, and it joins the noise band;
4. per knob, keep the best value when it beats the defaults by more than the noise, else the default;
5. measure the kept values together when they change two knobs or more (one knob: already measured);
6. recommend the measured configuration with the lowest expected time per turn, or the defaults when
   that one is within noise of them.

Measurements: ``2 + candidates (less those skipped) + (1 if two or more knobs were kept)`` (the last
one only when the kept values together differ from every configuration already measured).

**Noise.** Each configuration's objective is computed once per repetition (the i-th sample of every
test) and once from the tests' medians. Its spread is ``max - min`` of the per-repetition values. Two
configurations differ beyond noise when ``|difference| > max(spread_a, spread_b, drift)``, the drift being
``|defaults again - defaults|``; a knob has *no effect on this hardware* when every value tried is within
noise of the defaults. With one repetition the spread is 0: use two or more.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import re
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from xover.analysis import theory
from xover.analysis.crossover import ConfigData, PairResult, compare_pair, format_tokens
from xover.domain.study_spec import LlamaConfig
from xover.errors import XoverError
from xover.hardware.profiles import without_gpu

if TYPE_CHECKING:
    from xover.analysis.theory import ModelTerms, OffloadConfig
    from xover.hardware.profiles import Hardware

SCHEMA = "xover.advise/1"
ARTIFACT = "advise"
LLAMA_DEFAULT_BATCH = 2048  # -b
LLAMA_DEFAULT_UBATCH = 512  # -ub
AGENTIC_LENGTHS = (10_240, 20_480, 30_720, 40_960)  # the agentic band, 10K-40K (K = 1024)
REPRESENTATIVE_POINTS = 4  # measured depths besides 0
THEORY_NO_EFFECT = 0.005  # a predicted change below 0.5 % counts as none

# (knob name, value): the knobs that differ from llama.cpp's defaults, in the knob list's order.
Setting = tuple[tuple[str, str], ...]
DEFAULTS: Setting = ()
RECHECK: Setting = (("recheck", "1"),)
"""llama.cpp's defaults measured a second time, after every knob: the drift between the two is noise the
spread within one llama-bench process cannot show (load that changed in the minutes between). Run with
``XOVER_RECHECK=1`` in the environment, which llama.cpp ignores, so the store keeps it apart from the first."""
RECHECK_ENV = "XOVER_RECHECK"


# ---- the knobs ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Knob:
    """One llama.cpp setting the search varies, in llama.cpp's own names.

    ``flag`` is what llama-bench and llama-server both take (``-lm``, ``-ub``, ``-b``, ``-t``), ``-nopo``
    for op offload (llama-server: ``--no-op-offload``), or the variable's name for an environment knob.
    ``default`` is llama.cpp's, as it documents it; the default is never passed. ``record_field`` is the
    llama-bench JSONL field reporting the value in effect. ``gpu_only``: it changes only how weights
    reach a GPU, so a CPU-only build should show no effect.
    """

    name: str
    flag: str
    default: str
    candidates: tuple[str, ...]
    record_field: str | None = None
    gpu_only: bool = False
    env: bool = False

    @property
    def short(self) -> str:
        """The name labels use, like ``xover bench``'s: ``lm``, ``ub``, ``GGML_OP_OFFLOAD_MIN_BATCH``."""
        return self.flag.lstrip("-")


def default_knobs(cpu_count: int) -> tuple[Knob, ...]:
    """The knobs and candidate values searched unless told otherwise. ``cpu_count``: logical CPUs here."""
    threads = tuple(dict.fromkeys(str(t) for t in (max(1, cpu_count // 2), cpu_count)))
    return (
        Knob("load-mode", "-lm", "auto", ("none",), "load_mode", gpu_only=True),
        Knob("ubatch-size", "-ub", str(LLAMA_DEFAULT_UBATCH), ("1024", "2048", "4096"), "n_ubatch"),
        Knob("batch-size", "-b", str(LLAMA_DEFAULT_BATCH), ("4096",), "n_batch"),
        Knob("no-op-offload", "-nopo", "0", ("1",), "no_op_offload", gpu_only=True),
        # Above the default ubatch: prompt ubatches of 512 stay on the CPU, larger ones are still copied.
        Knob("GGML_OP_OFFLOAD_MIN_BATCH", "GGML_OP_OFFLOAD_MIN_BATCH", "32", ("1024",), gpu_only=True, env=True),
        Knob("threads", "-t", "auto", threads, "n_threads"),
    )


FLASH_ATTN = Knob("flash-attn", "-fa", "auto", ("on", "off"), None)
"""Flash attention (llama-bench and llama-server ``-fa on|off|auto``; llama.cpp's default ``auto`` enables it
where the backend supports it). Its record field (``flash_attn``) reports -1 for auto, so no value is skipped."""


def study_knobs(cpu_count: int, gpu_build: bool, longest: int) -> tuple[Knob, ...]:
    """The knobs ``xover study``'s tuning stage searches: advise's, plus ``-lm mlock`` (``-lm mmap`` is what
    ``auto`` resolves to wherever the backends support mmap: llama-model.cpp), ``-ub 8192`` when the study's
    longest prompt holds two such ubatches, and flash attention. On a CPU-only build the knobs that only change
    how weights reach a GPU (op offload, its threshold, pinned host memory) are left out: there is nothing to copy."""
    knobs = []
    for k in default_knobs(cpu_count):
        if k.gpu_only and not gpu_build:
            continue
        if k.name == "load-mode":
            k = dataclasses.replace(k, candidates=("none", "mlock"))
        if k.name == "ubatch-size" and gpu_build and longest >= 2 * 8192:
            k = dataclasses.replace(k, candidates=(*k.candidates, "8192"))
        knobs.append(k)
    return (*knobs, FLASH_ATTN)


def with_candidates(knobs: Sequence[Knob], name: str, candidates: Sequence[str]) -> tuple[Knob, ...]:
    """``knobs`` with one knob's candidate values replaced."""
    if name not in {k.name for k in knobs}:
        raise XoverError(f"unknown knob {name!r}: choose one of {', '.join(k.name for k in knobs)}")
    return tuple(dataclasses.replace(k, candidates=tuple(candidates)) if k.name == name else k for k in knobs)


def _knob(knobs: Sequence[Knob], name: str) -> Knob | None:
    return next((k for k in knobs if k.name == name), None)


def normalize(knobs: Sequence[Knob], values: Mapping[str, str]) -> Setting:
    """A setting in knob order, defaults left out. llama.cpp runs ubatches of ``min(-ub, -b)``, so a
    ubatch above the batch size raises the batch with it."""
    values = {k: v for k, v in values.items() if (knob := _knob(knobs, k)) is not None and v != knob.default}
    ub, b = values.get("ubatch-size"), values.get("batch-size")
    if ub is not None and int(ub) > int(b or LLAMA_DEFAULT_BATCH):
        values["batch-size"] = ub
    order = [k.name for k in knobs] + ["batch-size"]
    return tuple((name, values[name]) for name in dict.fromkeys(order) if name in values)


def setting_label(knobs: Sequence[Knob], setting: Setting) -> str:
    """``lm=none ub=2048``; ``defaults`` for llama.cpp's defaults."""
    if setting == RECHECK:
        return "defaults (again)"
    short = {k.name: k.short for k in knobs} | {"batch-size": "b"}
    return " ".join(f"{short[n]}={v}" for n, v in setting) or "defaults"


def level_label(n_cpu_moe: int | None) -> str:
    return f"ncmoe={n_cpu_moe}" if n_cpu_moe is not None else "no --n-cpu-moe"


def llama_config(knobs: Sequence[Knob], setting: Setting, n_cpu_moe: int | None, name: str) -> LlamaConfig:
    """The configuration to run: llama-bench fields and llama-server arguments from one place."""
    flags = (("-ncmoe", str(n_cpu_moe)),) if n_cpu_moe is not None else ()
    return apply_setting(LlamaConfig(name=name, flags=flags), knobs, setting, name)


def apply_setting(base: LlamaConfig, knobs: Sequence[Knob], setting: Setting, name: str) -> LlamaConfig:
    """``base`` (a study's configuration) with a setting's knob values on top: a flag the setting names
    replaces the base's value in place, new flags follow the base's, environment variables merge."""
    flags = dict(base.flags)
    env = dict(base.env)
    no_op_offload = base.no_op_offload
    flag_of = {k.name: k for k in knobs}
    for knob_name, value in setting:
        knob = flag_of.get(knob_name)
        if knob_name == "recheck":
            env[RECHECK_ENV] = value
        elif knob is None:  # the batch size raised with the ubatch, without a batch knob
            flags["-b"] = value
        elif knob.env:
            env[knob.flag] = value
        elif knob.flag == "-nopo":
            no_op_offload = value == "1"
        else:
            flags[knob.flag] = value
    return dataclasses.replace(base, name=name, flags=tuple(flags.items()), no_op_offload=no_op_offload,
                               env=tuple(env.items()))


def server_command(config: LlamaConfig, model: str = "MODEL.gguf") -> str:
    """The llama-server command line to paste, environment first."""
    env = " ".join(f"{k}={v}" for k, v in config.env)
    return " ".join(p for p in (env, "llama-server -m", model, config.llama_server_command()) if p)


# ---- the workload ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Turn:
    length: int  # prompt tokens
    response: int  # generated tokens
    weight: float = 1.0


@dataclasses.dataclass(frozen=True)
class Workload:
    """A distribution of turns; :meth:`expected` weighs a per-turn cost over it."""

    name: str
    turns: tuple[Turn, ...]

    def __post_init__(self) -> None:
        if not self.turns:
            raise XoverError("a workload needs at least one turn: give --lengths or a --workload file with lines")
        if any(t.length < 1 or t.response < 1 or not t.weight > 0 for t in self.turns):
            raise XoverError("workload turns need a prompt and a response of at least 1 token and a positive weight")

    @property
    def lengths(self) -> tuple[int, ...]:
        return tuple(sorted({t.length for t in self.turns}))

    @property
    def mean_response(self) -> float:
        return sum(t.response * t.weight for t in self.turns) / sum(t.weight for t in self.turns)

    def representative(self, points: int = REPRESENTATIVE_POINTS) -> tuple[int, ...]:
        """The lengths to measure at: all of them when few, else weighted quantiles ending at the longest."""
        if len(self.lengths) <= points:
            return self.lengths
        turns = sorted(self.turns, key=lambda t: t.length)
        total = sum(t.weight for t in turns)
        cum = list(itertools.accumulate(t.weight for t in turns))
        picks = [next(t.length for t, c in zip(turns, cum) if c >= total * (i + 1) / points - 1e-9) for i in range(points)]
        return tuple(sorted(set(picks)))

    def depths(self, points: int = REPRESENTATIVE_POINTS) -> tuple[int, ...]:
        return (0, *self.representative(points))

    def expected(self, cost: Callable[[Turn], float]) -> float:
        return sum(cost(t) * t.weight for t in self.turns) / sum(t.weight for t in self.turns)

    def scaled(self, factor: float, unit: int = 256) -> Workload:
        """Every length times ``factor``, rounded to ``unit`` tokens (at least one unit)."""
        turns = tuple(dataclasses.replace(t, length=max(unit, round(t.length * factor / unit) * unit)) for t in self.turns)
        return Workload(self.name, turns)

    def describe(self) -> str:
        lengths = self.lengths
        shown = ", ".join(format_tokens(L) for L in lengths[:6]) + (f" ... ({len(lengths)} lengths)" if len(lengths) > 6 else "")
        uniform = len({t.weight for t in self.turns}) == 1 and len(self.turns) == len(lengths)
        resp = {t.response for t in self.turns}
        response = f"{resp.pop()}-token responses" if len(resp) == 1 else f"responses of {self.mean_response:.0f} tokens on average"
        return f"{self.name}: {'uniform over' if uniform else 'prompts of'} {shown} tokens, {response}"


def uniform_workload(lengths: Sequence[int], response: int, name: str = "lengths") -> Workload:
    return Workload(name, tuple(Turn(L, response) for L in sorted(set(lengths))))


def agentic_workload(response: int) -> Workload:
    """The default: agentic turns, prompts uniform over the 10K-40K band."""
    return uniform_workload(AGENTIC_LENGTHS, response, "agentic")


_TOKENS = re.compile(r"(\d+)\s*([kK]?)")


def _tokens(text: str, where: str) -> int:
    m = _TOKENS.fullmatch(text.strip())
    if not m:
        raise XoverError(f"{where}: {text.strip()!r} is not a token count (e.g. 4096 or 4k)")
    return int(m.group(1)) * (1024 if m.group(2) else 1)


def parse_workload(text: str, response: int, name: str) -> Workload:
    """A workload file: one turn per line, ``PROMPT_TOKENS[,RESPONSE_TOKENS[,WEIGHT]]`` (``#`` comments);
    e.g. the prompt lengths of a real session's turns. A missing response is ``response``."""
    turns = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = [p for p in re.split(r"[,\s]+", line) if p]
        where = f"{name} line {number}"
        if len(parts) > 3:
            raise XoverError(f"{where}: write PROMPT_TOKENS[,RESPONSE_TOKENS[,WEIGHT]], got {line!r}")
        length = _tokens(parts[0], where)
        resp = _tokens(parts[1], where) if len(parts) > 1 else response
        try:
            weight = float(parts[2]) if len(parts) > 2 else 1.0
        except ValueError:
            raise XoverError(f"{where}: weight {parts[2]!r} is not a number") from None
        turns.append(Turn(length, resp, weight))
    if not turns:
        raise XoverError(f"{name} has no turns: write one PROMPT_TOKENS[,RESPONSE_TOKENS[,WEIGHT]] per line")
    return Workload(name, tuple(turns))


def measurement_seconds(depths: Sequence[int], chunk: int, n_gen: int, repetitions: int, pp_tps: float,
                        tg_tps: float) -> float:
    """Rough wall time of one measurement from a shallow probe's speeds: both tests at a depth prefill
    it once (counted at half the probe's speed: attention slows deep prefill), warm up, then repeat."""
    return sum(2 * 2 * d / pp_tps + (repetitions + 1) * (chunk / pp_tps + n_gen / tg_tps) for d in depths)


def fit_to_budget(workload: Workload, seconds: Callable[[Workload], float], budget_s: float,
                  min_length: int) -> tuple[Workload, float]:
    """The workload halved until one measurement fits ``budget_s`` (or its shortest prompt would fall
    below ``min_length``), and the factor applied."""
    factor, scaled = 1.0, workload
    while seconds(scaled) > budget_s and min(scaled.lengths) / 2 >= min_length:
        factor /= 2
        scaled = workload.scaled(factor)
    return scaled, factor


# ---- measurements and the objective ---------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RateSamples:
    """One llama-bench test: ``tokens`` new tokens at ``depth``, every repetition's tokens/s."""

    depth: int
    tokens: int
    samples_tps: tuple[float, ...]

    @property
    def median_tps(self) -> float:
        xs = sorted(self.samples_tps)
        mid = len(xs) // 2
        return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2


@dataclasses.dataclass(frozen=True)
class Measurement:
    """What one configuration measured (or why it could not be)."""

    prefill: tuple[RateSamples, ...] = ()  # pp{P} @ dN, one per depth
    decode: tuple[RateSamples, ...] = ()  # tg{T} @ dN
    effective: tuple[tuple[str, str], ...] = ()  # llama-bench record field -> value in effect (n_threads...)
    peak_rss_bytes: int | None = None
    device_bytes: int | None = None  # accelerator buffers llama.cpp logged
    failure: str | None = None
    reused: bool = False  # found in the store, not measured by this run

    @property
    def ok(self) -> bool:
        return self.failure is None and bool(self.prefill) and bool(self.decode)

    @property
    def repetitions(self) -> int:
        return min(len(r.samples_tps) for r in (*self.prefill, *self.decode)) if self.ok else 0


def _line(points: Sequence[tuple[float, float]], x: float) -> float:
    """The piecewise-linear curve through ``points`` (sorted by x) at ``x``: constant before the first
    point, the last segment's slope after the last (flat when that slope is negative)."""
    if len(points) == 1 or x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    (x0, y0), (x1, y1) = points[-2], points[-1]
    return y1 + max(0.0, (y1 - y0) / (x1 - x0)) * (x - x1)


def _integral(points: Sequence[tuple[float, float]], hi: float) -> float:
    """Exact integral of :func:`_line` from 0 to ``hi``."""
    xs = sorted({0.0, hi, *(x for x, _ in points if 0.0 < x < hi)})
    return sum((b - a) * (_line(points, a) + _line(points, b)) / 2 for a, b in itertools.pairwise(xs))


def ttft_s(prefill: Sequence[tuple[int, int, float]], length: int) -> float:
    """TTFT of a cold ``length``-token prompt from ``pp`` tests given as (depth, tokens, tok/s): the
    integral of prefill time per token over depth, placed at the middle of each test's chunk."""
    return _integral(sorted((d + n / 2, 1.0 / tps) for d, n, tps in prefill), float(length))


def decode_s_per_token(decode: Sequence[tuple[int, float]], depth: int) -> float:
    """Seconds per decoded token at ``depth``, linear in depth between ``tg`` tests."""
    return _line(sorted((float(d), 1.0 / tps) for d, tps in decode), float(depth))


@dataclasses.dataclass(frozen=True)
class Estimate:
    """A configuration's expected cost per turn over the workload, from llama-bench tests."""

    turn_s: float  # from every test's median
    ttft_s: float  # its TTFT part
    decode_s: float  # its decode part
    turn_samples_s: tuple[float, ...]  # once per repetition

    @property
    def spread_s(self) -> float:
        return max(self.turn_samples_s) - min(self.turn_samples_s) if self.turn_samples_s else 0.0


def _parts(prefill: Sequence[tuple[int, int, float]], decode: Sequence[tuple[int, float]],
           workload: Workload) -> tuple[float, float]:
    ttft = workload.expected(lambda t: ttft_s(prefill, t.length))
    dec = workload.expected(lambda t: t.response * decode_s_per_token(decode, t.length))
    return ttft, dec


def estimate(m: Measurement, workload: Workload) -> Estimate:
    if not m.ok:
        raise XoverError(f"cannot estimate a configuration that was not measured ({m.failure or 'no tests'})")
    ttft, dec = _parts([(r.depth, r.tokens, r.median_tps) for r in m.prefill],
                       [(r.depth, r.median_tps) for r in m.decode], workload)
    per_rep = []
    for i in range(m.repetitions):
        a, b = _parts([(r.depth, r.tokens, r.samples_tps[i]) for r in m.prefill],
                      [(r.depth, r.samples_tps[i]) for r in m.decode], workload)
        per_rep.append(a + b)
    return Estimate(turn_s=ttft + dec, ttft_s=ttft, decode_s=dec, turn_samples_s=tuple(per_rep))


def within_noise(a: Estimate, b: Estimate, drift_s: float | None = None) -> bool:
    """Whether two configurations' expected times differ by no more than either one's spread or the drift."""
    return abs(a.turn_s - b.turn_s) <= max(a.spread_s, b.spread_s, drift_s or 0.0)


# ---- the search -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Trial:
    setting: Setting
    label: str
    varied: str | None  # the knob this trial changes from the defaults; None: the defaults or the combination
    measurement: Measurement
    estimate: Estimate | None  # None when it could not be measured


@dataclasses.dataclass(frozen=True)
class Effect:
    """One value of a knob against the defaults."""

    value: str
    change_s: float  # time per turn minus the defaults' (negative: faster)
    noise_s: float  # the larger spread of the two

    @property
    def within_noise(self) -> bool:
        return abs(self.change_s) <= self.noise_s


@dataclasses.dataclass(frozen=True)
class KnobVerdict:
    knob: str
    kept: str | None  # the value kept; None: llama.cpp's default
    effects: tuple[Effect, ...]  # every value measured
    skipped: tuple[str, ...]  # not measured: llama.cpp runs them as its default
    failed: tuple[str, ...]

    @property
    def best(self) -> Effect | None:
        """The fastest value measured, kept or not."""
        return min(self.effects, key=lambda e: e.change_s) if self.effects else None

    @property
    def no_effect(self) -> bool:
        """Every value measured is within noise of the defaults (nothing measured: unknown, False)."""
        return bool(self.effects) and all(e.within_noise for e in self.effects)


@dataclasses.dataclass(frozen=True)
class Search:
    """One offload level's coordinate search."""

    n_cpu_moe: int | None
    trials: tuple[Trial, ...]
    verdicts: tuple[KnobVerdict, ...]
    combination: Setting  # the kept values together
    recommended: Setting
    drift_s: float | None = None  # |defaults again - defaults| per turn; None: not re-measured

    @property
    def label(self) -> str:
        return level_label(self.n_cpu_moe)

    @property
    def measurements(self) -> int:
        """llama-bench configurations this search needed (reused from the store included)."""
        return len(self.trials)

    @property
    def reused(self) -> int:
        return sum(1 for t in self.trials if t.measurement.reused)

    def trial(self, setting: Setting) -> Trial:
        return next(t for t in self.trials if t.setting == setting)

    @property
    def defaults(self) -> Trial:
        return self.trial(DEFAULTS)

    @property
    def best(self) -> Trial:
        return self.trial(self.recommended)

    @property
    def gain(self) -> float:
        """Defaults' time per turn over the recommendation's (2.0: twice as fast)."""
        d, b = self.defaults.estimate, self.best.estimate
        assert d is not None and b is not None
        return d.turn_s / b.turn_s


def coordinate_search(knobs: Sequence[Knob], measure: Callable[[Setting], Measurement], workload: Workload,
                      n_cpu_moe: int | None = None, recheck: bool = True) -> Search:
    """The search of the module docstring; ``measure`` runs one configuration. With ``recheck`` the
    defaults are measured again after every knob (:data:`RECHECK`) and the drift between the two
    widens the noise band of every decision."""
    trials: dict[Setting, Trial] = {}

    def run(setting: Setting, varied: str | None) -> Trial:
        if setting not in trials:
            m = measure(setting)
            trials[setting] = Trial(setting, setting_label(knobs, setting), varied, m, estimate(m, workload) if m.ok else None)
        return trials[setting]

    base = run(DEFAULTS, None)
    if base.estimate is None:
        raise XoverError(f"llama.cpp's defaults could not be measured at {level_label(n_cpu_moe)} "
                         f"({base.measurement.failure}): fix that first, e.g. with a larger --ncmoe")
    b = base.estimate
    effective = dict(base.measurement.effective)
    tried: list[tuple[Knob, tuple[str, ...], list[tuple[str, Estimate]], list[str]]] = []
    for knob in knobs:
        in_effect = effective.get(knob.record_field) if knob.record_field else None
        values = [v for v in dict.fromkeys(knob.candidates) if v != knob.default]
        skipped = tuple(v for v in values if v == in_effect)
        measured, failed = [], []
        for value in (v for v in values if v not in skipped):
            e = run(normalize(knobs, {knob.name: value}), knob.name).estimate
            if e is None:
                failed.append(value)
            else:
                measured.append((value, e))
        tried.append((knob, skipped, measured, failed))
    drift = None
    if recheck:
        again = run(RECHECK, None).estimate
        drift = abs(again.turn_s - b.turn_s) if again is not None else None
    floor = drift or 0.0
    verdicts, kept = [], {}
    for knob, skipped, measured, failed in tried:
        effects = [Effect(value, e.turn_s - b.turn_s, max(e.spread_s, b.spread_s, floor)) for value, e in measured]
        best = min(effects, key=lambda e: e.change_s) if effects else None
        if best is not None and best.change_s < 0 and not best.within_noise:
            kept[knob.name] = best.value
        verdicts.append(KnobVerdict(knob.name, kept.get(knob.name), tuple(effects), skipped, tuple(failed)))
    combination = normalize(knobs, kept)
    run(combination, None)  # already measured unless two or more knobs were kept
    measured_trials = [t for t in trials.values() if t.estimate is not None and t.setting != RECHECK]
    best_trial = min(measured_trials, key=lambda t: t.estimate.turn_s)  # type: ignore[union-attr]
    assert best_trial.estimate is not None
    e = best_trial.estimate
    noise = max(e.spread_s, b.spread_s, floor)
    recommended = DEFAULTS if abs(e.turn_s - b.turn_s) <= noise else best_trial.setting
    return Search(n_cpu_moe, tuple(trials.values()), tuple(verdicts), combination, recommended, drift)


# ---- the theory's expectation ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Expectation:
    """What the theory expects of one trial against the defaults at the same offload level."""

    n_cpu_moe: int | None
    setting: Setting
    change: float | None  # predicted time per turn / defaults'; None: the theory does not model it
    note: str


def _mb(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def expectations(terms: ModelTerms, hw: Hardware, knobs: Sequence[Knob], search: Search, workload: Workload,
                 gpu_build: bool) -> tuple[Expectation, ...]:
    """The theory's expected change for each trial of a search (:mod:`xover.analysis.theory` with the
    :mod:`xover.hardware.profiles` profile ``hw``; ``gpu_build`` False: a CPU-only llama.cpp build)."""
    if not gpu_build and hw.gpu is not None:
        hw = without_gpu(hw, "llama.cpp build without a GPU backend")
    n = search.n_cpu_moe or 0

    def offload(setting: Setting) -> OffloadConfig:
        config = llama_config(knobs, setting, n, "theory")
        cfg = theory.config_from_flags(config.bench_config().fields, config.env)
        batch = int(dict(setting).get("batch-size", LLAMA_DEFAULT_BATCH))
        return dataclasses.replace(cfg, ubatch=min(cfg.ubatch, batch))

    def turn_s(setting: Setting) -> float:
        cfg = offload(setting)

        def one(t: Turn) -> float:
            p = theory.predict_point(terms, hw, cfg, t.length, t.response)
            return p.ttft_s + t.response / p.decode_tps

        return workload.expected(one)

    base_cfg, base_s = offload(DEFAULTS), turn_s(DEFAULTS)
    out = []
    for trial in search.trials:
        if trial.setting in (DEFAULTS, RECHECK):
            continue
        cfg = offload(trial.setting)
        names = [name for name, _ in trial.setting]
        modelled = "threads" not in names
        change = turn_s(trial.setting) / base_s if modelled else None
        notes = [_knob_note(terms, hw, n, base_cfg, cfg, name, value, knobs) for name, value in trial.setting
                 if not (name == "batch-size" and "ubatch-size" in names)]
        out.append(Expectation(search.n_cpu_moe, trial.setting, change, "; ".join(notes)))
    return tuple(out)


def _knob_note(terms: ModelTerms, hw: Hardware, n: int, base: OffloadConfig, cfg: OffloadConfig, name: str, value: str,
               knobs: Sequence[Knob]) -> str:
    knob = _knob(knobs, name)
    if name == "threads":
        return f"threads not modelled: the theory assumes all {hw.cpu.cores} cores"
    if knob is not None and knob.gpu_only and hw.gpu is None:
        return f"{knob.short}={value}: no effect expected on a CPU-only build (nothing is copied to a GPU)"
    gpu = hw.gpu
    copies = gpu is not None and n > 0
    if name == "ubatch-size":
        ub = cfg.ubatch
        pad = ""
        if gpu is not None and terms.n_expert and theory.pads_expert_tiles(gpu.name):
            pad = (f"; GPU expert matmuls pad to {theory.expert_tile_padding(ub, terms.n_expert, terms.n_expert_used):.2f}x "
                   f"their work vs {theory.expert_tile_padding(base.ubatch, terms.n_expert, terms.n_expert_used):.2f}x "
                   "(MMQ tiles)")
        if not copies:
            cover = theory.coverage(ub, terms.n_expert, terms.n_expert_used)
            return f"ub={ub}: weights read once per {ub} tokens (experts {cover:.0%} covered) vs {base.ubatch}{pad}"
        per_tok = theory.expert_transfer_bytes(terms, n, ub) / ub
        base_tok = theory.expert_transfer_bytes(terms, n, base.ubatch) / base.ubatch
        return (f"ub={ub}: op offload copies {_mb(per_tok * 1e3)} of CPU-resident experts per 1K prompt tokens vs "
                f"{_mb(base_tok * 1e3)} at {base.ubatch}{pad}")
    if name == "batch-size":
        return (f"b={value}: caps the ubatch at {value}" if int(value) < base.ubatch
                else f"b={value}: no effect expected (ubatches stay {cfg.ubatch} tokens; the batch only caps them)")
    if gpu is None or n == 0:
        return f"{knob.short if knob else name}={value}: no effect expected: no experts in host memory at --n-cpu-moe {n}"
    moved = theory.expert_transfer_bytes(terms, n, cfg.ubatch)
    if name == "load-mode":
        if value != "none":
            return f"lm={value}: mmapped (pageable) weights, as the default"
        return (f"lm=none: {_mb(moved)} per {cfg.ubatch}-token ubatch from pinned memory at {gpu.h2d_pinned_bytes_per_s / 1e9:.1f} GB/s: "
                f"{moved / gpu.h2d_pinned_bytes_per_s * 1e3:.0f} ms vs {moved / gpu.h2d_pageable_bytes_per_s * 1e3:.0f} ms "
                f"pageable at {gpu.h2d_pageable_bytes_per_s / 1e9:.1f} GB/s")
    if name == "no-op-offload":
        if value != "1":
            return "nopo=0: op offload on, as the default"
        flops = 2.0 * cfg.ubatch * terms.active_fraction * sum(terms.expert_params_layer[:n])
        cpu_s = max(flops / hw.cpu.flops_per_s, moved / hw.cpu.mem_bw_bytes_per_s)
        rate = gpu.h2d_pinned_bytes_per_s if base.pinned else gpu.h2d_pageable_bytes_per_s
        return (f"nopo=1: CPU-resident experts of each {cfg.ubatch}-token ubatch computed on the CPU, "
                f"{cpu_s * 1e3:.0f} ms vs copying {_mb(moved)} in {moved / rate * 1e3:.0f} ms; decode unchanged")
    if name == "GGML_OP_OFFLOAD_MIN_BATCH":
        threshold = int(value)
        if cfg.ubatch < threshold:
            return f"GGML_OP_OFFLOAD_MIN_BATCH={threshold}: {cfg.ubatch}-token ubatches stay on the CPU, like nopo=1"
        return f"GGML_OP_OFFLOAD_MIN_BATCH={threshold}: {cfg.ubatch}-token ubatches are still copied: no change expected"
    return f"{name}={value}: not modelled"


# ---- the crossover, revisited ---------------------------------------------------------------------


def config_data(label: str, m: Measurement, lengths: Sequence[int]) -> ConfigData:
    """A measurement as :mod:`xover.analysis.crossover` input: TTFT samples (one per repetition, from
    the prefill integral) at ``lengths``, decode samples at the measured depths."""
    ttft = {L: [ttft_s([(r.depth, r.tokens, r.samples_tps[i]) for r in m.prefill], L) for i in range(m.repetitions)]
            for L in lengths}
    return ConfigData(label, ttft, {r.depth: list(r.samples_tps) for r in m.decode})


@dataclasses.dataclass(frozen=True)
class RevisitedPair:
    a: str
    b: str
    at_defaults: PairResult
    with_knobs: PairResult  # each level with its own recommended settings


def revisit_crossovers(levels: Sequence[tuple[str, Measurement, Measurement]], lengths: Sequence[int],
                       response: int, n_boot: int = 200) -> tuple[RevisitedPair, ...]:
    """Each pair of offload levels' crossover at llama.cpp's defaults and with the recommended settings.
    ``levels``: (label, defaults' measurement, recommended's measurement)."""
    out = []
    for (la, da, ra), (lb, db, rb) in itertools.combinations(levels, 2):
        out.append(RevisitedPair(
            la, lb,
            compare_pair(config_data(la, da, lengths), config_data(lb, db, lengths), response, n_boot=n_boot),
            compare_pair(config_data(la, ra, lengths), config_data(lb, rb, lengths), response, n_boot=n_boot),
        ))
    return tuple(out)


# ---- server confirmation --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ServerPoint:
    """Cold llama-server medians at one prompt length."""

    length: int
    ttft_s: float
    decode_tps: float


@dataclasses.dataclass(frozen=True)
class Confirmation:
    """The recommendation against the defaults through llama-server, cold TTFT and decode."""

    n_cpu_moe: int | None
    defaults: tuple[ServerPoint, ...]
    recommended: tuple[ServerPoint, ...]
    defaults_turn_s: float
    recommended_turn_s: float
    repetitions: int

    @property
    def gain(self) -> float:
        return self.defaults_turn_s / self.recommended_turn_s


def server_turn_s(points: Sequence[ServerPoint], workload: Workload) -> float:
    """Expected time per turn from server medians: TTFT linear in L through 0 and the measured lengths,
    decode time per token linear in L (both extended as :func:`_line` does)."""
    ttft = [(0.0, 0.0), *sorted((float(p.length), p.ttft_s) for p in points)]
    spt = sorted((float(p.length), 1.0 / p.decode_tps) for p in points)
    return workload.expected(lambda t: _line(ttft, t.length) + t.response * _line(spt, t.length))


def confirmation(n_cpu_moe: int | None, defaults: Sequence[ServerPoint], recommended: Sequence[ServerPoint],
                 workload: Workload, repetitions: int) -> Confirmation:
    return Confirmation(n_cpu_moe, tuple(defaults), tuple(recommended), server_turn_s(defaults, workload),
                        server_turn_s(recommended, workload), repetitions)


# ---- the advice -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Advice:
    """Everything ``xover advise`` found, stored as artifact ``advise`` and rendered by
    :mod:`xover.report.advise`."""

    model: str
    backend: str  # llama.cpp's backends as llama-bench reports them: CPU, CUDA...
    hardware: str
    workload: Workload
    workload_note: str  # how the workload was chosen (scaled, from a file...)
    chunk: int  # P of pp{P}
    n_gen: int  # T of tg{T}
    repetitions: int
    knobs: tuple[Knob, ...]
    searches: tuple[Search, ...]
    expectations: tuple[Expectation, ...]
    crossovers: tuple[RevisitedPair, ...]
    confirmation: Confirmation | None
    schema: str = SCHEMA

    @property
    def best(self) -> Search:
        """The offload level whose recommendation is fastest."""
        return min(self.searches, key=lambda s: s.best.estimate.turn_s)  # type: ignore[union-attr]

    @property
    def measurements(self) -> int:
        return sum(s.measurements for s in self.searches)

    @property
    def reused(self) -> int:
        return sum(s.reused for s in self.searches)

    def config(self, search: Search, setting: Setting) -> LlamaConfig:
        return llama_config(self.knobs, setting, search.n_cpu_moe, f"{search.label} {setting_label(self.knobs, setting)}")

    def command(self, model: str | None = None) -> str:
        """The recommended llama-server command line."""
        best = self.best
        return server_command(self.config(best, best.recommended), model or self.model)

    def no_effect(self, search: Search) -> tuple[str, ...]:
        return tuple(v.knob for v in search.verdicts if v.no_effect)

    def expectation(self, search: Search, setting: Setting) -> Expectation | None:
        return next((e for e in self.expectations if e.n_cpu_moe == search.n_cpu_moe and e.setting == setting), None)

    def doubts(self, search: Search) -> tuple[str, ...]:
        """Where the measurements contradict themselves or the theory: a kept value the theory expects
        to change nothing, and kept values that measure slower together than one of them alone. Both
        point at load that changed between measurements (beyond the drift the re-measured defaults
        showed) or at an interaction between knobs."""
        out = []
        for v in search.verdicts:
            if v.kept is None:
                continue
            expected = self.expectation(search, normalize(self.knobs, {v.knob: v.kept}))
            if expected is not None and expected.change is not None and abs(expected.change - 1.0) < THEORY_NO_EFFECT:
                out.append(f"{v.knob}={v.kept} was kept, but the theory expects no effect here ({expected.note}): "
                           "likely load that changed between measurements; rerun to check")
        singles = [search.trial(normalize(self.knobs, {v.knob: v.kept})) for v in search.verdicts if v.kept is not None]
        combined = search.trial(search.combination)
        if len(singles) >= 2 and combined.estimate is not None:
            best = min(singles, key=lambda t: t.estimate.turn_s if t.estimate else math.inf)
            if best.estimate is not None and combined.estimate.turn_s > best.estimate.turn_s:
                out.append(f"the kept values together ({combined.label}) measured slower than {best.label} alone: "
                           "their effects do not add up (an interaction, or load that changed between measurements)")
        return tuple(out)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def advice_from_dict(data: Mapping[str, Any]) -> Advice:
    """The inverse of :meth:`Advice.to_dict` (a stored artifact back to the records)."""
    if data.get("schema") != SCHEMA:
        raise XoverError(f"not a {SCHEMA} advise record: rerun xover advise with this version")
    advice = _decode(Advice, data)
    assert isinstance(advice, Advice)
    return advice


def _decode(tp: Any, value: Any) -> Any:
    """JSON-shaped data back into the typed frozen records it came from."""
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        fields = {f.name: _decode(hints[f.name], value[f.name]) for f in dataclasses.fields(tp) if f.name in value}
        return typing.cast(Any, tp)(**fields)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        return _decode(next(a for a in args if a is not type(None)), value)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_decode(args[0], v) for v in value)
        return tuple(_decode(a, v) for a, v in zip(args, value))
    if tp is float:
        return float(value)
    return value
