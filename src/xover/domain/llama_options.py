"""The llama.cpp options xover passes, sweeps or searches, each defined once. Pure.

One :class:`LlamaOption` per option: its spellings in ``llama-bench`` and ``llama-server`` (the first of
each is the one xover passes; the others are what llama.cpp also accepts, so a flag a user wrote can be
recognised), its value type, llama.cpp's default, the ``llama-bench`` JSONL field that echoes it, what it
can change, and the values ``xover advise`` and the study's tuning stage try by default. The study spec
(:mod:`xover.domain.study_spec`), ``xover ttft``, advise's knobs, the theory's reading of flags and
llama-bench's record check all read this table: adding a knob is one entry here (plus its tests).

Spellings are those of the pinned llama.cpp tree (``tools/llama-bench/llama-bench.cpp``'s argument
parser and ``common/arg.cpp``, which llama-server uses). An environment variable read by ggml is an
option too (``env=True``): its name is its only spelling, for both tools.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Literal

from xover.domain.records import BenchConfig, ServerConfig

Kind = Literal["int", "choice", "str", "switch", "list"]
"""``int``: a count; ``choice``: one of :attr:`LlamaOption.choices`; ``str``: free text (a ggml type name);
``switch``: on or off, ``"1"``/``"0"`` in llama-bench's value form and a bare flag for llama-server; ``list``:
several items passed as one comma-separated value (a TOML list in the study spec)."""

CPUS_HALF = "{cpus/2}"
"""A search value resolved per machine: half the logical CPUs (at least 1)."""
CPUS = "{cpus}"
"""A search value resolved per machine: every logical CPU."""


@dataclasses.dataclass(frozen=True)
class LlamaOption:
    """One llama.cpp option.

    ``name`` is llama.cpp's long option name without dashes (the study spec's ``[[config]]`` key and advise's
    knob name), or the variable's name for an environment option. ``bench``/``server``: the spellings each tool
    accepts, the one xover passes first; empty when that tool does not take it. For a switch, ``server`` turns
    it on and ``server_off`` off (llama-bench takes ``-nopo 0|1``). ``default`` is llama.cpp's, as it documents
    it (``auto`` where llama.cpp decides at run time). ``record_field`` is llama-bench's JSONL field reporting
    the value in effect; ``record_values`` maps a value to what that field reports when it is not the value
    itself (``-fa on`` -> ``1``). ``checked``: xover checks every llama-bench record against the configuration's
    value of this option. ``memory``/``speed``: whether it can change llama.cpp's memory use (model, KV or
    compute buffers, pinned host memory) and its speed. ``gpu_only``: it changes only how weights reach a GPU,
    so a CPU-only build shows no effect. ``search``: the values ``xover advise`` tries by default (empty: not
    searched); ``tune_search``: the study's tuning stage's when they differ (``()``: not searched there).
    """

    name: str
    short: str  # the name labels use: ``ncmoe``, ``ub``; an environment option's own name
    kind: Kind
    default: str
    bench: tuple[str, ...] = ()
    server: tuple[str, ...] = ()
    server_off: tuple[str, ...] = ()
    choices: tuple[str, ...] = ()
    env: bool = False
    record_field: str | None = None
    record_values: tuple[tuple[str, int], ...] = ()
    checked: bool = False
    memory: bool = False
    speed: bool = True
    gpu_only: bool = False
    search: tuple[str, ...] = ()
    tune_search: tuple[str, ...] | None = None
    # A list's separator in llama-bench where it differs from llama-server's ",": llama-bench sweeps over ","
    # (``-ot a=CPU;b=CPU,c=CPU`` is two settings), so one setting's overrides are joined by ";" there.
    bench_list_sep: str = ","

    @property
    def bench_flag(self) -> str | None:
        """What xover passes llama-bench (an environment option: its name), or None."""
        return self.name if self.env else (self.bench[0] if self.bench else None)

    @property
    def server_flag(self) -> str | None:
        """What xover passes llama-server (a switch: the flag that turns it on), or None."""
        return self.name if self.env else (self.server[0] if self.server else None)

    @property
    def shared_flag(self) -> str | None:
        """The flag both tools take with the same value (``-ub 2048``), or None (a switch, an environment option)."""
        flag = self.bench_flag
        return flag if not self.env and self.kind != "switch" and flag is not None and flag in self.server else None

    @property
    def spellings(self) -> tuple[str, ...]:
        """Every spelling that sets it (a switch: that turns it on), in either tool."""
        return tuple(dict.fromkeys((*self.bench, *self.server)))

    @property
    def tuned_values(self) -> tuple[str, ...]:
        """The values the study's tuning stage tries by default."""
        return self.search if self.tune_search is None else self.tune_search

    def record_value(self, value: str) -> int | None:
        """What llama-bench's :attr:`record_field` reports for ``value``: an integer, or None when the field is
        not a number (``load_mode``, ``type_k``)."""
        mapped = dict(self.record_values)
        if value in mapped:
            return mapped[value]
        return int(value) if self.kind in ("int", "switch") else None

    def bench_value(self, value: str) -> str:
        """``value`` as given to llama-server (a list: comma-separated) in llama-bench's form."""
        return value.replace(",", self.bench_list_sep) if self.kind == "list" else value

    def server_value(self, value: str) -> str:
        """``value`` in llama-bench's form as llama-server takes it (the inverse of :meth:`bench_value`)."""
        return value.replace(self.bench_list_sep, ",") if self.kind == "list" else value

    def server_args(self, value: str) -> tuple[str, ...]:
        """llama-server's arguments for ``value`` given in llama-bench's form (a switch: ``"1"`` or ``"0"``)."""
        if self.kind == "switch":
            return (self.server[0] if value == "1" else self.server_off[0],)
        assert self.server_flag is not None, f"llama-server has no {self.name}"
        return (self.server_flag, self.server_value(value))


LOAD_MODES = ("auto", "none", "mmap", "mlock", "mmap+mlock", "dio")  # llama_load_mode_name
FLASH_ATTN_MODES = ("on", "off", "auto")  # llama_flash_attn_type_name

N_CPU_MOE = LlamaOption(
    "n-cpu-moe", "ncmoe", "int", "0", bench=("-ncmoe", "--n-cpu-moe"), server=("-ncmoe", "--n-cpu-moe"),
    record_field="n_cpu_moe", checked=True, memory=True)
LOAD_MODE = LlamaOption(
    "load-mode", "lm", "choice", "auto", bench=("-lm", "--load-mode"), server=("-lm", "--load-mode"), choices=LOAD_MODES,
    record_field="load_mode", memory=True, gpu_only=True, search=("none",), tune_search=("none", "mlock"))
UBATCH_SIZE = LlamaOption(
    "ubatch-size", "ub", "int", "512", bench=("-ub", "--ubatch-size"), server=("-ub", "--ubatch-size"),
    record_field="n_ubatch", checked=True, memory=True, search=("1024", "2048", "4096"))
BATCH_SIZE = LlamaOption(
    "batch-size", "b", "int", "2048", bench=("-b", "--batch-size"), server=("-b", "--batch-size"),
    record_field="n_batch", checked=True, memory=True, search=("4096",))
NO_OP_OFFLOAD = LlamaOption(
    "no-op-offload", "nopo", "switch", "0", bench=("-nopo", "--no-op-offload"), server=("--no-op-offload",),
    server_off=("--op-offload",), record_field="no_op_offload", checked=True, gpu_only=True, search=("1",))
# Above the default ubatch: prompt ubatches of 512 stay on the CPU, larger ones are still copied.
OP_OFFLOAD_MIN_BATCH = LlamaOption(
    "GGML_OP_OFFLOAD_MIN_BATCH", "GGML_OP_OFFLOAD_MIN_BATCH", "int", "32", env=True, gpu_only=True, search=("1024",))
THREADS = LlamaOption(
    "threads", "t", "int", "auto", bench=("-t", "--threads"), server=("-t", "--threads"),
    record_field="n_threads", checked=True, search=(CPUS_HALF, CPUS))
# llama.cpp's default auto enables flash attention where the backend supports it; its record field reports -1
# for auto.
FLASH_ATTN = LlamaOption(
    "flash-attn", "fa", "choice", "auto", bench=("-fa", "--flash-attn"), server=("-fa", "--flash-attn"),
    choices=FLASH_ATTN_MODES, record_field="flash_attn", record_values=(("on", 1), ("off", 0), ("auto", -1)),
    checked=True, memory=True, tune_search=("on", "off"))
CACHE_TYPE_K = LlamaOption(
    "cache-type-k", "ctk", "str", "f16", bench=("-ctk", "--cache-type-k"), server=("-ctk", "--cache-type-k"),
    record_field="type_k", memory=True)
CACHE_TYPE_V = LlamaOption(
    "cache-type-v", "ctv", "str", "f16", bench=("-ctv", "--cache-type-v"), server=("-ctv", "--cache-type-v"),
    record_field="type_v", memory=True)
# llama-bench's default -1 and llama-server's auto both offload every layer that fits.
N_GPU_LAYERS = LlamaOption(
    "n-gpu-layers", "ngl", "int", "-1", bench=("-ngl", "--n-gpu-layers"),
    server=("-ngl", "--gpu-layers", "--n-gpu-layers"), record_field="n_gpu_layers", memory=True)
# RPC workers (ggml-rpc-server, tools/rpc; a build with -DGGML_RPC=ON): each worker's devices join the local ones
# and the offloaded layers (-ngl) are split over every device in proportion to its free memory. Both tools take
# one comma-separated list of host:port (llama-bench registers them once, it does not sweep them); llama-bench
# reports "RPC" in its ``backends`` field, not the endpoints. The spec's ``rpc-local = N`` (workers xover starts
# itself) becomes this option once they run (:mod:`xover.llamacpp.rpc`).
RPC = LlamaOption("rpc", "rpc", "list", "", bench=("--rpc", "-rpc"), server=("--rpc",), memory=True)
# Where named tensors live: ``<regex>=<buffer type>`` items, e.g. ``blk\.[0-9]\.ffn_.*_exps=RPC0[10.0.0.2:50052]``
# puts the experts of layers 0-9 on that worker's first device (a buffer type as llama.cpp names it: CPU, CUDA0,
# RPC<device>[host:port]). Both tools resolve the names while they parse their arguments, so --rpc goes first
# (:func:`in_parse_order`).
OVERRIDE_TENSOR = LlamaOption(
    "override-tensor", "ot", "list", "", bench=("-ot", "--override-tensor"), server=("-ot", "--override-tensor"),
    memory=True, bench_list_sep=";")
# The share of the offloaded layers each device gets, in llama.cpp's device order (RPC workers first, then local
# GPUs), e.g. 1/3: the worker a quarter. Default: in proportion to each device's free memory.
TENSOR_SPLIT = LlamaOption(
    "tensor-split", "ts", "str", "", bench=("-ts", "--tensor-split"), server=("-ts", "--tensor-split"), memory=True)

OPTIONS: tuple[LlamaOption, ...] = (
    N_CPU_MOE, LOAD_MODE, UBATCH_SIZE, BATCH_SIZE, NO_OP_OFFLOAD, OP_OFFLOAD_MIN_BATCH, THREADS, FLASH_ATTN,
    CACHE_TYPE_K, CACHE_TYPE_V, N_GPU_LAYERS, RPC, OVERRIDE_TENSOR, TENSOR_SPLIT,
)
"""Every option, searched ones in the order advise and the tuning stage vary them."""

BY_NAME: Mapping[str, LlamaOption] = {o.name: o for o in OPTIONS}
BY_BENCH_FLAG: Mapping[str, LlamaOption] = {o.bench_flag: o for o in OPTIONS if o.bench_flag is not None}
_BY_SPELLING: Mapping[str, LlamaOption] = {s.lstrip("-"): o for o in OPTIONS for s in o.spellings}


def by_spelling(flag: str) -> LlamaOption | None:
    """The option a flag of either tool sets (``-ncmoe``, ``--n-cpu-moe``, ``ncmoe``...), or None."""
    return _BY_SPELLING.get(flag.lstrip("-"))


def searched(cpu_count: int) -> tuple[tuple[LlamaOption, tuple[str, ...]], ...]:
    """``xover advise``'s options and values, per-machine values resolved for ``cpu_count`` logical CPUs."""
    return tuple((o, resolve(o.search, cpu_count)) for o in OPTIONS if o.search)


def tuned(cpu_count: int) -> tuple[tuple[LlamaOption, tuple[str, ...]], ...]:
    """The tuning stage's options and values, as :func:`searched`."""
    return tuple((o, resolve(o.tuned_values, cpu_count)) for o in OPTIONS if o.tuned_values)


def resolve(values: Sequence[str], cpu_count: int) -> tuple[str, ...]:
    """Search values with :data:`CPUS_HALF` and :data:`CPUS` replaced by numbers, duplicates dropped."""
    numbers = {CPUS_HALF: str(max(1, cpu_count // 2)), CPUS: str(cpu_count)}
    return tuple(dict.fromkeys(numbers.get(v, v) for v in values))


def in_parse_order(flags: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """``(flag, value)`` pairs in an order both tools can parse: the RPC workers (``--rpc``) first, since both
    resolve ``-ot``'s buffer types while they parse their arguments, among the devices registered so far; the
    rest in their own order."""
    return sorted(flags, key=lambda f: f[0] != RPC.bench_flag)


def server_args(fields: Iterable[tuple[str, str]]) -> tuple[str, ...]:
    """llama-bench ``(flag, value)`` fields as llama-server arguments, in parse order (``-nopo 1`` ->
    ``--no-op-offload``)."""
    out: list[str] = []
    for flag, value in in_parse_order(fields):
        out += BY_BENCH_FLAG[flag].server_args(value)
    return tuple(out)


def server_config(config: BenchConfig) -> ServerConfig:
    """A knob combination written for llama-bench (``xover bench``'s and ``xover ttft``'s sweeps are labelled alike)
    as the llama-server configuration with the same settings: flags translated, environment kept."""
    assert not config.extra_args, "llama-bench pass-through arguments are not llama-server's"
    return ServerConfig(label=config.label, args=server_args(config.fields), env=config.env)


def server_identity(config: ServerConfig) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """What makes two stored llama-server configurations the same server wherever their study lives: the
    arguments with the model's path cut to its file name (a preset's model is linked into the study's own
    directory; the model itself is told apart by its key) and only the last ``-ngl`` (llama-server takes the last
    value; xover once passed its own ``-ngl 99`` before a configuration's), and the environment. The key keeps
    the arguments as they were."""
    ngl = set(BY_NAME["n-gpu-layers"].server)
    args = list(config.args)
    last_ngl = max((i for i, a in enumerate(args[:-1]) if a in ngl), default=-1)
    out: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if i + 1 < len(args) and a in ("-m", "--model"):
            out += [a, args[i + 1].replace("\\", "/").rsplit("/", 1)[-1]]
        elif i + 1 < len(args) and a in ngl:
            if i == last_ngl:
                out += [a, args[i + 1]]
        else:
            out.append(a)
            i += 1
            continue
        i += 2
    return tuple(out), config.env


def take(args: Sequence[str], options: Iterable[LlamaOption]) -> tuple[dict[str, str], tuple[str, ...]]:
    """The values ``args`` (llama-server arguments, each flag followed by its value) give ``options``, by
    option name, and the other arguments in their order."""
    wanted = {s: o for o in options for s in o.server}
    values: dict[str, str] = {}
    rest: list[str] = []
    i = 0
    while i < len(args):
        option = wanted.get(args[i])
        if option is not None and i + 1 < len(args):
            values[option.name] = args[i + 1]
            i += 2
        else:
            rest.append(args[i])
            i += 1
    return values, tuple(rest)
