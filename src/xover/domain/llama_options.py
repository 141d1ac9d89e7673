"""The llama.cpp option table: every option xover passes, sweeps or searches, each defined once. Pure.

One :class:`LlamaOption` per option: its spellings in ``llama-bench`` and ``llama-server`` (the first of each is
the one xover passes; the others are what llama.cpp also accepts, so a flag a user wrote can be recognised),
how a value is written for each tool (a switch is ``--no-op-offload 0|1`` for llama-bench and a bare flag, with
or without an "off" spelling, for llama-server; an environment variable is neither), its value type, llama.cpp's
default, the ``llama-bench`` JSONL field that echoes it, the engines that take it, what it can change, the values
``xover advise`` and the study's tuning stage try, and the sweep option ``xover bench`` and ``xover ttft`` give it.

Everything that translates a configuration reads this table: a configuration's argv for either tool and its
environment (:class:`xover.domain.config.LlamaConfig`), the study spec's ``[[config]]`` keys, llama-bench's record
check, the export's columns, labels, advise's and the tuning stage's knobs, the theory's reading of a
configuration, and the commands' shared sweep options. Adding a llama.cpp option is one entry in :data:`OPTIONS`
plus its tests.

Spellings are those of the pinned llama.cpp tree (``tools/llama-bench/llama-bench.cpp``'s argument parser and
``common/arg.cpp``, which llama-server uses). An environment variable read by ggml is an option too
(``env=True``): its name is its only spelling, for both tools.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal

from xover.domain import option_values
from xover.errors import XoverError

Kind = Literal["int", "choice", "str", "switch", "list"]
"""``int``: a count; ``choice``: one of :attr:`LlamaOption.choices`; ``str``: free text (a ggml type name);
``switch``: on or off, ``"1"``/``"0"``; ``list``: several items passed as one comma-separated value (a TOML list
in the study spec)."""

ENGINE = "llama.cpp"
"""The engine a configuration runs on unless it names another: mainline llama.cpp, built by ``xover llama build``."""
IK_LLAMA = "ik_llama.cpp"
"""ik_llama.cpp (ikawrakow/ik_llama.cpp): a llama.cpp fork with fused MoE, run-time repacking and offload of the
active experts only, built by ``xover llama build --engine ik_llama.cpp``."""
ENGINES: tuple[str, ...] = (ENGINE, IK_LLAMA)
"""The engines (llama.cpp builds with their own flags) a configuration may name."""


@dataclasses.dataclass(frozen=True)
class EngineTraits:
    """What an engine's tools can do beyond the options of the table. ``server_fit``: llama-server's ``--fit`` (on
    by default in mainline, so xover passes ``-fit off``); ``server_log_verbosity``: ``-lv`` (4 logs the buffers);
    ``bench_depth``: llama-bench's ``-d`` and JSONL (ik_llama.cpp's llama-bench has neither: prefill from an empty
    context, decode at a depth with ``-gp``, one JSON array). An engine whose llama-server timings lack ``cache_n``
    (ik_llama.cpp) needs no trait: :func:`xover.domain.sse.timings_from_json` derives it from the prompt's tokens
    less ``prompt_n`` wherever the field is absent. ``server_args``: flags xover always passes to the engine's
    llama-server (ik_llama.cpp's ``--log-disable``: without it every server writes a trace log, ``llama.log``, into
    the working directory; its stderr, which xover reads, is unchanged). ``pins_cpu_experts``: on a GPU build the
    experts ``-ncmoe`` (or an override to the CPU) keeps on the CPU are loaded into the GPU's pinned host buffer
    whatever the load mode, so op offload copies them at the pinned rate (ik_llama.cpp's
    ``src/llama-load-tensors.cpp`` gives them ``llama_default_buffer_type_cpu(true)``, logged ``buffer type overriden
    to CUDA_Host``; mainline maps them from the file unless ``-lm none``). ``chat_prompts``: the study's chat-shaped
    prompt can be made on its server (ik_llama.cpp's ``/detokenize`` answers HTTP 500 to tokens that end inside a
    UTF-8 character, which cutting a chat prompt to an exact length produces). The build of each engine is its entry
    in :data:`xover.llamacpp.build.ENGINE_SOURCES`."""

    name: str
    server_fit: bool = True
    server_log_verbosity: bool = True
    bench_depth: bool = True
    server_args: tuple[str, ...] = ()
    pins_cpu_experts: bool = False
    chat_prompts: bool = True


ENGINE_TRAITS: Mapping[str, EngineTraits] = {
    ENGINE: EngineTraits(ENGINE),
    IK_LLAMA: EngineTraits(
        IK_LLAMA,
        server_fit=False,
        server_log_verbosity=False,
        bench_depth=False,
        server_args=("--log-disable",),
        pins_cpu_experts=True,
        chat_prompts=False,
    ),
}


def traits(engine: str) -> EngineTraits:
    found = ENGINE_TRAITS.get(engine)
    if found is None:
        raise XoverError(f"unknown engine {engine!r}; use one of {', '.join(ENGINES)}")
    return found


@dataclasses.dataclass(frozen=True)
class BackendTraits:
    """A ggml backend a build is made for (the build's other half beside its engine; its cmake flags and
    dependencies are its entry in :data:`xover.llamacpp.build.BACKEND_SOURCES`). ``ggml_name``: what llama-bench's
    ``backends`` field and llama.cpp's logs call it (devices ``Vulkan0``, buffers ``CUDA_Host``); None for the CPU,
    which llama-bench reports as ``CPU``. ``gpu``: it runs layers on an accelerator, so a build of it that finds no
    device has silently fallen back to the CPU (a failed configuration, never a number). ``no_device``: the one-line
    cause given when that happens, with what to check. ``lazy_pipelines``: it compiles a compute pipeline the first
    time an operation of a new shape runs (ggml_vulkan, through the driver's shader compiler), so a fresh process's
    first prompt of a new size pays seconds of compilation: seen on the H200 (qwen3-30b-a3b, 2026-12-04), a fresh
    Vulkan server's first cold 1K prompt took 24.7 s after a warm-up of 8 tokens, against 1.3 s in a later round.
    Its servers' warm-up prefills a whole ubatch and more before anything is measured, and reaches at least
    ``warmup_positions`` context positions: ggml_vulkan picks other kernels as the cache grows (pinned 0c1e570:
    flash attention's mask optimisation from 1,024 positions, its sparse decode path from 4,096), and a warm-up of
    one ubatch (576 tokens) left the first 1K prompt 6.4 s against 0.14 s in later rounds (second lease)."""

    name: str
    ggml_name: str | None
    gpu: bool = True
    no_device: str = ""
    lazy_pipelines: bool = False
    warmup_positions: int = 0


CPU_BACKEND = "cpu"
BACKEND_TRAITS: Mapping[str, BackendTraits] = {
    CPU_BACKEND: BackendTraits(CPU_BACKEND, None, gpu=False),
    "cuda": BackendTraits(
        "cuda", "CUDA", no_device="no CUDA device found (check nvidia-smi, the driver, and CUDA_VISIBLE_DEVICES)"
    ),
    "vulkan": BackendTraits(
        "vulkan",
        "Vulkan",
        lazy_pipelines=True,
        warmup_positions=4096,
        no_device="no Vulkan device found: the ICD or a loader library is missing (check `vulkaninfo --summary`; "
        "libvulkan1 and, for NVIDIA, libglvnd's libraries), or the only device is a CPU driver such as lavapipe, "
        "which ggml_vulkan skips unless GGML_VK_VISIBLE_DEVICES names it",
    ),
    "hip": BackendTraits(
        "hip", "ROCm", no_device="no ROCm device found (check rocminfo, the amdgpu driver, and HIP_VISIBLE_DEVICES)"
    ),
    "metal": BackendTraits("metal", "MTL", no_device="no Metal device found"),
}
"""Every backend a build may be made for, by xover's name (``xover llama build --backend``, ``[[config]] backend``)."""
BACKENDS: tuple[str, ...] = tuple(BACKEND_TRAITS)
GPU_BACKENDS: tuple[str, ...] = tuple(n for n, b in BACKEND_TRAITS.items() if b.gpu)
HOST_BUFFER_BACKENDS = ("cuda", "hip", "vulkan")
"""GPU backends with a pinned host buffer type (``CUDA_Host``, ``ROCm_Host``, ``Vulkan_Host``): where ``-lm none``
pins CPU-resident weights and what ``--no-host`` skips."""
OP_OFFLOAD_BACKENDS = ("cuda", "hip", "vulkan", "metal")
"""GPU backends whose devices take large batches of ops on host-resident weights (op offload: their ``offload_op``
reads ``GGML_OP_OFFLOAD_MIN_BATCH``)."""


def build_name(engine: str, backend: str | None = None) -> str:
    """How a build (an engine and a backend) is named on the command line, in messages and in reports:
    ``llama.cpp``, ``llama.cpp:vulkan``; backend None is the engine's default build."""
    return engine if backend is None else f"{engine}:{backend}"


def backend_traits(backend: str) -> BackendTraits:
    found = BACKEND_TRAITS.get(backend)
    if found is None:
        raise XoverError(f"unknown backend {backend!r}; use one of {', '.join(BACKENDS)}")
    return found


NO_DEVICE_BACKENDS = ("CPU", "BLAS", "RPC")
"""llama-bench ``backends`` entries that are no accelerator of this host."""


def ran_on_bench(backends: str, gpu_info: str) -> tuple[str, ...]:
    """The accelerator backends a llama-bench record ran on with a device (``CUDA``, ``Vulkan``): its ``backends``
    field less the CPU's, RPC's and BLAS's, and none where it names no device (``gpu_info`` empty: a GPU backend
    registered with no device, as ggml_vulkan does when it finds none)."""
    if not gpu_info.strip():
        return ()
    return tuple(b.strip() for b in backends.split(",") if b.strip() and b.strip() not in NO_DEVICE_BACKENDS)


def ran_on_server(devices: Sequence[str]) -> tuple[str, ...]:
    """The accelerator backends a llama-server's logged devices (``Vulkan0``, ``CUDA0``) belong to; RPC workers'
    devices are not this host's."""
    names = (d.rstrip("0123456789") for d in devices if not d.startswith("RPC"))
    return tuple(dict.fromkeys(n for n in names if n))


def backend_problem(expected: str | None, ran_on: Sequence[str], what: str) -> str | None:
    """Why a process (``what``: "llama-bench", "llama-server") of a build for ``expected`` did not run where it
    should (one line), or None. ``ran_on``: the accelerator backends it ran on with a device (:func:`ran_on_bench`,
    :func:`ran_on_server`). A GPU backend with no device fell back to the CPU; a CPU build that ran on a GPU is
    not the CPU's number either. ``expected`` None: the build's backend is not known, so nothing is checked."""
    if expected is None:
        return None
    traits = backend_traits(expected)
    if not traits.gpu:
        return (
            f"{what} of a cpu configuration ran on {', '.join(ran_on)}: point it at a CPU build" if ran_on else None
        )
    if traits.ggml_name in ran_on:
        return None
    if not ran_on:
        return f"{what} of the {expected} build ran on the CPU: {traits.no_device}"
    return f"{what} of the {expected} build ran on {', '.join(ran_on)}, not {traits.ggml_name}: check the build folder"


def backend_of(reported: str) -> str | None:
    """xover's name for the GPU backend a llama-bench ``backends`` field names (``CUDA``, ``Vulkan,RPC``), ``cpu``
    where it names none (``CPU``, ``BLAS``, ``RPC``), None where it names one xover does not know."""
    names = [b.strip() for b in reported.split(",") if b.strip()]
    by_ggml = {t.ggml_name: n for n, t in BACKEND_TRAITS.items() if t.ggml_name}
    gpu = [n for n in names if n not in ("CPU", "BLAS", "RPC")]
    if not gpu:
        return CPU_BACKEND
    return by_ggml.get(gpu[0])

CPUS_HALF = "{cpus/2}"
"""A search value resolved per machine: half the logical CPUs (at least 1)."""
CPUS = "{cpus}"
"""A search value resolved per machine: every logical CPU."""
CPUS_QUARTER = "{cpus/4}"
"""A search value resolved per machine: a quarter of the logical CPUs (at least 1)."""


_SAME: Any = object()  # an EngineForm field left as the option's own


@dataclasses.dataclass(frozen=True)
class EngineForm:
    """How an engine other than mainline takes an option, where it differs from the option's own spellings: its
    llama-bench and llama-server spellings (a switch's "on" and "off" ones), the values llama-bench takes for a
    setting's values, and llama-bench's record field (None: it reports none, so nothing is checked)."""

    bench: tuple[str, ...] = _SAME
    server: tuple[str, ...] = _SAME
    server_off: tuple[str, ...] = _SAME
    bench_values: tuple[tuple[str, str], ...] = _SAME
    record_field: str | None = _SAME
    record_values: tuple[tuple[str, int], ...] = _SAME
    choices: tuple[str, ...] = _SAME
    default: str = _SAME


@dataclasses.dataclass(frozen=True)
class LlamaOption:
    """One llama.cpp option.

    ``name`` is llama.cpp's long option name without dashes (the study spec's ``[[config]]`` key, a setting's name
    and advise's knob name), or the variable's name for an environment option. ``bench``/``server``: the spellings
    each tool accepts, the one xover passes first; empty when that tool does not take it. For a switch, ``server``
    turns it on and ``server_off`` off; a switch without an "off" spelling (``--no-host``) passes nothing when off,
    which is llama.cpp's default there. ``default`` is llama.cpp's, as it documents it (``auto`` where llama.cpp
    decides at run time). ``record_field`` is llama-bench's JSONL field reporting the value in effect;
    ``record_values`` maps a value to what that field reports when it is not the value itself (``-fa on`` -> ``1``).
    ``checked``: xover checks every llama-bench record against the configuration's value of this option.
    ``memory``/``speed``: whether it can change llama.cpp's memory use (model, KV or compute buffers, pinned host
    memory) and its speed. ``gpu_only``: it changes only how weights reach a GPU, so a CPU-only build shows no
    effect. ``search``: the values ``xover advise`` tries by default (empty: not searched); ``tune_search``: the
    study's tuning stage's when they differ (``()``: not searched there). ``cli``: the command-line option
    ``xover bench`` and ``xover ttft`` sweep it with and ``xover advise`` takes its values to try with (none:
    no option), with ``help``. ``placement``: it says where weights live (a
    configuration's placement rather than its settings). ``budget_only``: the tuning stage searches it only for a
configuration placed under a VRAM budget (``n-cpu-moe = "fit"``), where the memory it frees keeps more experts on
the GPU. ``engines``: the engines that take it. ``backends``: the backends it can act on where not every one (the
pinned host buffer's, op offload's, a ``GGML_VK_*`` or ``GGML_CUDA_*`` variable's); a configuration built for another
backend is refused it, and the tuning stage skips it there with its reason.
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
    cli: tuple[str, ...] = ()
    help: str = ""
    minimum: int = 0  # an int's least value
    placement: bool = False
    budget_only: bool = False  # searched only where a VRAM budget places the configuration (it moves experts)
    engines: tuple[str, ...] = (ENGINE,)
    # The backends it can act on (None: every backend, every GPU backend where ``gpu_only``).
    backends: tuple[str, ...] | None = None
    # How another engine among ``engines`` takes it where that differs: (engine, form).
    forms: tuple[tuple[str, EngineForm], ...] = ()
    bench_values: tuple[tuple[str, str], ...] = ()  # a setting's value -> llama-bench's, where they differ
    # A value written in the spec (a TOML value) -> the setting's text, or a one-line error naming ``where``;
    # None: by ``kind``.
    parser: Callable[[Any, str], str] | None = None

    def for_engine(self, engine: str) -> LlamaOption:
        """This option as ``engine`` takes it (its form applied); a one-line error when the engine lacks it."""
        if engine not in self.engines:
            raise XoverError(
                f"{engine} has no {self.name} option (it is {'/'.join(self.spellings) or self.name} in "
                f"{', '.join(self.engines)}): remove it from this configuration or run it on {self.engines[0]}"
            )
        form = dict(self.forms).get(engine)
        if form is None:
            return self
        changed = {f.name: v for f in dataclasses.fields(form) if (v := getattr(form, f.name)) is not _SAME}
        changed["checked"] = self.checked and changed.get("record_field", self.record_field) is not None
        return dataclasses.replace(self, forms=(), **changed)

    def acts_on(self, backend: str) -> bool:
        """Whether it can change anything on a build for ``backend``."""
        if self.backends is not None:
            return backend in self.backends
        return not self.gpu_only or backend in GPU_BACKENDS

    @property
    def bench_flag(self) -> str | None:
        """What xover passes llama-bench (an environment option: its name), or None."""
        return self.name if self.env else (self.bench[0] if self.bench else None)

    @property
    def server_flag(self) -> str | None:
        """What xover passes llama-server (a switch: the flag that turns it on), or None."""
        return self.name if self.env else (self.server[0] if self.server else None)

    @property
    def spellings(self) -> tuple[str, ...]:
        """Every spelling that sets it (a switch: that turns it on), in either tool."""
        return tuple(dict.fromkeys((*self.bench, *self.server)))

    @property
    def tuned_values(self) -> tuple[str, ...]:
        """The values the study's tuning stage tries by default."""
        return self.search if self.tune_search is None else self.tune_search

    def record_value(self, value: str) -> int | None:
        """What llama-bench's :attr:`record_field` reports for ``value``: an integer (a switch's ``true`` is 1),
        or None when the field is not a number (``load_mode``, ``type_k``)."""
        mapped = dict(self.record_values)
        if value in mapped:
            return mapped[value]
        return int(value) if self.kind in ("int", "switch") else None

    def bench_value(self, value: str) -> str:
        """A setting's value (a list: comma-separated, as llama-server takes it) in llama-bench's form."""
        if self.bench_values:  # a value the engine's llama-bench lacks was refused with the configuration (check_engine)
            return dict(self.bench_values)[value]
        return value.replace(",", self.bench_list_sep) if self.kind == "list" else value

    def bench_args(self, value: str) -> tuple[str, ...]:
        """llama-bench's arguments for a setting's value (an environment option: none; it goes in the
        environment)."""
        if self.env:
            return ()
        if self.bench_flag is None:
            raise XoverError(f"llama-bench has no option {self.name}: leave it out of configurations measured with it")
        return (self.bench_flag, self.bench_value(value))

    def server_args(self, value: str) -> tuple[str, ...]:
        """llama-server's arguments for a setting's value: a switch is its bare "on" spelling, its "off" spelling
        or nothing; an environment option none (it goes in the environment)."""
        if self.env:
            return ()
        if self.kind == "switch":
            return self.server[:1] if value == "1" else self.server_off[:1]
        if self.server_flag is None:
            raise XoverError(f"llama-server has no option {self.name}: leave it out of configurations it serves")
        return (self.server_flag, value)

    def parse(self, value: Any, where: str) -> str:
        """A value as written in a study spec or on the command line -> the setting's text, checked, or a
        one-line error that names ``where`` and says what to write."""
        if self.parser is not None:
            return self.parser(value, where)
        if self.kind == "switch":
            if isinstance(value, bool) or value in (0, 1, "0", "1"):
                return str(int(value in (True, 1, "1")))
            raise XoverError(f"{where}: {self.name} must be true or false, got {value!r}")
        if self.kind == "int":
            text = str(value).strip() if isinstance(value, (int, str)) and not isinstance(value, bool) else ""
            if not text.lstrip("-").isdigit() or int(text) < self.minimum:
                least = "a non-negative integer" if self.minimum == 0 else f"an integer of at least {self.minimum}"
                raise XoverError(f"{where}: {self.name} must be {least}, got {value!r}")
            return str(int(text))
        if self.kind == "choice":
            if value not in self.choices:
                raise XoverError(f"{where}: {self.name} must be one of {', '.join(self.choices)}, got {value!r}")
            return str(value)
        if self.kind == "list":
            items = value.split(",") if isinstance(value, str) else value
            if not isinstance(items, list | tuple) or not items or not all(isinstance(x, str) for x in items):
                raise XoverError(f"{where}: {self.name} must be a list of strings, got {value!r}")
            return ",".join(x.strip() for x in items)
        if not isinstance(value, (str, int)) or isinstance(value, bool):
            raise XoverError(f"{where}: {self.name} must be a string, got {value!r}")
        return str(value)


BOTH = (ENGINE, IK_LLAMA)  # options both engines take (ik_llama.cpp's spelling in the option's forms)
LOAD_MODES = ("auto", "none", "mmap", "mlock", "mmap+mlock", "dio")  # llama_load_mode_name
FLASH_ATTN_MODES = ("on", "off", "auto")  # llama_flash_attn_type_name

# Placement: where the weights live.
N_CPU_MOE = LlamaOption(
    "n-cpu-moe", "ncmoe", "int", "0", bench=("-ncmoe", "--n-cpu-moe"), server=("-ncmoe", "--n-cpu-moe"),
    record_field="n_cpu_moe", checked=True, memory=True, placement=True, parser=option_values.parse_n_cpu_moe,
    cli=("--ncmoe",), help="--n-cpu-moe values: the experts of the first N layers stay in host memory.",
    engines=BOTH, forms=((IK_LLAMA, EngineForm(bench=("--n-cpu-moe",), record_field=None)),))
# llama-bench's default -1 and llama-server's auto both offload every layer that fits.
N_GPU_LAYERS = LlamaOption(
    "n-gpu-layers", "ngl", "int", "-1", bench=("-ngl", "--n-gpu-layers"),
    server=("-ngl", "--gpu-layers", "--n-gpu-layers"), record_field="n_gpu_layers", memory=True, placement=True, engines=BOTH)
# RPC workers (ggml-rpc-server, tools/rpc; a build with -DGGML_RPC=ON): each worker's devices join the local ones
# and the offloaded layers (-ngl) are split over every device in proportion to its free memory. Both tools take
# one comma-separated list of host:port (llama-bench registers them once, it does not sweep them); llama-bench
# reports "RPC" in its ``backends`` field, not the endpoints. The spec's ``rpc-local = N`` (workers xover starts
# itself) becomes this option once they run (:mod:`xover.llamacpp.rpc`). Both tools resolve -ot's buffer types
# while they parse their arguments, so --rpc comes before -ot: arguments follow this table's order.
RPC = LlamaOption(
    "rpc", "rpc", "list", "", bench=("--rpc", "-rpc"), server=("--rpc",), memory=True, placement=True,
    parser=option_values.parse_rpc)
# Where named tensors live: ``<regex>=<buffer type>`` items, e.g. ``blk\.[0-9]\.ffn_.*_exps=RPC0[10.0.0.2:50052]``
# puts the experts of layers 0-9 on that worker's first device (a buffer type as llama.cpp names it: CPU, CUDA0,
# RPC<device>[host:port]).
OVERRIDE_TENSOR = LlamaOption(
    "override-tensor", "ot", "list", "", bench=("-ot", "--override-tensor"), server=("-ot", "--override-tensor"),
    memory=True, bench_list_sep=";", placement=True, parser=option_values.parse_overrides, engines=BOTH)
# The share of the offloaded layers each device gets, in llama.cpp's device order (RPC workers first, then local
# GPUs), e.g. 1/3: the worker a quarter. Default: in proportion to each device's free memory.
TENSOR_SPLIT = LlamaOption(
    "tensor-split", "ts", "str", "", bench=("-ts", "--tensor-split"), server=("-ts", "--tensor-split"), memory=True,
    placement=True, parser=option_values.parse_tensor_split, engines=BOTH)

# Settings, the searched ones in the order advise and the tuning stage vary them.
LOAD_MODE = LlamaOption(
    "load-mode", "lm", "choice", "auto", bench=("-lm", "--load-mode"), server=("-lm", "--load-mode"), choices=LOAD_MODES,
    record_field="load_mode", memory=True, gpu_only=True, search=("none",), tune_search=("none", "mlock"),
    cli=("--load-mode",), help="-lm values: none keeps weights in (pinned, on GPU builds) host buffers, mmap maps the file.")
UBATCH_SIZE = LlamaOption(
    "ubatch-size", "ub", "int", "512", bench=("-ub", "--ubatch-size"), server=("-ub", "--ubatch-size"),
    record_field="n_ubatch", checked=True, memory=True, search=("1024", "2048", "4096"), minimum=1,
    cli=("--ubatch",), help="-ub values: tokens per expert copy when op offload runs prefill on the GPU.", engines=BOTH)
BATCH_SIZE = LlamaOption(
    "batch-size", "b", "int", "2048", bench=("-b", "--batch-size"), server=("-b", "--batch-size"),
    record_field="n_batch", checked=True, memory=True, search=("4096",), minimum=1,
    cli=("--batch",), help="-b values (logical batch; llama.cpp caps the ubatch at it).", engines=BOTH)
NO_OP_OFFLOAD = LlamaOption(
    "no-op-offload", "nopo", "switch", "0", bench=("-nopo", "--no-op-offload"), server=("--no-op-offload",),
    server_off=("--op-offload",), record_field="no_op_offload", checked=True, gpu_only=True, search=("1",),
    backends=OP_OFFLOAD_BACKENDS,
    cli=("--no-op-offload",), help="1: --no-op-offload (large batches of CPU-resident experts run on the CPU), 0: on.")
# Above the default ubatch: prompt ubatches of 512 stay on the CPU, larger ones are still copied.
OP_OFFLOAD_MIN_BATCH = LlamaOption(
    "GGML_OP_OFFLOAD_MIN_BATCH", "GGML_OP_OFFLOAD_MIN_BATCH", "int", "32", env=True, gpu_only=True, search=("1024",),
    backends=OP_OFFLOAD_BACKENDS,
    cli=("--op-offload-min-batch",), help="GGML_OP_OFFLOAD_MIN_BATCH values: the smallest batch op offload copies weights for (CUDA).")
# With a GPU, CPU-resident weights go into the GPU's host buffer (pinned or mapped), ahead of the CPU's repacked
# (CPU_REPACK) and AMX buffers: --no-host skips it, so the CPU's own kernels run decode, and op offload has nothing
# to copy (llama.cpp #16310). llama-bench takes --no-host 0|1 and reports no_host; llama-server a bare --no-host.
NO_HOST = LlamaOption(
    "no-host", "nohost", "switch", "0", bench=("--no-host",), server=("--no-host",), record_field="no_host",
    checked=True, memory=True, gpu_only=True, tune_search=("1",), backends=HOST_BUFFER_BACKENDS,
    cli=("--no-host",), help="1: --no-host (CPU-resident weights in the CPU's repacked/AMX buffers, not the GPU's host buffer).")
# Repacking CPU weights into the layouts of the CPU's vector kernels (CPU_REPACK), on by default where the CPU has
# such kernels; llama-bench takes --repack 0|1, llama-server --repack and -nr/--no-repack.
REPACK = LlamaOption(
    "repack", "repack", "switch", "1", bench=("--repack",), server=("--repack",), server_off=("-nr", "--no-repack"),
    record_field="repack", checked=True, memory=True, tune_search=("0",),
    cli=("--repack",), help="0: --no-repack (CPU weights keep the file's layout), 1: repacked for the CPU's kernels.")
# Threads, scaled to the machine: decode with CPU-resident experts is bound by memory bandwidth once enough threads
# stream it, and more threads than that only contend; the tuning stage tries a quarter, half and all the logical CPUs.
# llama-bench's -t sets the threads of both prefill and decode; llama-server splits them (-t decode, -tb batches).
THREADS = LlamaOption(
    "threads", "t", "int", "auto", bench=("-t", "--threads"), server=("-t", "--threads"),
    record_field="n_threads", checked=True, search=(CPUS_HALF, CPUS), tune_search=(CPUS_QUARTER, CPUS_HALF, CPUS),
    minimum=1, cli=("-t", "--threads"), help="-t values: CPU threads.", engines=BOTH)
# llama-server's threads for prompt batches (default: -t's). llama-bench has no such option (its -t runs both), so a
# configuration with -tb is served, not benchmarked: a decode-tuned and a prefill-tuned -t become one server line.
THREADS_BATCH = LlamaOption(
    "threads-batch", "tb", "int", "auto", server=("-tb", "--threads-batch"), minimum=1, engines=BOTH)
# How hard a CPU thread polls for work before it sleeps (0-100, llama.cpp's default 50): between the GPU's share of
# a decoded token and the CPU's, a sleeping thread wakes late.
POLL = LlamaOption(
    "poll", "poll", "int", "50", bench=("--poll",), server=("--poll",), record_field="poll", checked=True,
    cli=("--poll",), help="--poll values: 0-100, how long CPU threads poll for work before sleeping.")
# llama.cpp's default auto enables flash attention where the backend supports it; its record field reports -1
# for auto.
FLASH_ATTN = LlamaOption(
    "flash-attn", "fa", "choice", "auto", bench=("-fa", "--flash-attn"), server=("-fa", "--flash-attn"),
    choices=FLASH_ATTN_MODES, record_field="flash_attn", record_values=(("on", 1), ("off", 0), ("auto", -1)),
    checked=True, memory=True, tune_search=("on", "off"),
    cli=("--flash-attn",), help="-fa values: flash attention on, off or auto.",
    engines=BOTH, forms=((IK_LLAMA, EngineForm(bench_values=(("on", "1"), ("off", "0")),
                                             record_values=(("on", 1), ("off", 0)), default="on")),))
# KV cache types: under a VRAM budget, a q8_0 cache (about half of f16) frees VRAM that the placement gives to
# experts. Their quality cost is not something xover measures; every recommendation of one says so.
CACHE_TYPE_K = LlamaOption(
    "cache-type-k", "ctk", "str", "f16", bench=("-ctk", "--cache-type-k"), server=("-ctk", "--cache-type-k"),
    record_field="type_k", memory=True, tune_search=("q8_0",), budget_only=True, engines=BOTH)
CACHE_TYPE_V = LlamaOption(
    "cache-type-v", "ctv", "str", "f16", bench=("-ctv", "--cache-type-v"), server=("-ctv", "--cache-type-v"),
    record_field="type_v", memory=True, tune_search=("q8_0",), budget_only=True, engines=BOTH)

# ik_llama.cpp's own options (``[[config]] engine = "ik_llama.cpp"``), as its llama-bench and llama-server
# (common/common.cpp) spell them. Fused MoE (up, gate and their product in one op) is on by default; llama-server
# turns it off with -no-fmoe. Run-time repacking (-rtr) repacks the tensors left on the CPU for its kernels as the
# model loads (and turns mmap off), which, like mainline's --no-host, trades the copy of CPU experts to the GPU for
# prefill against faster CPU decode. ik_llama.cpp copies only the experts a batch uses to the GPU unless -no-ooae.
# -amb caps the attention's K*Q batch (MiB; 0: no cap), which matters for MLA models' compute buffer.
FUSED_MOE = LlamaOption(
    "fused-moe", "fmoe", "switch", "1", bench=("-fmoe", "--fused-moe"), server=(),
    server_off=("-no-fmoe", "--no-fused-moe"), record_field="fused_moe", checked=True, tune_search=("0",),
    engines=(IK_LLAMA,))
RUN_TIME_REPACK = LlamaOption(
    "run-time-repack", "rtr", "switch", "0", bench=("-rtr", "--run-time-repack"),
    server=("-rtr", "--run-time-repack"), record_field="repack", checked=True, memory=True, tune_search=("1",),
    engines=(IK_LLAMA,))
NO_OFFLOAD_ONLY_ACTIVE_EXPERTS = LlamaOption(
    "no-offload-only-active-experts", "no-ooae", "switch", "0", bench=("-no-ooae", "--no-offload-only-active-experts"),
    server=("-no-ooae", "--no-offload-only-active-experts"), record_field="no_ooae", checked=True, gpu_only=True,
    tune_search=("1",), engines=(IK_LLAMA,), backends=("cuda",))
ATTN_MAX_BATCH = LlamaOption(
    "attention-max-batch", "amb", "int", "0", bench=("-amb", "--attn-max-batch"),
    server=("-amb", "--attention-max-batch"), record_field="attn_max_batch", checked=True, memory=True,
    engines=(IK_LLAMA,))

# Variables one backend's ggml reads (ggml/src/ggml-vulkan/ggml-vulkan.cpp, ggml/src/ggml-cuda/*.cu). Most are
# read for their presence alone: a switch here sets the variable to 1 when on and leaves it unset when off.
# GGML_VK_VISIBLE_DEVICES lists the Vulkan devices ggml uses, as CUDA_VISIBLE_DEVICES does; without it ggml_vulkan
# takes the discrete and integrated GPUs, else the first device that is not a CPU, and never a CPU driver such as
# Mesa's lavapipe (which llama.cpp's own CI runs with it set).
VK_VISIBLE_DEVICES = LlamaOption(
    "GGML_VK_VISIBLE_DEVICES", "GGML_VK_VISIBLE_DEVICES", "str", "", env=True, speed=False, backends=("vulkan",),
    engines=BOTH)
# NVIDIA's cooperative matrix 2 extension (coopmat2) runs ggml_vulkan's matrix products and flash attention on the
# tensor cores where the driver and the build's glslc have it; off: coopmat (KHR) or scalar shaders.
VK_DISABLE_COOPMAT2 = LlamaOption(
    "GGML_VK_DISABLE_COOPMAT2", "GGML_VK_DISABLE_COOPMAT2", "switch", "0", env=True, backends=("vulkan",))
# Weights in host-visible memory rather than device-local (for a GPU with little memory of its own).
VK_PREFER_HOST_MEMORY = LlamaOption(
    "GGML_VK_PREFER_HOST_MEMORY", "GGML_VK_PREFER_HOST_MEMORY", "switch", "0", env=True, memory=True,
    backends=("vulkan",))
# CUDA graphs replay decode's kernels with one launch; off: every kernel launched one by one.
CUDA_DISABLE_GRAPHS = LlamaOption(
    "GGML_CUDA_DISABLE_GRAPHS", "GGML_CUDA_DISABLE_GRAPHS", "switch", "0", env=True, backends=("cuda",))
# No pinned host buffer (CUDA_Host): CPU-resident weights stay in pageable memory, as with mmap.
CUDA_NO_PINNED = LlamaOption(
    "GGML_CUDA_NO_PINNED", "GGML_CUDA_NO_PINNED", "switch", "0", env=True, memory=True, backends=("cuda", "hip"))

OPTIONS: tuple[LlamaOption, ...] = (
    N_CPU_MOE, N_GPU_LAYERS, RPC, OVERRIDE_TENSOR, TENSOR_SPLIT,
    LOAD_MODE, UBATCH_SIZE, BATCH_SIZE, NO_OP_OFFLOAD, OP_OFFLOAD_MIN_BATCH, NO_HOST, REPACK, THREADS, THREADS_BATCH,
    POLL, FLASH_ATTN,
    CACHE_TYPE_K, CACHE_TYPE_V,
    FUSED_MOE, RUN_TIME_REPACK, NO_OFFLOAD_ONLY_ACTIVE_EXPERTS, ATTN_MAX_BATCH,
    VK_VISIBLE_DEVICES, VK_DISABLE_COOPMAT2, VK_PREFER_HOST_MEMORY, CUDA_DISABLE_GRAPHS, CUDA_NO_PINNED,
)
"""Every option, in the order a configuration's arguments are written (placement first: --rpc before -ot), the
searched ones in the order advise and the tuning stage vary them."""

BY_NAME: Mapping[str, LlamaOption] = {o.name: o for o in OPTIONS}
BY_BENCH_FLAG: Mapping[str, LlamaOption] = {o.bench_flag: o for o in OPTIONS if o.bench_flag is not None}
_BY_SPELLING: Mapping[str, LlamaOption] = {s.lstrip("-"): o for o in OPTIONS for s in o.spellings}
_ORDER: Mapping[str, int] = {o.name: i for i, o in enumerate(OPTIONS)}
SWEPT: tuple[LlamaOption, ...] = tuple(o for o in OPTIONS if o.cli)
"""The options ``xover bench`` and ``xover ttft`` sweep, each with its own command-line option."""


def option(name: str) -> LlamaOption:
    """The option called ``name`` (its long name, or its short name: ``ub``), or a one-line error listing them."""
    found = BY_NAME.get(name) or next((o for o in OPTIONS if o.short == name), None)
    if found is None:
        raise XoverError(f"unknown llama.cpp option {name!r}; xover knows {', '.join(BY_NAME)}")
    return found


def by_spelling(flag: str) -> LlamaOption | None:
    """The option a flag of either tool sets (``-ncmoe``, ``--n-cpu-moe``, ``ncmoe``...), or None."""
    return _BY_SPELLING.get(flag.lstrip("-"))


def order(name: str) -> int:
    """An option's place in the table: a configuration's settings are kept, and passed, in this order."""
    return _ORDER[name]


def record_fields() -> tuple[str, ...]:
    """llama-bench's JSONL fields that report an option's value in effect, in table order."""
    return tuple(o.record_field for o in OPTIONS if o.record_field is not None)


def searched(cpu_count: int) -> tuple[tuple[LlamaOption, tuple[str, ...]], ...]:
    """``xover advise``'s options and values, per-machine values resolved for ``cpu_count`` logical CPUs."""
    return tuple((o, resolve(o.search, cpu_count)) for o in OPTIONS if o.search)


def tuned(cpu_count: int, engine: str = ENGINE) -> tuple[tuple[LlamaOption, tuple[str, ...]], ...]:
    """The tuning stage's options and values for ``engine`` (each in that engine's form; its default left out of
    the values), as :func:`searched`."""
    out = []
    for o in OPTIONS:
        if not o.tuned_values or engine not in o.engines:
            continue
        own = o.for_engine(engine)
        values = tuple(v for v in resolve(o.tuned_values, cpu_count) if v != own.default)
        if values:
            out.append((own, values))
    return tuple(out)


TUNE_KNOBS: tuple[tuple[str, str], ...] = tuple((o.name, o.short) for o in OPTIONS if o.tuned_values)
"""The knobs a study's tuning stage can search, on one engine or another, (name, short name)."""


def resolve(values: Sequence[str], cpu_count: int) -> tuple[str, ...]:
    """Search values with :data:`CPUS_HALF` and :data:`CPUS` replaced by numbers, duplicates dropped."""
    numbers = {CPUS_QUARTER: str(max(1, cpu_count // 4)), CPUS_HALF: str(max(1, cpu_count // 2)), CPUS: str(cpu_count)}
    return tuple(dict.fromkeys(numbers.get(v, v) for v in values))


def check_backend(backend: str | None, settings: Iterable[tuple[str, str]], where: str) -> None:
    """Refuse, in one line, a backend xover does not know, or a setting that names the backends it acts on and not
    this one (``--no-host`` on a CPU build, ``GGML_VK_*`` on a CUDA one). ``backend`` None: the engine's default
    build, whichever backend it has."""
    if backend is None:
        return
    if backend not in BACKEND_TRAITS:
        raise XoverError(f"{where}: unknown backend {backend!r}; use one of {', '.join(BACKENDS)}")
    for name, _ in settings:
        opt = BY_NAME[name]
        if opt.backends is not None and backend not in opt.backends:
            raise XoverError(
                f"{where}: {name} acts only on {', '.join(opt.backends)} builds, not {backend}: remove it from this "
                "configuration or change its backend"
            )


def check_engine(engine: str, settings: Iterable[tuple[str, str]], where: str) -> None:
    """Refuse, in one line, an engine xover does not know, a setting the engine does not take, or a value its
    llama-bench cannot be given (ik_llama.cpp's ``-fa`` is 0 or 1)."""
    if engine not in ENGINES:
        raise XoverError(f"{where}: unknown engine {engine!r}; use one of {', '.join(ENGINES)}")
    for name, value in settings:
        try:
            opt = BY_NAME[name].for_engine(engine)
        except XoverError as e:
            raise XoverError(f"{where}: {e}") from None
        if opt.bench_values and value not in dict(opt.bench_values):
            raise XoverError(
                f"{where}: {engine}'s llama-bench takes {name} as {' or '.join(dict(opt.bench_values))} only, "
                f"not {value!r}: set one of those"
            )


# ---- reading argument lists back (what a user wrote after `--`, and the stores written before the table) ------


def parse_args(args: Sequence[str], tool: Literal["bench", "server"]) -> tuple[dict[str, str], tuple[str, ...]]:
    """The settings a tool's argument list gives (option name -> value, in the form a configuration keeps), and
    the arguments the table does not know, in their order. A valued option takes the next argument; a switch's
    llama-server spellings take none (on, or off for its "off" spelling)."""
    values: dict[str, str] = {}
    rest: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        found = _tool_option(arg, tool)
        if found is None:
            rest.append(arg)
            i += 1
        elif found.kind == "switch" and tool == "server":
            values[found.name] = "0" if arg in found.server_off else "1"
            i += 1
        elif i + 1 < len(args):
            value = args[i + 1]
            values[found.name] = value.replace(found.bench_list_sep, ",") if tool == "bench" else value
            i += 2
        else:
            rest.append(arg)
            i += 1
    return values, tuple(rest)


def _tool_option(arg: str, tool: str) -> LlamaOption | None:
    for o in OPTIONS:
        if arg in ((*o.bench,) if tool == "bench" else (*o.server, *o.server_off)):
            return o
    return None
