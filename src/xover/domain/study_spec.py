"""The study spec (TOML): the model, the named configurations and what to measure. Pure: no I/O except
:func:`load_spec`, which reads one file.

A configuration is written once, with llama.cpp's own option names as keys (the option table,
:mod:`xover.domain.llama_options`), and becomes a :class:`xover.domain.config.LlamaConfig`, from which both
``llama-bench``'s and ``llama-server``'s argument lists are derived.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from xover.domain import llama_options
from xover.domain.command_line import BASELINE, parse_command
from xover.domain.config import LlamaConfig
from xover.domain.option_values import FIT, fit_context, placed_overrides  # noqa: F401 (FIT, fit_context re-exported)
from xover.domain.profiles import builtin, parse_bytes
from xover.domain.prompts import parse_lengths, parse_tokens
from xover.domain.units import format_tokens
from xover.errors import XoverError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

TUNE_KNOBS = llama_options.TUNE_KNOBS
# A study's stages in the order they run: the one list (--remeasure names any of them; the model is always resolved, so
# a spec's skip and --skip name the others: STAGES)
STAGE_ORDER = ("model", "theory", "tune", "bench", "ttft", "cache", "session", "report")
STAGES = STAGE_ORDER[1:]


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
    repetitions: int = 3  # cold TTFT samples per length in each round (each in a fresh server process)
    # Rounds of fresh server processes, in an order that alternates between rounds: at least ``rounds``; more, up to
    # ``max_rounds``, where a verdict is still open (xover.analysis.rounds), while the study's ``budget_s`` lasts
    # (an added round, and the drift check after the last, start only if their last servers' time still fits).
    rounds: int = 3
    max_rounds: int = 8
    budget_s: float | None = None
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
    # Cached agentic turns (xover.analysis.cached): the tokens a turn adds after a context the slot's cache already
    # holds, measured on the cold stage's fresh servers after their cold samples; () measures none. The depth
    # defaults to the replayed session's last cached context (its final size less one turn's new tokens).
    cached_new_tokens: tuple[int, ...] = ()
    cached_depth: int | None = None
    # Chat-shaped prompts (xover.domain.chat_prompts): at this one cold length, each server also sends the prompt as
    # an agent does, many chat messages, so the report can compare the two shapes (None: the shortest length in the
    # band, else the longest; 0: none).
    chat_length: int | None = None
    # The configurations given as a user's own command line (``--baseline``, ``[[config]] command``): (name, the
    # command as given), so the report can show what xover ran of it.
    commands: tuple[tuple[str, str], ...] = ()
    # A recording of the user's own turns (xover record: full, shape-only or --from-log): the study measures what
    # they need (lengths, cached turns and their depth, the answer length, from the recording), replays it as its
    # session and answers in minutes of waiting over its turns (xover.analysis.your_turns).
    workload: Path | None = None

    def __post_init__(self) -> None:
        validate_spec(self)

    @property
    def generated_tokens(self) -> int:
        """Tokens each cold TTFT request generates: ``decode_tokens``, else the longest response (a cached turn
        generates the longest response: its decode is what the cached-turn verdicts use)."""
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

    @property
    def session_sizes(self) -> tuple[int, int]:
        """The replayed session's system prompt and final size (tokens): the spec's, else a quarter of the final
        size (256 to 10K tokens) and the longest length."""
        target = self.session_target_tokens or max(self.lengths)
        return self.session_system_tokens or min(10_240, max(256, target // 4)), target

    @property
    def session_step(self) -> int:
        """The tokens one replayed session turn adds, about: what cached turns default to around."""
        system, target = self.session_sizes
        return max(1, (target - system) // self.session_turns)

    @property
    def turns_depth(self) -> int | None:
        """The cached agentic turns' context in the cache: ``cached_depth``, else the session's last cached
        context; None when no cached turns are measured."""
        if not self.cached_new_tokens:
            return None
        if self.cached_depth is not None:
            return self.cached_depth
        return max(1, self.session_sizes[1] - self.session_step)

    def cached_turns_for(self, config: LlamaConfig) -> tuple[int, ...]:
        """The cached turns' new tokens measured on ``config``: those its context holds after the cached depth, with
        the longest response."""
        depth = self.turns_depth
        if depth is None:
            return ()
        return tuple(n for n in self.cached_new_tokens if config.holds(depth + n + max(self.response_tokens)))

    @property
    def longest_prompt(self) -> int:
        """The most tokens one request of the cold stage prefills: the longest cold prompt, or the largest cached
        turn's new tokens (the cached context is not prefilled again)."""
        return max(max(self.lengths), max(self.cached_new_tokens) if self.turns_depth is not None else 0)

    @property
    def longest_context_need(self) -> int:
        """The most tokens a cold-stage request holds: the longest prompt, or the cached depth and the largest
        turn (without the response)."""
        depth = self.turns_depth
        return max(max(self.lengths), (depth + max(self.cached_new_tokens)) if depth is not None else 0)

    def chat_lengths_for(self, config: LlamaConfig) -> tuple[int, ...]:
        """The length at which ``config``'s servers also send a chat-shaped prompt: ``chat_length``, else the
        shortest of its lengths in the band, else its longest; () with ``chat_length`` 0, no length it holds, or an
        engine whose server cannot make one (:attr:`EngineTraits.chat_prompts`)."""
        lengths = self.lengths_for(config)
        if self.chat_length == 0 or not lengths or not llama_options.traits(config.engine).chat_prompts:
            return ()
        if self.chat_length is not None:
            return (self.chat_length,) if self.chat_length in lengths else ()
        in_band = [L for L in lengths if L >= self.band[0]]
        return (min(in_band) if in_band else max(lengths),)

    def bench_depths_for(self, config: LlamaConfig) -> tuple[int, ...]:
        """llama-bench depths for ``config``: those its context holds with the longer of the pp and tg tests."""
        return tuple(d for d in (self.bench_depths or self.lengths) if config.holds(d + max(self.pp, self.tg)))


def _k(value: Any, what: str) -> int:
    """A token count of 0 or more: ``1k`` (1024), ``32K``, ``4096``."""
    if not isinstance(value, (str, int)) or isinstance(value, bool):
        raise XoverError(f"{what}: {value!r} is not a token count (use e.g. 4096 or 4k)")
    return parse_tokens(value, what, minimum=0)


def parse_duration(value: Any, what: str) -> float:
    """``120``, ``"120s"``, ``"2min"``, ``"4m"``, ``"1h"`` -> seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(s|min|m|h)?\s*", str(value))
    if not m:
        raise XoverError(f"{what}: {value!r} is not a duration (use e.g. 120, '120s', '2min' or '1h')")
    return float(m.group(1)) * {"min": 60, "m": 60, "h": 3600}.get(m.group(2) or "s", 1)


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
    if spec.rounds < 1 or spec.max_rounds < spec.rounds:
        raise XoverError(
            "[study] rounds must be at least 1 and max-rounds at least rounds (e.g. rounds = 3, max-rounds = 8): "
            "a verdict needs 3 rounds of fresh processes"
        )
    if spec.budget_s is not None and spec.budget_s <= 0:
        raise XoverError("[study] budget must be a positive duration, e.g. '20min'")
    if spec.pp < 1 or spec.tg < 1:
        raise XoverError("pp and tg must be at least 1 token")
    if not spec.band[0] < spec.band[1]:
        raise XoverError(f"band {spec.band}: give [LO, HI] with LO < HI")
    unknown = spec.skip - set(STAGES)
    if unknown:
        raise XoverError(f"skip: unknown stage {sorted(unknown)[0]!r}; stages are {', '.join(STAGES)}")
    if spec.hardware not in (None, "measure") and not spec.hardware.endswith(".toml"):
        builtin(spec.hardware)  # an unknown profile fails here, before anything runs
    if spec.timeout_s is not None and spec.timeout_s <= 0:
        raise XoverError("timeout must be a positive number of seconds")
    if spec.max_ttft_s is not None and spec.max_ttft_s <= 0:
        raise XoverError("[study] max-ttft must be a positive number of seconds, e.g. 120 or '2min'")
    if spec.vram_budget is not None and spec.vram_budget < 256 << 20:
        raise XoverError("[study] vram-budget must be an amount of GPU memory of at least 256 MiB, e.g. '16GiB'")
    if spec.tune_repetitions < 2:
        raise XoverError("tune-repetitions must be at least 2: telling an effect from noise needs a spread")
    if any(n < 1 for n in spec.cached_new_tokens) or len(set(spec.cached_new_tokens)) != len(spec.cached_new_tokens):
        raise XoverError("[study] cached-turns must be distinct positive token counts, e.g. ['512', '2k', '8k']")
    if spec.chat_length and spec.chat_length not in spec.lengths:
        lengths = ", ".join(format_tokens(L) for L in spec.lengths)
        raise XoverError(
            f"[study] chat-length {format_tokens(spec.chat_length)} is compared with the cold prompt of that length: "
            f"give one of the lengths ({lengths}), or 'off'"
        )
    if spec.cached_depth is not None and spec.cached_depth < 1:
        raise XoverError("[study] cached-depth must be a positive token count, e.g. '16k'")
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


def config_from_table(table: Mapping[str, Any], index: int) -> LlamaConfig:
    """One ``[[config]]`` table -> :class:`LlamaConfig`, with one-line errors naming the key. Every llama.cpp
    option is a key named as the option table names it (``n-cpu-moe``, ``ubatch-size``, ``no-op-offload``...);
    ``engine`` and ``backend`` name the build it runs on (``backend = "vulkan"``: that engine's Vulkan build);
    ``env`` sets environment variables (those the table knows, such as ``GGML_OP_OFFLOAD_MIN_BATCH``, become
    settings), ``bench-args``/``server-args`` pass arguments through to one tool."""
    where = f"[[config]] #{index + 1}"
    name = table.get("name")
    if not isinstance(name, str) or not name.strip():
        raise XoverError(f"{where}: give it a name = '...' (used as the column label)")
    where = f"[[config]] {name!r}"
    if "command" in table:
        return _config_from_command(table, name.strip(), where)
    keyed = {o.name: o for o in llama_options.OPTIONS if not o.env}
    known = set(keyed) | {"name", "engine", "backend", "env", "bench-args", "server-args", *_RPC_LOCAL_KEYS}
    values: dict[str, str] = {}
    for key, value in table.items():
        if key not in known:
            raise XoverError(f"{where}: unknown key {key!r}; use one of {', '.join(sorted(known))}")
        if key in keyed:
            values[key] = keyed[key].parse(value, where)
    env = table.get("env", {})
    if not isinstance(env, dict) or not all(
        isinstance(v, (str, int)) and not isinstance(v, bool) for v in env.values()
    ):
        raise XoverError(f"{where}: env must be a table of NAME = 'value'")
    lists = {}
    for key in ("bench-args", "server-args"):
        v = table.get(key, [])
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise XoverError(f"{where}: {key} must be a list of strings, e.g. ['--mlock']")
        known_there, _ = llama_options.parse_args(v, "bench" if key == "bench-args" else "server")
        if known_there:
            name = next(iter(known_there))
            raise XoverError(
                f"{where}: {key} sets {name}, an option xover knows: write it as the key {name} = ... instead, so "
                "both llama-bench and llama-server get it"
            )
        lists[key] = tuple(v)
    engine = table.get("engine", llama_options.ENGINE)
    if not isinstance(engine, str):
        raise XoverError(f"{where}: engine must be one of {', '.join(llama_options.ENGINES)}, got {engine!r}")
    backend = table.get("backend")
    if backend is not None and backend not in llama_options.BACKENDS:
        raise XoverError(f"{where}: backend must be one of {', '.join(llama_options.BACKENDS)}, got {backend!r}")
    rpc_local, rpc_threads = _rpc_local(table, where)
    endpoints = tuple(values[llama_options.RPC.name].split(",")) if llama_options.RPC.name in values else ()
    if llama_options.OVERRIDE_TENSOR.name in values:
        ot = llama_options.OVERRIDE_TENSOR.name
        values[ot] = placed_overrides(values[ot], endpoints, rpc_local, where)
    known_env = {k: llama_options.BY_NAME[k].parse(v, where) for k, v in env.items() if k in llama_options.BY_NAME}
    config = LlamaConfig(
        name=name.strip(),
        engine=engine,
        backend=backend,
        bench_args=lists["bench-args"],
        server_args=lists["server-args"],
        rpc_local=rpc_local,
        rpc_threads=rpc_threads,
    )
    return config.with_env({k: str(v) for k, v in env.items() if k not in known_env}).with_values(
        {**values, **known_env}
    )


_RPC_LOCAL_KEYS = ("rpc-local", "rpc-threads")


def _config_from_command(table: Mapping[str, Any], name: str, where: str) -> LlamaConfig:
    """``[[config]] command = "llama-server -m ... -ngl 99 ..."``: the user's own command line as a configuration
    (:func:`xover.domain.command_line.parse_command`); beside it only ``name``, ``engine`` and ``backend``."""
    extra = sorted(set(table) - {"name", "command", "engine", "backend"})
    if extra:
        raise XoverError(f"{where}: {extra[0]!r} beside command: give its flag in the command instead")
    text, engine, backend = table["command"], table.get("engine", llama_options.ENGINE), table.get("backend")
    if not isinstance(text, str):
        raise XoverError(f"{where}: command must be a string, e.g. 'llama-server -m model.gguf -ngl 99'")
    if engine not in llama_options.ENGINES:
        raise XoverError(f"{where}: engine must be one of {', '.join(llama_options.ENGINES)}, got {engine!r}")
    if backend is not None and backend not in llama_options.BACKENDS:
        raise XoverError(f"{where}: backend must be one of {', '.join(llama_options.BACKENDS)}, got {backend!r}")
    return parse_command(text, engine, where=f"{where} command").config(name, backend)


def with_baseline(spec: StudySpec, text: str, engine: str = llama_options.ENGINE) -> StudySpec:
    """``spec`` with the user's own command (``--baseline "llama-server ..."``) as its first configuration, named
    ``yours``, and the verdict's first pair that command against the spec's first configuration."""
    if any(c.name == BASELINE for c in spec.configs):
        raise XoverError(f"--baseline: the spec already has a configuration named {BASELINE!r}: rename it")
    yours = parse_command(text, engine).config(BASELINE)
    first = spec.pairs[0][0] if spec.pairs else spec.configs[0].name
    return dataclasses.replace(
        spec,
        configs=(yours, *spec.configs),
        pairs=((BASELINE, first), *spec.pairs),
        commands=((BASELINE, text), *spec.commands),
    )


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
    if n and llama_options.RPC.name in table:
        raise XoverError(
            f"{where}: give rpc (workers you run) or rpc-local (workers xover starts), not both in one configuration"
        )
    return n, threads


def _as_list(value: Any, key: str) -> list[Any]:
    if not isinstance(value, list) or not value:
        raise XoverError(f"[study] {key} must be a non-empty list, e.g. [1024, 4096] or ['1k', '4k']")
    return value


STUDY_KEYS = frozenset(
    {
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
        "rounds",
        "max-rounds",
        "budget",
        "cached-turns",
        "cached-depth",
        "chat-length",
        "workload",
    }
)  # the [study] table's keys


WORKLOAD_SIZES = ("cached-depth", "cached-turns", "lengths", "response-tokens")  # what a workload decides


def _measure_keys(study: Mapping[str, Any], base_dir: Path | None) -> dict[str, Any]:
    """The [study] keys of what is measured and how often (lengths, depths, repetitions, limits), checked."""
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
        ("rounds", "rounds"),
        ("max-rounds", "max_rounds"),
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
    if "chat-length" in study:
        v = study["chat-length"]
        kwargs["chat_length"] = 0 if v in ("off", 0, False) else _k(v, "[study] chat-length")
    if "workload" in study:
        w = study["workload"]
        if not isinstance(w, str) or not w.strip():
            raise XoverError("[study] workload must be the path of a recording, e.g. 'rec.jsonl' (xover record -o)")
        sized = sorted(k for k in WORKLOAD_SIZES if k in study)
        if sized:
            raise XoverError(f"[study] {sized[0]} is drawn from the workload's turns: drop it, or drop workload")
        kwargs["workload"] = base_dir / w if base_dir is not None and not Path(w).is_absolute() else Path(w)
    if "skip" in study:
        kwargs["skip"] = frozenset(study["skip"])
    if "timeout" in study:
        kwargs["timeout_s"] = float(study["timeout"])
    if "max-ttft" in study:
        kwargs["max_ttft_s"] = parse_duration(study["max-ttft"], "[study] max-ttft")
    if "budget" in study:
        kwargs["budget_s"] = parse_duration(study["budget"], "[study] budget")
    for key in ("session-turns", "session-response-tokens", "decode-tokens"):
        if key in study:
            if not isinstance(study[key], int) or isinstance(study[key], bool) or study[key] < 1:
                raise XoverError(f"[study] {key} must be a positive integer")
            kwargs[key.replace("-", "_")] = study[key]
    return kwargs


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
    bad = set(study) - STUDY_KEYS
    if bad:
        raise XoverError(f"[study]: unknown key {sorted(bad)[0]!r}; use one of {', '.join(sorted(STUDY_KEYS))}")
    tables = doc.get("config", [])
    if not isinstance(tables, list):
        raise XoverError("configurations are an array of tables: write each as [[config]]")
    kwargs: dict[str, Any] = {}
    kwargs.update(_measure_keys(study, base_dir))
    kwargs.update(_tune_keys(study))
    for key in ("session-system-tokens", "session-target-tokens"):
        if key in study:
            kwargs[key.replace("-", "_")] = _k(study[key], f"[study] {key}")
    kwargs.update(_cached_keys(study))
    configs = tuple(config_from_table(t, i) for i, t in enumerate(tables))
    commands = tuple(
        (c.name, str(t["command"])) for c, t in zip(configs, tables) if isinstance(t, dict) and "command" in t
    )
    spec = StudySpec(configs=configs, model_path=model_path, model_preset=preset, commands=commands, **kwargs)
    if study.get("cached-turns") == "session":  # around the replayed session's turn
        spec = dataclasses.replace(spec, cached_new_tokens=default_new_tokens(spec.session_step))
    return spec


def default_new_tokens(step: int) -> tuple[int, ...]:
    """New tokens per cached turn around a session's step (the tokens a turn adds): a quarter of it, it, and four
    times it, each at least 64 tokens."""
    return tuple(sorted({max(64, step // 4), max(64, step), max(64, step * 4)}))


def _cached_keys(study: Mapping[str, Any]) -> dict[str, Any]:
    """``cached-turns`` (new tokens per cached turn; "session" is resolved by the caller) and ``cached-depth``."""
    out: dict[str, Any] = {}
    turns = study.get("cached-turns")
    if turns is not None and turns != "session":
        out["cached_new_tokens"] = tuple(
            _k(n, "[study] cached-turns") for n in _as_list(turns, "cached-turns (or 'session')")
        )
    if "cached-depth" in study:
        out["cached_depth"] = _k(study["cached-depth"], "[study] cached-depth")
    return out


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
    the verdict answers at llama.cpp's defaults and tuned, and says what tuning changed, if anything. Beside the
    cold prompts, cached agentic turns of 128 to 2K new tokens on a 2K-token cached context: the same trade seen
    by a turn whose context is already in the cache.
    """
    return StudySpec(
        configs=(
            LlamaConfig(name="fa=on", settings=(("flash-attn", "on"),)),
            LlamaConfig(name="fa=off", settings=(("flash-attn", "off"),)),
        ),
        model_preset="tiny-moe",
        lengths=(512, 1024, 2048, 4096),
        response_tokens=(200,),
        repetitions=1,
        rounds=3,
        max_rounds=8,
        budget_s=150.0,
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
        cached_new_tokens=(128, 512, 2048),
        cached_depth=2048,
    )
