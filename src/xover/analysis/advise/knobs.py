"""advise's knobs: the llama.cpp settings the search varies, a setting (the knobs that differ from llama.cpp's
defaults) and the configuration that runs it. Pure."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from xover.domain.study_spec import LlamaConfig
from xover.errors import XoverError

LLAMA_DEFAULT_BATCH = 2048  # -b
LLAMA_DEFAULT_UBATCH = 512  # -ub

# (knob name, value): the knobs that differ from llama.cpp's defaults, in the knob list's order.
Setting = tuple[tuple[str, str], ...]
DEFAULTS: Setting = ()
RECHECK: Setting = (("recheck", "1"),)
"""llama.cpp's defaults measured a second time, after every knob: the drift between the two is noise the
spread within one llama-bench process cannot show (load that changed in the minutes between). Run with
``XOVER_RECHECK=1`` in the environment, which llama.cpp ignores, so the store keeps it apart from the first."""
RECHECK_ENV = "XOVER_RECHECK"


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


def knob_named(knobs: Sequence[Knob], name: str) -> Knob | None:
    return next((k for k in knobs if k.name == name), None)


def normalize(knobs: Sequence[Knob], values: Mapping[str, str]) -> Setting:
    """A setting in knob order, defaults left out. llama.cpp runs ubatches of ``min(-ub, -b)``, so a
    ubatch above the batch size raises the batch with it."""
    values = {k: v for k, v in values.items() if (knob := knob_named(knobs, k)) is not None and v != knob.default}
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
