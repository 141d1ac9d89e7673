"""advise's knobs: the llama.cpp settings the search varies, a setting (the knobs that differ from llama.cpp's
defaults) and the configuration that runs it. Pure."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from xover.domain import llama_options as opts
from xover.domain.config import LlamaConfig
from xover.errors import XoverError

LLAMA_DEFAULT_BATCH = int(opts.BATCH_SIZE.default)  # -b
LLAMA_DEFAULT_UBATCH = int(opts.UBATCH_SIZE.default)  # -ub

# (knob name, value): the knobs that differ from llama.cpp's defaults, in the knob list's order.
Setting = tuple[tuple[str, str], ...]
DEFAULTS: Setting = ()
RECHECK: Setting = (("recheck", "1"),)
"""llama.cpp's defaults measured a second time, after every knob: the drift between the two is noise the
spread within one llama-bench process cannot show (load that changed in the minutes between). Run with
``XOVER_RECHECK=1`` in the environment, which llama.cpp ignores, so the store keeps it apart from the first."""
RECHECK_ENV = "XOVER_RECHECK"


def again(setting: Setting, n: int = 1) -> Setting:
    """``setting`` measured again, in a fresh llama-bench process (the recheck marker added; ``n`` 2 for a third
    process): :data:`RECHECK` is ``again(DEFAULTS)``."""
    return setting if is_again(setting) else (*setting, (RECHECK[0][0], str(n)))


def is_again(setting: Setting) -> bool:
    return any(k == RECHECK[0][0] for k, _ in setting)


def first_of(setting: Setting) -> Setting:
    """The setting a second measurement repeats (``setting`` itself when it is a first)."""
    return tuple(kv for kv in setting if kv[0] != RECHECK[0][0])


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
    record_values: tuple[tuple[str, int], ...] = ()  # value -> what the record field reports (``-fa on``: 1)

    def in_effect(self, effective: Mapping[str, str]) -> str | None:
        """The value of this knob that a run's record fields (``effective``) show in effect, in the knob's terms
        (``flash_attn`` 1: ``on``), or None where the record does not say."""
        reported = effective.get(self.record_field) if self.record_field else None
        if reported is None or not self.record_values:
            return reported
        return next((v for v, n in self.record_values if str(n) == reported), None)

    @property
    def option(self) -> opts.LlamaOption:
        """The option table's entry for this knob."""
        return opts.BY_NAME[self.name]

    @property
    def short(self) -> str:
        """The name labels use, like ``xover bench``'s: ``lm``, ``ub``, ``GGML_OP_OFFLOAD_MIN_BATCH``."""
        return self.option.short


def screenable(knob: Knob) -> bool:
    """Whether one llama-bench process can run this knob's values and tell their records apart: a flag llama-bench
    takes again as more values, whose value its records echo (an environment knob is one process's environment)."""
    option = opts.BY_NAME.get(knob.name)
    return not knob.env and knob.record_field is not None and option is not None and option.checked


def option_knob(option: opts.LlamaOption, candidates: Sequence[str]) -> Knob:
    """The knob that varies ``option`` (:mod:`xover.domain.llama_options`) over ``candidates``, with the record
    field that shows the value in effect (and how it reports a value: ``-fa on`` as ``1``), so that a candidate
    equal to it can be skipped."""
    assert option.bench_flag is not None
    return Knob(
        option.name,
        option.bench_flag,
        option.default,
        tuple(candidates),
        option.record_field,
        gpu_only=option.gpu_only,
        env=option.env,
        record_values=option.record_values,
    )


def default_knobs(cpu_count: int) -> tuple[Knob, ...]:
    """The knobs and candidate values searched unless told otherwise (the options' ``search`` values).
    ``cpu_count``: logical CPUs here (threads try half and all of them)."""
    return tuple(option_knob(option, values) for option, values in opts.searched(cpu_count))


FLASH_ATTN = option_knob(opts.FLASH_ATTN, opts.FLASH_ATTN.tuned_values)
"""Flash attention (llama-bench and llama-server ``-fa on|off|auto``; llama.cpp's default ``auto`` enables it
where the backend supports it). Its record field (``flash_attn``) reports -1 for auto; what auto ran as comes from
llama.cpp's log (:func:`xover.llamacpp.bench.resolved_setting`), and the value it ran as is not searched again."""


def study_knobs(cpu_count: int, gpu_build: bool, longest: int, engine: str = opts.ENGINE) -> tuple[Knob, ...]:
    """The knobs ``xover study``'s tuning stage searches (the options' ``tune_search`` values): advise's, plus
    ``-lm mlock`` (``-lm mmap`` is what ``auto`` resolves to wherever the backends support mmap:
    llama-model.cpp), ``-ub 8192`` when the study's longest prompt holds two such ubatches, and flash attention.
    On a CPU-only build the knobs that only change how weights reach a GPU (op offload, its threshold, pinned
    host memory) are left out: there is nothing to copy."""
    knobs = []
    for option, values in opts.tuned(cpu_count, engine):
        if option.gpu_only and not gpu_build:
            continue
        if option is opts.UBATCH_SIZE and gpu_build and longest >= 2 * 8192:
            values = (*values, "8192")
        knobs.append(option_knob(option, values))
    return tuple(knobs)


def with_candidates(knobs: Sequence[Knob], name: str, candidates: Sequence[str]) -> tuple[Knob, ...]:
    """``knobs`` with one knob's candidate values replaced."""
    if name not in {k.name for k in knobs}:
        raise XoverError(f"unknown knob {name!r}: choose one of {', '.join(k.name for k in knobs)}")
    return tuple(dataclasses.replace(k, candidates=tuple(candidates)) if k.name == name else k for k in knobs)


def with_values_to_try(knobs: Sequence[Knob], name: str, values: Sequence[str]) -> tuple[Knob, ...]:
    """``knobs`` with the values to try of option ``name``: its knob's candidates replaced, or a knob for it
    added (any option of the table can be searched)."""
    if name in {k.name for k in knobs}:
        return with_candidates(knobs, name, values)
    return (*knobs, option_knob(opts.BY_NAME[name], values))


def knob_named(knobs: Sequence[Knob], name: str) -> Knob | None:
    return next((k for k in knobs if k.name == name), None)


def _raise_batch(values: dict[str, str], batch: str | None) -> None:
    """llama.cpp runs ubatches of ``min(-ub, -b)``: a ubatch in ``values`` above ``batch`` (llama.cpp's default -b
    where None) raises -b with it."""
    ub = values.get("ubatch-size")
    if ub is not None and int(ub) > int(batch or LLAMA_DEFAULT_BATCH):
        values["batch-size"] = ub


def normalize(knobs: Sequence[Knob], values: Mapping[str, str]) -> Setting:
    """A setting in knob order, defaults left out. llama.cpp runs ubatches of ``min(-ub, -b)``, so a
    ubatch above the batch size raises the batch with it."""
    values = {k: v for k, v in values.items() if (knob := knob_named(knobs, k)) is not None and v != knob.default}
    _raise_batch(values, values.get("batch-size"))
    order = [k.name for k in knobs] + ["batch-size"]
    return tuple((name, values[name]) for name in dict.fromkeys(order) if name in values)


def pairs_label(setting: Setting) -> str:
    """``threads=2, repack=0``: a setting in its knobs' own names, where the knobs (and their short names) are not at
    hand (a stored confirmation)."""
    return ", ".join(f"{k}={v}" for k, v in setting)


def setting_label(knobs: Sequence[Knob], setting: Setting) -> str:
    """``lm=none ub=2048``; ``defaults`` for llama.cpp's defaults."""
    if is_again(setting):
        n = dict(setting)[RECHECK[0][0]]
        return f"{setting_label(knobs, first_of(setting))} (again{'' if n == '1' else ' ' + n})"
    short = {k.name: k.short for k in knobs} | {opts.BATCH_SIZE.name: opts.BATCH_SIZE.short}
    return " ".join(f"{short[n]}={v}" for n, v in setting) or "defaults"


def level_label(n_cpu_moe: int | None) -> str:
    return f"ncmoe={n_cpu_moe}" if n_cpu_moe is not None else "no --n-cpu-moe"


def llama_config(knobs: Sequence[Knob], setting: Setting, n_cpu_moe: int | None, name: str) -> LlamaConfig:
    """The configuration to run: llama-bench fields and llama-server arguments from one place."""
    settings = ((opts.N_CPU_MOE.name, str(n_cpu_moe)),) if n_cpu_moe is not None else ()
    return apply_setting(LlamaConfig(name=name, settings=settings), knobs, setting, name)


def apply_setting(base: LlamaConfig, knobs: Sequence[Knob], setting: Setting, name: str) -> LlamaConfig:
    """``base`` (a study's configuration) with a setting's knob values on top: a setting the knobs name replaces
    the base's value; the batch size raised with the ubatch is a setting too, and so is the base's own ``-b`` where
    the ubatch exceeds it (llama.cpp would run ``-b``-token ubatches); the recheck marker is an environment variable
    llama.cpp ignores."""
    values = dict(first_of(setting))
    if "batch-size" not in values and (own_b := base.get("batch-size")) is not None:
        _raise_batch(values, own_b)
    config = base.with_values(values, name=name)
    if is_again(setting):
        config = config.with_env({RECHECK_ENV: dict(setting)[RECHECK[0][0]]})
    return config


def server_command(config: LlamaConfig, model: str = "MODEL.gguf") -> str:
    """The llama-server command line to paste, environment first."""
    return config.server_command(model)
