"""Study configuration: named sets of llama.cpp flags, and the study spec (TOML). Pure: no I/O
except :func:`load_spec`, which reads one file.

A configuration is written once, in llama.cpp's own option names, and translated to both
``llama-bench`` and ``llama-server`` argument lists (:meth:`LlamaConfig.bench_config`,
:meth:`LlamaConfig.server_args`). The two binaries share short flags for everything xover
sweeps except op offload (``-nopo 1`` vs ``--no-op-offload``).
"""

from __future__ import annotations

import dataclasses
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from xover.domain import llama_options
from xover.domain.records import BenchConfig
from xover.errors import XoverError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# TOML key (llama.cpp long option name) -> the short flag both llama-bench and llama-server accept.
SHARED_FLAGS: dict[str, str] = {o.name: o.shared_flag for o in llama_options.OPTIONS if o.shared_flag is not None}
_INT_KEYS = {name for name in SHARED_FLAGS if llama_options.BY_NAME[name].kind == "int"}
LOAD_MODES = llama_options.LOAD_MODES  # -lm / --load-mode
_CHOICES = {
    name: llama_options.BY_NAME[name].choices for name in SHARED_FLAGS if llama_options.BY_NAME[name].kind == "choice"
}
# The knobs the tuning stage can search, (name, short name): xover.analysis.advise.study_knobs defines them.
TUNE_KNOBS = tuple((o.name, o.short) for o in llama_options.OPTIONS if o.tuned_values)
_NOPO = llama_options.NO_OP_OFFLOAD  # the spec's no-op-offload = true
_RPC = llama_options.RPC  # the spec's rpc = ["host:port", ...]; rpc-local = N becomes it once xover's workers run
_OT = llama_options.OVERRIDE_TENSOR  # the spec's override-tensor = ["<regex>=<buffer type>", ...]
_TS = llama_options.TENSOR_SPLIT  # the spec's tensor-split = "1/3" (or [1, 3])
# In an override's buffer type, {rpc0}, {rpc1}, ... stand for the configuration's workers' endpoints (rpc-local
# workers get their ports only when they start): "exps=RPC0[{rpc0}]" is the first device of the first worker.
_RPC_SLOT = re.compile(r"\{rpc(\d+)\}")
_RPC_BUFT = re.compile(r"RPC\d+\[([^\]]*)\]")
STAGES = ("theory", "tune", "bench", "ttft", "cache", "session", "report")


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    """One named configuration: flags shared by llama-bench and llama-server, plus op offload and env."""

    name: str
    flags: tuple[tuple[str, str], ...] = ()  # (short flag, value), e.g. ("-ncmoe", "12")
    no_op_offload: bool = False
    env: tuple[tuple[str, str], ...] = ()  # e.g. (("GGML_OP_OFFLOAD_MIN_BATCH", "64"),)
    bench_args: tuple[str, ...] = ()  # extra llama-bench arguments
    server_args: tuple[str, ...] = ()  # extra llama-server arguments
    # The context this configuration is placed for (a resolved ``fit@L`` level): its servers get this ``-c`` and
    # prompts longer than it holds are not measured on it (under the budget it would not load).
    max_context: int | None = None
    # RPC workers xover starts on 127.0.0.1 for this configuration (``rpc-local = N``), and each one's threads
    # (None: the logical CPUs shared out between them). Until they run, the configuration has no ``--rpc`` flag
    # and cannot be measured: :meth:`with_rpc` adds their endpoints.
    rpc_local: int = 0
    rpc_threads: int | None = None

    def flag(self, short: str) -> str | None:
        return dict(self.flags).get(short)

    def holds(self, tokens: int) -> bool:
        """Whether this configuration's context holds ``tokens`` (prompt plus response, or depth plus test)."""
        return self.max_context is None or tokens <= self.max_context

    @property
    def rpc(self) -> tuple[str, ...]:
        """The RPC workers' endpoints (``host:port``) this configuration passes ``--rpc``, in order."""
        value = self.flag(_RPC.shared_flag or "")
        return tuple(value.split(",")) if value else ()

    def with_rpc(self, endpoints: tuple[str, ...]) -> LlamaConfig:
        """This configuration with its local workers' endpoints as ``--rpc`` (the workers run), and its tensor
        overrides' ``{rpcN}`` replaced by them."""
        assert self.rpc_local and len(endpoints) == self.rpc_local and not self.rpc, (self.name, endpoints)
        flags = tuple((f, _fill_rpc_slots(v, endpoints) if f == _OT.shared_flag else v) for f, v in self.flags)
        return dataclasses.replace(self, flags=(*flags, (_RPC.shared_flag or "", ",".join(endpoints))))

    def _check_workers(self) -> None:
        if self.rpc_local and not self.rpc:
            raise XoverError(
                f"[[config]] {self.name!r}: its {self.rpc_local} rpc-local worker(s) are not running, so it cannot be "
                "measured (xover study starts them: xover.llamacpp.rpc.local_workers)"
            )

    def bench_config(self) -> BenchConfig:
        self._check_workers()
        flags = tuple((f, llama_options.BY_BENCH_FLAG[f].bench_value(v)) for f, v in self.flags)
        fields = flags + (((_NOPO.bench[0], "1"),) if self.no_op_offload else ())
        return BenchConfig(label=self.name, fields=fields, env=self.env, extra_args=self.bench_args)

    def server_args_list(self) -> tuple[str, ...]:
        self._check_workers()
        args: list[str] = []
        for flag, value in llama_options.in_parse_order(self.flags):
            args += [flag, value]
        if self.no_op_offload:
            args += _NOPO.server_args("1")
        return tuple(args) + self.server_args

    def llama_server_command(self) -> str:
        """The flags to paste into a llama-server command line."""
        return " ".join(self.server_args_list())


@dataclasses.dataclass(frozen=True)
class StudySpec:
    """Everything a study measures. Lengths are prompt tokens; llama-bench measures at the same depths
    unless ``bench_depths`` names others (its untimed depth prefill costs about as much as a TTFT sample
    per test, so a study on slow offload settings may bench at the short depths only)."""

    configs: tuple[LlamaConfig, ...]
    model_path: Path | None = None
    model_preset: str | None = None
    lengths: tuple[int, ...] = (1024, 4096, 16384, 32768)
    response_tokens: tuple[int, ...] = (200,)
    repetitions: int = 3
    bench_repetitions: int = 5
    pp: int = 512
    tg: int = 128
    band: tuple[int, int] = (10_000, 40_000)
    cache_length: int | None = None  # cache-lab prompt length (default: the longest length the config holds)
    skip: frozenset[str] = frozenset()
    timeout_s: float | None = None  # per llama-bench configuration, per server start and per server request
    session_turns: int = 12  # agentic session replay: turns, system prompt and final size (tokens, approx.)
    session_system_tokens: int | None = None  # default: a quarter of the longest length, at most 10K
    session_target_tokens: int | None = None  # default: the longest length
    session_response_tokens: int = 32
    bench_depths: tuple[int, ...] | None = None  # llama-bench depths (default: the lengths)
    hardware: str | None = None  # theory's hardware: None detects, "measure" also measures, else a profile or .toml
    # The tuning stage (each configuration's best llama.cpp settings, measured beside its defaults):
    tune: bool = True
    tune_knobs: tuple[str, ...] | None = None  # knob names (long or short: load-mode/lm...); None: all of them
    tune_values: tuple[tuple[str, tuple[str, ...]], ...] = ()  # knob -> candidate values, replacing the defaults'
    tune_depths: tuple[int, ...] | None = None  # llama-bench depths besides 0 (default: the shortest length)
    tune_repetitions: int = 2
    pairs: tuple[tuple[str, str], ...] = ()  # the pairs the verdict answers first (default: the first two configs)
    vram_budget: int | None = None  # bytes: xover holds the rest of GPU 0 for the whole study (None: the whole card)
    # Cold TTFT samples a configuration is too slow for are skipped (and listed) rather than measured: a length
    # whose TTFT, scaled linearly from the longest length measured on it, would exceed this many seconds.
    max_ttft_s: float | None = None
    # Tokens each cold TTFT request generates (llama-server's n_predict), from which the decode speed at that
    # depth is read; the total time per turn still assumes ``response_tokens``. None: the longest response.
    # Where decode is slow (7 t/s), 200 tokens cost 30 s a sample, most of a study's measuring time.
    decode_tokens: int | None = None

    def __post_init__(self) -> None:
        validate_spec(self)

    @property
    def generated_tokens(self) -> int:
        """Tokens each cold TTFT request generates: ``decode_tokens``, else the longest response."""
        return self.decode_tokens if self.decode_tokens is not None else max(self.response_tokens)

    def lengths_for(self, config: LlamaConfig) -> tuple[int, ...]:
        """The prompt lengths measured on ``config``: those its context holds with the longest response."""
        return tuple(L for L in self.lengths if config.holds(L + max(self.response_tokens)))

    def cache_length_for(self, config: LlamaConfig, context: Callable[[int], int]) -> int | None:
        """The cache lab's prompt length on ``config``, whose servers need ``context(L)`` tokens of context:
        ``cache_length``, else the longest length the configuration holds (a "fit" level is placed for one
        context); None where it holds none of them."""
        candidates = (self.cache_length,) if self.cache_length is not None else sorted(self.lengths, reverse=True)
        return next((L for L in candidates if config.holds(context(L))), None)

    def bench_depths_for(self, config: LlamaConfig) -> tuple[int, ...]:
        """llama-bench depths for ``config``: those its context holds with the longer of the pp and tg tests."""
        return tuple(d for d in (self.bench_depths or self.lengths) if config.holds(d + max(self.pp, self.tg)))


def _k(text: str | int, what: str) -> int:
    """``1k``/``4K``/``32768`` -> tokens (1k = 1024)."""
    if isinstance(text, int) and not isinstance(text, bool):
        return text
    m = re.fullmatch(r"\s*(\d+)\s*([kK]?)\s*", str(text))
    if not m:
        raise XoverError(f"{what}: {text!r} is not a token count (use e.g. 4096 or 4k)")
    return int(m.group(1)) * (1024 if m.group(2) else 1)


def _seconds(value: Any, what: str) -> float:
    """``120``, ``"120s"``, ``"2min"`` -> seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(s|min|m)?\s*", str(value))
    if not m:
        raise XoverError(f"{what}: {value!r} is not a duration (use e.g. 120, '120s' or '2min')")
    return float(m.group(1)) * (60 if m.group(2) in ("min", "m") else 1)


def parse_lengths(text: str | list[Any], what: str = "--lengths") -> tuple[int, ...]:
    items = text.split(",") if isinstance(text, str) else list(text)
    values = tuple(_k(x, what) for x in items if str(x).strip())
    if not values:
        raise XoverError(f"{what}: give at least one length, e.g. 1k,4k,16k,32k")
    if any(v <= 0 for v in values):
        raise XoverError(f"{what}: lengths must be positive, got {', '.join(map(str, values))}")
    return tuple(sorted(set(values)))


def validate_spec(spec: StudySpec) -> None:
    if not spec.configs:
        raise XoverError("a study needs at least one configuration ([[config]] in the spec)")
    names = [c.name for c in spec.configs]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise XoverError(f"configuration names must be unique; {sorted(dup)[0]!r} appears twice")
    if (spec.model_path is None) == (spec.model_preset is None):
        raise XoverError("give the model as exactly one of [model] path = '...gguf' or preset = 'tiny-moe'")
    if any(v <= 0 for v in spec.lengths) or not spec.lengths:
        raise XoverError("lengths must be positive token counts")
    if spec.bench_depths is not None and (not spec.bench_depths or any(d < 0 for d in spec.bench_depths)):
        raise XoverError("bench-depths must be token counts of 0 or more, e.g. [0, 4096]")
    if any(r <= 0 for r in spec.response_tokens) or not spec.response_tokens:
        raise XoverError("response-tokens must be positive")
    if spec.decode_tokens is not None and not 1 <= spec.decode_tokens <= max(spec.response_tokens):
        raise XoverError(
            f"[study] decode-tokens must be between 1 and the longest response-tokens ({max(spec.response_tokens)})"
        )
    if spec.repetitions < 1 or spec.bench_repetitions < 1:
        raise XoverError("repetitions must be at least 1")
    if spec.pp < 1 or spec.tg < 1:
        raise XoverError("pp and tg must be at least 1 token")
    if not spec.band[0] < spec.band[1]:
        raise XoverError(f"band {spec.band}: give [LO, HI] with LO < HI")
    unknown = spec.skip - set(STAGES)
    if unknown:
        raise XoverError(f"skip: unknown stage {sorted(unknown)[0]!r}; stages are {', '.join(STAGES)}")
    if spec.hardware not in (None, "measure") and not spec.hardware.endswith(".toml"):
        from xover.hardware.profiles import builtin

        builtin(spec.hardware)  # an unknown profile fails here, before anything runs
    if spec.timeout_s is not None and spec.timeout_s <= 0:
        raise XoverError("timeout must be a positive number of seconds")
    if spec.max_ttft_s is not None and spec.max_ttft_s <= 0:
        raise XoverError("[study] max-ttft must be a positive number of seconds, e.g. 120 or '2min'")
    if spec.vram_budget is not None and spec.vram_budget < 256 << 20:
        raise XoverError("[study] vram-budget must be an amount of GPU memory of at least 256 MiB, e.g. '16GiB'")
    if spec.tune_repetitions < 2:
        raise XoverError("tune-repetitions must be at least 2: telling an effect from noise needs a spread")
    if spec.tune_depths is not None and any(d < 0 for d in spec.tune_depths):
        raise XoverError("tune-depths must be token counts of 0 or more, e.g. [1024]")
    for a, b in spec.pairs:
        for n in (a, b):
            if n not in names:
                raise XoverError(f"pairs: {n!r} is not a configuration; use names from [[config]]: {', '.join(names)}")
    known = {n for pair in TUNE_KNOBS for n in pair}
    for name in (*(spec.tune_knobs or ()), *(k for k, _ in spec.tune_values)):
        if name not in known:
            raise XoverError(
                f"[study] tune: unknown knob {name!r}; use some of "
                + ", ".join(f"{n} ({s})" if s != n else n for n, s in TUNE_KNOBS)
            )


FIT = "fit"


def parse_fit(value: str, where: str) -> str:
    """``n-cpu-moe = "fit"`` (the smallest level that fits the study's longest prompt and response) or
    ``"fit@8k"`` (that fits an 8K context): ``fit`` or ``fit@8192`` in the config's flags until the study
    resolves it with the placement planner (:func:`xover.measure.fit.resolve_fits`)."""
    text = value.strip().lower()
    if text == FIT:
        return FIT
    if text.startswith(FIT + "@"):
        from xover.domain.prompts import parse_length

        try:
            return f"{FIT}@{parse_length(text[len(FIT) + 1 :])}"
        except XoverError:
            pass
    raise XoverError(
        f"{where}: n-cpu-moe must be a non-negative integer, 'fit' or 'fit@LENGTH' (e.g. 'fit@8k'), got {value!r}"
    )


def fit_context(value: str | None) -> int | None | bool:
    """For a config's ``-ncmoe`` value: the context a ``fit@L`` level must hold (L), True for plain ``fit``,
    None when the level is a number."""
    if value is None or not value.startswith(FIT):
        return None
    return int(value.split("@", 1)[1]) if "@" in value else True


def config_from_table(table: Mapping[str, Any], index: int) -> LlamaConfig:
    """One ``[[config]]`` table -> :class:`LlamaConfig`, with one-line errors naming the key."""
    where = f"[[config]] #{index + 1}"
    name = table.get("name")
    if not isinstance(name, str) or not name.strip():
        raise XoverError(f"{where}: give it a name = '...' (used as the column label)")
    where = f"[[config]] {name!r}"
    flags: list[tuple[str, str]] = []
    known = set(SHARED_FLAGS) | {"name", _NOPO.name, "env", "bench-args", "server-args", *_RPC_LOCAL_KEYS}
    for key, value in table.items():
        if key not in known:
            raise XoverError(f"{where}: unknown key {key!r}; use one of {', '.join(sorted(known))}")
        if key not in SHARED_FLAGS:
            continue
        if key == "n-cpu-moe" and isinstance(value, str):
            flags.append((SHARED_FLAGS[key], parse_fit(value, where)))
            continue
        if key == _RPC.name:
            flags.append((SHARED_FLAGS[key], ",".join(parse_rpc(value, where))))
            continue
        if key == _OT.name:
            flags.append((SHARED_FLAGS[key], ",".join(parse_overrides(value, where))))
            continue
        if key == _TS.name:
            flags.append((SHARED_FLAGS[key], parse_tensor_split(value, where)))
            continue
        if key in _INT_KEYS:
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise XoverError(f"{where}: {key} must be a non-negative integer, got {value!r}")
        elif key in _CHOICES:
            if value not in _CHOICES[key]:
                raise XoverError(f"{where}: {key} must be one of {', '.join(_CHOICES[key])}, got {value!r}")
        elif not isinstance(value, str):
            raise XoverError(f"{where}: {key} must be a string, got {value!r}")
        flags.append((SHARED_FLAGS[key], str(value)))
    nopo = table.get(_NOPO.name, False)
    if not isinstance(nopo, bool):
        raise XoverError(f"{where}: no-op-offload must be true or false")
    env = table.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(v, (str, int)) for v in env.values()):
        raise XoverError(f"{where}: env must be a table of NAME = 'value'")
    lists = {}
    for key in ("bench-args", "server-args"):
        v = table.get(key, [])
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise XoverError(f"{where}: {key} must be a list of strings, e.g. ['--mlock']")
        lists[key] = tuple(v)
    rpc_local, rpc_threads = _rpc_local(table, where)
    endpoints = next((tuple(v.split(",")) for f, v in flags if f == _RPC.shared_flag), ())
    flags = [(f, _placed_overrides(v, endpoints, rpc_local, where) if f == _OT.shared_flag else v) for f, v in flags]
    return LlamaConfig(
        name=name.strip(),
        flags=tuple(flags),
        no_op_offload=nopo,
        env=tuple(sorted((k, str(v)) for k, v in env.items())),
        bench_args=lists["bench-args"],
        server_args=lists["server-args"],
        rpc_local=rpc_local,
        rpc_threads=rpc_threads,
    )


_RPC_LOCAL_KEYS = ("rpc-local", "rpc-threads")
_HOST = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\]")


def parse_rpc(value: Any, where: str) -> tuple[str, ...]:
    """``rpc = ["host:port", ...]`` (or one string, comma-separated) -> the endpoints, checked: a host name or
    address and a port of 1-65535 each, none twice."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not items or not all(isinstance(x, str) for x in items):
        raise XoverError(
            f"{where}: rpc must be a list of RPC workers, e.g. rpc = ['192.168.1.10:50052'], got {value!r}"
        )
    endpoints: list[str] = []
    for item in (x.strip() for x in items):
        host, sep, port = item.rpartition(":")
        if not sep or _HOST.fullmatch(host) is None or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise XoverError(
                f"{where}: rpc worker {item!r} is not host:port (e.g. '192.168.1.10:50052', the address and port "
                "ggml-rpc-server listens on)"
            )
        endpoint = f"{host}:{int(port)}"
        if endpoint in endpoints:
            raise XoverError(f"{where}: rpc worker {endpoint!r} is listed twice")
        endpoints.append(endpoint)
    return tuple(endpoints)


def parse_overrides(value: Any, where: str) -> tuple[str, ...]:
    """``override-tensor = ["<regex>=<buffer type>", ...]`` (or one string, comma-separated, as llama-server takes
    it) -> the items, each checked to be a tensor-name pattern and a buffer type."""
    items = value.split(",") if isinstance(value, str) else value
    if not isinstance(items, list | tuple) or not items or not all(isinstance(x, str) for x in items):
        raise XoverError(
            f"{where}: override-tensor must be a list of '<tensor regex>=<buffer type>', e.g. "
            f"['blk\\.[0-9]\\.ffn_.*_exps=CPU'], got {value!r}"
        )
    out = []
    for item in (x.strip() for x in items):
        pattern, sep, buft = item.rpartition("=")
        if not sep or not pattern or not buft or ";" in item:
            raise XoverError(
                f"{where}: override-tensor item {item!r} is not '<tensor regex>=<buffer type>' (a buffer type as "
                "llama.cpp names it: CPU, CUDA0, RPC0[host:port] or RPC0[{rpc0}] for the configuration's first worker)"
            )
        try:
            re.compile(pattern)
        except re.error as e:
            raise XoverError(
                f"{where}: override-tensor pattern {pattern!r} is not a regular expression ({e})"
            ) from None
        out.append(f"{pattern}={buft}")
    return tuple(out)


def _placed_overrides(value: str, endpoints: tuple[str, ...], rpc_local: int, where: str) -> str:
    """Overrides with ``{rpcN}`` replaced by user-run workers' endpoints; for rpc-local workers the slots stay
    until the workers run (:meth:`LlamaConfig.with_rpc`). Every RPC buffer type must name one of the
    configuration's own workers: llama.cpp knows no other."""
    n = len(endpoints) or rpc_local
    for m in _RPC_SLOT.finditer(value):
        if int(m.group(1)) >= n:
            have = f"{n} RPC worker(s)" if n else "no RPC workers (add rpc = ['host:port'] or rpc-local = N)"
            raise XoverError(f"{where}: override-tensor names {m.group(0)}, but the configuration has {have}")
    filled = _fill_rpc_slots(value, endpoints) if endpoints else value
    for m in _RPC_BUFT.finditer(filled):
        if m.group(1) in endpoints or (rpc_local and _RPC_SLOT.fullmatch(m.group(1))):
            continue
        hint = (
            "write RPC0[{rpc0}] for xover's own workers (their ports are chosen when they start)"
            if rpc_local
            else f"its workers are {', '.join(endpoints)}"
            if endpoints
            else "add rpc = ['host:port'] or rpc-local = N"
        )
        raise XoverError(f"{where}: override-tensor buffer type {m.group(0)!r} is not one of its RPC workers: {hint}")
    return filled


def _fill_rpc_slots(value: str, endpoints: tuple[str, ...]) -> str:
    return _RPC_SLOT.sub(lambda m: endpoints[int(m.group(1))], value)


def parse_tensor_split(value: Any, where: str) -> str:
    """``tensor-split = "1/3"`` or ``[1, 3]`` -> llama.cpp's ``1/3`` (one share per device, in its device order)."""
    items = value.split("/") if isinstance(value, str) else value
    ok = isinstance(items, list | tuple) and items
    shares: list[float] = []
    for x in items if ok else ():
        try:
            shares.append(float(x))
        except (TypeError, ValueError):
            ok = False
    if not ok or any(v < 0 for v in shares) or not any(shares) or any(isinstance(x, bool) for x in items):
        raise XoverError(
            f"{where}: tensor-split must give each device's share of the offloaded layers, in llama.cpp's device "
            f"order (RPC workers first), e.g. '1/3' or [1, 3]; got {value!r}"
        )
    return "/".join(f"{v:g}" for v in shares)


def _rpc_local(table: Mapping[str, Any], where: str) -> tuple[int, int | None]:
    """``rpc-local = N`` (RPC workers xover starts on 127.0.0.1) and ``rpc-threads = T`` (threads of each)."""
    n = table.get("rpc-local", 0)
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= 16:
        raise XoverError(f"{where}: rpc-local must be a number of local RPC workers from 0 to 16, got {n!r}")
    threads = table.get("rpc-threads")
    if threads is not None:
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise XoverError(f"{where}: rpc-threads must be a positive number of threads per worker, got {threads!r}")
        if not n:
            raise XoverError(f"{where}: rpc-threads sets the threads of xover's own workers: give rpc-local = N too")
    if n and _RPC.name in table:
        raise XoverError(
            f"{where}: give rpc (workers you run) or rpc-local (workers xover starts), not both in one configuration"
        )
    return n, threads


def _as_list(value: Any, key: str) -> list[Any]:
    if not isinstance(value, list) or not value:
        raise XoverError(f"[study] {key} must be a non-empty list, e.g. [1024, 4096] or ['1k', '4k']")
    return value


def spec_from_dict(doc: Mapping[str, Any], base_dir: Path | None = None) -> StudySpec:
    """A parsed TOML document -> :class:`StudySpec`. Relative model paths resolve against ``base_dir``."""
    known_top = {"model", "study", "config"}
    unknown = set(doc) - known_top
    if unknown:
        raise XoverError(f"unknown section {sorted(unknown)[0]!r}; the spec has [model], [study] and [[config]]")
    model = doc.get("model", {})
    path = model.get("path")
    preset = model.get("preset")
    model_path = None
    if path is not None:
        model_path = Path(str(path)).expanduser()
        if base_dir is not None and not model_path.is_absolute():
            model_path = base_dir / model_path
    study = dict(doc.get("study", {}))
    known_study = {
        "lengths",
        "response-tokens",
        "decode-tokens",
        "repetitions",
        "bench-repetitions",
        "pp",
        "tg",
        "band",
        "max-ttft",
        "cache-length",
        "skip",
        "timeout",
        "session-turns",
        "session-system-tokens",
        "session-target-tokens",
        "session-response-tokens",
        "bench-depths",
        "hardware",
        "tune",
        "tune-knobs",
        "tune-values",
        "tune-depths",
        "tune-repetitions",
        "pairs",
        "vram-budget",
    }
    bad = set(study) - known_study
    if bad:
        raise XoverError(f"[study]: unknown key {sorted(bad)[0]!r}; use one of {', '.join(sorted(known_study))}")
    tables = doc.get("config", [])
    if not isinstance(tables, list):
        raise XoverError("configurations are an array of tables: write each as [[config]]")
    kwargs: dict[str, Any] = {}
    if "lengths" in study:
        kwargs["lengths"] = parse_lengths(study["lengths"], "[study] lengths")
    if "bench-depths" in study:
        kwargs["bench_depths"] = tuple(
            _k(d, "[study] bench-depths") for d in _as_list(study["bench-depths"], "bench-depths")
        )
    if "hardware" in study:
        hw = study["hardware"]
        if not isinstance(hw, str) or not hw.strip():
            raise XoverError("[study] hardware must be 'measure', a profile name such as 'h200', or a .toml file")
        kwargs["hardware"] = str(base_dir / hw) if base_dir is not None and hw.endswith(".toml") else hw
    if "response-tokens" in study:
        rt = study["response-tokens"]
        kwargs["response_tokens"] = tuple(rt) if isinstance(rt, list) else (rt,)
    for key, attr in (
        ("repetitions", "repetitions"),
        ("bench-repetitions", "bench_repetitions"),
        ("pp", "pp"),
        ("tg", "tg"),
    ):
        if key in study:
            if not isinstance(study[key], int) or isinstance(study[key], bool):
                raise XoverError(f"[study] {key} must be an integer")
            kwargs[attr] = study[key]
    if "band" in study:
        band = study["band"]
        if not (isinstance(band, list) and len(band) == 2):
            raise XoverError("[study] band must be [LO, HI], e.g. [10000, 40000]")
        kwargs["band"] = (_k(band[0], "band"), _k(band[1], "band"))
    if "cache-length" in study:
        kwargs["cache_length"] = _k(study["cache-length"], "[study] cache-length")
    if "skip" in study:
        kwargs["skip"] = frozenset(study["skip"])
    if "timeout" in study:
        kwargs["timeout_s"] = float(study["timeout"])
    if "max-ttft" in study:
        kwargs["max_ttft_s"] = _seconds(study["max-ttft"], "[study] max-ttft")
    for key in ("session-turns", "session-response-tokens", "decode-tokens"):
        if key in study:
            if not isinstance(study[key], int) or isinstance(study[key], bool) or study[key] < 1:
                raise XoverError(f"[study] {key} must be a positive integer")
            kwargs[key.replace("-", "_")] = study[key]
    kwargs.update(_tune_keys(study))
    for key in ("session-system-tokens", "session-target-tokens"):
        if key in study:
            kwargs[key.replace("-", "_")] = _k(study[key], f"[study] {key}")
    return StudySpec(
        configs=tuple(config_from_table(t, i) for i, t in enumerate(tables)),
        model_path=model_path,
        model_preset=preset,
        **kwargs,
    )


def _tune_keys(study: Mapping[str, Any]) -> dict[str, Any]:
    """The tuning stage's [study] keys: tune, tune-knobs, tune-values, tune-depths, tune-repetitions, pairs."""
    out: dict[str, Any] = {}
    if "tune" in study:
        if not isinstance(study["tune"], bool):
            raise XoverError("[study] tune must be true or false")
        out["tune"] = study["tune"]
    if "tune-knobs" in study:
        knobs = _as_list(study["tune-knobs"], "tune-knobs")
        if not all(isinstance(k, str) for k in knobs):
            raise XoverError("[study] tune-knobs must be a list of knob names, e.g. ['load-mode', 'ubatch-size']")
        out["tune_knobs"] = tuple(knobs)
    if "tune-values" in study:
        table = study["tune-values"]
        if not isinstance(table, dict):
            raise XoverError(
                "[study] tune-values must be a table of knob = [values], e.g. { ubatch-size = [2048, 4096] }"
            )
        out["tune_values"] = tuple(
            (str(k), tuple(str(v) for v in _as_list(vals, f"tune-values.{k}"))) for k, vals in table.items()
        )
    if "tune-depths" in study:
        depths = study["tune-depths"]
        if not isinstance(depths, list):
            raise XoverError("[study] tune-depths must be a list of token counts, e.g. ['1k'] ([] for depth 0 only)")
        out["tune_depths"] = tuple(_k(d, "[study] tune-depths") for d in depths)
    if "vram-budget" in study:
        from xover.hardware.profiles import parse_bytes

        vb = study["vram-budget"]
        out["vram_budget"] = parse_bytes(str(vb)) if isinstance(vb, (str, int)) and not isinstance(vb, bool) else -1
    if "tune-repetitions" in study:
        if not isinstance(study["tune-repetitions"], int) or isinstance(study["tune-repetitions"], bool):
            raise XoverError("[study] tune-repetitions must be an integer")
        out["tune_repetitions"] = study["tune-repetitions"]
    if "pairs" in study:
        pairs = study["pairs"]
        if not isinstance(pairs, list) or not all(
            isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p) for p in pairs
        ):
            raise XoverError("[study] pairs must be a list of [NAME, NAME], e.g. [['ncmoe=0', 'ncmoe=18']]")
        out["pairs"] = tuple((a, b) for a, b in pairs)
    return out


def load_spec(path: Path) -> StudySpec:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise XoverError(f"cannot read study spec {path}: {e.strerror or e}") from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise XoverError(f"{path} is not valid TOML ({e}); see examples/*.toml") from None
    return spec_from_dict(doc, base_dir=path.parent)


def default_spec() -> StudySpec:
    """The embedded default study: the tiny-moe model on this machine's CPU build, a few minutes on 2 cores.

    On a CPU-only machine ``--n-cpu-moe`` moves nothing, so the default asks the seed's question of a setting that
    really trades prefill for decode on a CPU: flash attention on against off (off decodes this small model
    faster; on prefills faster), with the crossover somewhere in the short prompts. Each configuration is also
    measured at the settings the tuning stage finds best for this machine (ubatch and batch size, threads), so
    the verdict answers at llama.cpp's defaults and tuned, and says what tuning changed, if anything.
    """
    return StudySpec(
        configs=(
            LlamaConfig(name="fa=on", flags=(("-fa", "on"),)),
            LlamaConfig(name="fa=off", flags=(("-fa", "off"),)),
        ),
        model_preset="tiny-moe",
        lengths=(512, 1024, 2048, 4096),
        response_tokens=(200,),
        repetitions=3,
        bench_repetitions=3,
        pp=512,
        tg=128,
        band=(10_000, 40_000),
        cache_length=2048,
        session_turns=4,
        session_system_tokens=512,
        session_target_tokens=4096,
        session_response_tokens=16,
        tune_knobs=("ubatch-size", "batch-size", "threads"),
        tune_values=(("ubatch-size", ("1024", "2048")),),
    )
