"""One configuration: what a configuration asks of llama.cpp. Pure.

A :class:`LlamaConfig` is the engine (the llama.cpp build) it runs on, its placement (``--n-cpu-moe`` or a ``fit``
level, ``-ngl``, ``-ot``, ``-ts``, RPC workers) and its settings, every option by its name in the option table
(:mod:`xover.domain.llama_options`), plus what the table does not know: other environment variables and arguments
passed through to either tool. llama-bench's and llama-server's argument lists, the environment, labels, the
theory's view and the store's key are all derived from it through the table; nothing else describes a
configuration.

Its identity (:attr:`LlamaConfig.key`, the key its measurements are stored under) is derived from what it asks of
llama.cpp, never from a command line: xover's own flags for a measurement (the model's path, ``-c``, ``-np 1
--cache-ram 0``, a cache-lab scenario's flags) are not part of it, so the same configuration measured by llama-bench
and by llama-server, from any directory, is one key.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from xover.domain import llama_options as opts
from xover.domain.option_values import FIT, fill_rpc_slots, fit_context
from xover.errors import XoverError


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _canonical(settings: Iterable[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    values = dict(settings)
    unknown = [n for n in values if n not in opts.BY_NAME]
    if unknown:
        raise XoverError(f"unknown llama.cpp option {unknown[0]!r}; xover knows {', '.join(opts.BY_NAME)}")
    return tuple(sorted(values.items(), key=lambda kv: opts.order(kv[0])))


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    """One named configuration.

    ``settings``: option name -> value, as the table knows each option (a list comma-separated, a switch ``"1"``
    or ``"0"``, ``n-cpu-moe`` possibly ``fit``/``fit@8192`` until the study places it), kept in table order.
    ``env``: environment variables the table does not know; ``bench_args``/``server_args``: arguments passed
    through to one tool. ``rpc_local``/``rpc_threads``: RPC workers xover starts on 127.0.0.1 for it (and each
    one's threads; None: the CPUs shared out); until they run it has no ``rpc`` setting and cannot be measured
    (:meth:`with_rpc`). ``max_context``: the context it is placed for (a resolved ``fit@L`` level); its servers
    get this ``-c`` and prompts longer than it holds are not measured on it. ``url``: a llama-server someone else
    started, whose settings xover does not know. ``backend``: the ggml backend of the build it runs on
    (``cuda``, ``vulkan``...; :data:`xover.domain.llama_options.BACKENDS`); None: its engine's default build,
    whichever backend that has. Engine and backend together name its build (:attr:`build`).
    """

    name: str
    settings: tuple[tuple[str, str], ...] = ()
    engine: str = opts.ENGINE
    backend: str | None = None
    env: tuple[tuple[str, str], ...] = ()
    bench_args: tuple[str, ...] = ()
    server_args: tuple[str, ...] = ()
    rpc_local: int = 0
    rpc_threads: int | None = None
    max_context: int | None = None
    url: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "settings", _canonical(self.settings))
        object.__setattr__(self, "env", tuple(sorted(dict(self.env).items())))
        opts.check_engine(self.engine, self.settings, f"[[config]] {self.name!r}")
        opts.check_backend(self.backend, self.settings, f"[[config]] {self.name!r}")

    # ---- what it asks ------------------------------------------------------------------------------

    def get(self, name: str) -> str | None:
        """The value of setting ``name`` (an option's long name), None where llama.cpp's default applies."""
        return dict(self.settings).get(name)

    def int_value(self, name: str) -> int | None:
        """An integer setting's value, else llama.cpp's documented default as a number (None: ``auto``)."""
        value = self.get(name)
        text = value if value is not None else opts.BY_NAME[name].default
        return int(text) if text.lstrip("-").isdigit() else None

    @property
    def n_cpu_moe(self) -> int:
        """The ``--n-cpu-moe`` level (0 when not set); a ``fit`` level must be placed first."""
        value = self.get(opts.N_CPU_MOE.name)
        if value is not None and value.startswith(FIT):
            raise XoverError(
                f"{self.name}: its n-cpu-moe = {value!r} is not placed yet (the study resolves fit levels)"
            )
        return int(value or 0)

    @property
    def build(self) -> tuple[str, str | None]:
        """The build it runs on: (engine, backend), the backend None for the engine's default build."""
        return (self.engine, self.backend)

    @property
    def fit_request(self) -> int | bool | None:
        """What a ``fit`` placement must hold: a context (``fit@L``), True (plain ``fit``), None (a number)."""
        return fit_context(self.get(opts.N_CPU_MOE.name))

    def holds(self, tokens: int) -> bool:
        """Whether this configuration's context holds ``tokens`` (prompt plus response, or depth plus test)."""
        return self.max_context is None or tokens <= self.max_context

    @property
    def rpc(self) -> tuple[str, ...]:
        """The RPC workers' endpoints (``host:port``) this configuration passes ``--rpc``, in order."""
        value = self.get(opts.RPC.name)
        return tuple(value.split(",")) if value else ()

    # ---- derived configurations ----------------------------------------------------------------------

    def with_values(self, values: Mapping[str, str | None], name: str | None = None) -> LlamaConfig:
        """This configuration with some settings replaced (None: back to llama.cpp's default), optionally renamed."""
        merged = dict(self.settings)
        for key, value in values.items():
            if value is None:
                merged.pop(key, None)
            else:
                merged[key] = value
        return dataclasses.replace(self, name=self.name if name is None else name, settings=tuple(merged.items()))

    def with_env(self, env: Mapping[str, str]) -> LlamaConfig:
        """This configuration with environment variables added (those the table knows become settings)."""
        known = {k: v for k, v in env.items() if k in opts.BY_NAME}
        other = {**dict(self.env), **{k: v for k, v in env.items() if k not in opts.BY_NAME}}
        return dataclasses.replace(self.with_values(known), env=tuple(other.items()))

    def with_rpc(self, endpoints: tuple[str, ...]) -> LlamaConfig:
        """This configuration with its local workers' endpoints as ``--rpc`` (the workers run), and its tensor
        overrides' ``{rpcN}`` replaced by them."""
        if not self.rpc_local or len(endpoints) != self.rpc_local or self.rpc:
            raise XoverError(f"{self.name}: {len(endpoints)} endpoints for {self.rpc_local} rpc-local workers")
        overrides = self.get(opts.OVERRIDE_TENSOR.name)
        values = {opts.RPC.name: ",".join(endpoints)}
        if overrides is not None:
            values[opts.OVERRIDE_TENSOR.name] = fill_rpc_slots(overrides, endpoints)
        return self.with_values(values)

    # ---- identity ------------------------------------------------------------------------------------

    def identity(self) -> dict[str, Any]:
        """What makes two configurations the same: the build (engine and backend), the settings, the environment
        and the arguments passed through; not its name, nor anything xover adds to measure it."""
        out: dict[str, Any] = {
            "engine": self.engine,
            "settings": [list(s) for s in self.settings],
            "env": [list(e) for e in self.env],
            "bench_args": list(self.bench_args),
            "server_args": list(self.server_args),
        }
        if self.backend is not None:  # a configuration of the engine's default build keeps the key it always had
            out["backend"] = self.backend
        if self.url is not None:
            out["url"] = self.url
        return out

    @property
    def key(self) -> str:
        """The key its measurements are stored under (:meth:`identity`'s digest)."""
        return _digest(self.identity())

    @property
    def label(self) -> str:
        return self.name

    # ---- what each tool gets -------------------------------------------------------------------------

    def _measurable(self) -> None:
        if self.rpc_local and not self.rpc:
            raise XoverError(
                f"[[config]] {self.name!r}: its {self.rpc_local} rpc-local worker(s) are not running, so it cannot be "
                "measured (xover study starts them: xover.llamacpp.rpc.local_workers)"
            )
        if self.fit_request is not None:
            raise XoverError(f"[[config]] {self.name!r}: its n-cpu-moe = {self.get('n-cpu-moe')!r} is not placed yet")

    def bench_argv(self) -> tuple[str, ...]:
        """llama-bench's arguments for it (table order: --rpc before -ot), then those passed through."""
        return self._argv("bench")

    def server_argv(self) -> tuple[str, ...]:
        """llama-server's arguments for it (a switch spelled as llama-server takes it), then those passed through."""
        return self._argv("server")

    def _argv(self, tool: str) -> tuple[str, ...]:
        self._measurable()
        args: list[str] = []
        for name, value in self.settings:
            option = opts.BY_NAME[name].for_engine(self.engine)
            args += option.bench_args(value) if tool == "bench" else option.server_args(value)
        return (*args, *(self.bench_args if tool == "bench" else self.server_args))

    def environment(self) -> tuple[tuple[str, str], ...]:
        """The environment both tools run with: the table's environment options among its settings (a switch set to
        1 when on and left out when off: ggml reads such variables for their presence), and ``env``."""
        known = tuple(
            (n, v)
            for n, v in self.settings
            if opts.BY_NAME[n].env and not (opts.BY_NAME[n].kind == "switch" and v == "0")
        )
        return tuple(sorted((*known, *self.env)))

    def llama_server_command(self) -> str:
        """The flags to paste into a llama-server command line."""
        return " ".join(self.server_argv())

    def server_command(self, model: str = "MODEL.gguf") -> str:
        """The llama-server command line to paste, environment first."""
        env = " ".join(f"{k}={v}" for k, v in self.environment())
        return " ".join(p for p in (env, "llama-server -m", model, self.llama_server_command()) if p)

    def dimensions(self) -> dict[str, str]:
        """What it sets, name -> value, for labels: each setting by its short name (``ncmoe``, ``ub``), each other
        environment variable by its name, the arguments passed through under ``--``."""
        dims = {"backend": self.backend} if self.backend is not None else {}
        dims.update({opts.BY_NAME[n].short: v for n, v in self.settings})
        dims.update(self.env)
        if self.bench_args or self.server_args:
            dims["--"] = " ".join((*self.bench_args, *self.server_args))
        return dims


def _token(name: str, value: str | None) -> str:
    if name == "--":
        return f"-- {value}" if value is not None else "(no extra args)"
    return f"{name}={value if value is not None else 'default'}"


def short_labels(configs: Sequence[LlamaConfig]) -> list[str]:
    """A name per configuration made of what differs between them: ``ncmoe=12``, ``ncmoe=18 ub=256``.

    A lone configuration is named by all its settings, or ``default`` when it has none.
    """
    dims = [c.dimensions() for c in configs]
    names = list(dict.fromkeys(name for d in dims for name in d))
    varying = [n for n in names if len({d.get(n) for d in dims}) > 1] if len(configs) > 1 else names
    return [" ".join(_token(n, d.get(n)) for n in varying) or "default" for d in dims]


def common_flags(configs: Sequence[LlamaConfig]) -> str:
    """The settings all configurations share, as llama-bench flags and environment assignments."""
    if not configs:
        return ""
    out: list[str] = []
    first = configs[0]
    for name, value in first.settings:
        if all(c.get(name) == value for c in configs[1:]):
            option = opts.BY_NAME[name]
            out.append(f"{name}={value}" if option.env else " ".join(option.bench_args(value)))
    for name, value in first.env:
        if all(dict(c.env).get(name) == value for c in configs[1:]):
            out.append(f"{name}={value}")
    if first.bench_args and all(c.bench_args == first.bench_args for c in configs[1:]):
        out.append(" ".join(first.bench_args))
    return " ".join(out)


def matrix(
    sweeps: Sequence[tuple[opts.LlamaOption, Sequence[str]]],
    env: Sequence[tuple[str, Sequence[str]]] = (),
    *,
    bench_args: tuple[str, ...] = (),
    server_args: tuple[str, ...] = (),
) -> list[LlamaConfig]:
    """The cartesian product of option values (the first option slowest, each environment variable after them) as
    configurations named by what differs (``xover bench`` and ``xover ttft`` name theirs alike). An option with
    no values is left out."""

    dims: list[list[tuple[str, str]]] = [[(o.name, str(v)) for v in values] for o, values in sweeps if values]
    env_dims = [[(name, v) for v in values] for name, values in env]
    configs = [
        LlamaConfig(name="", bench_args=bench_args, server_args=server_args)
        .with_env(dict(combo[len(dims) :]))
        .with_values(dict(combo[: len(dims)]))
        for combo in itertools.product(*dims, *env_dims)
    ]
    return [dataclasses.replace(c, name=label) for c, label in zip(configs, short_labels(configs))]


def command_configs(
    sweeps: Sequence[tuple[opts.LlamaOption, Sequence[str]]],
    env: Sequence[tuple[str, Sequence[str]]] = (),
    args: Sequence[str] = (),
    tool: str = "server",
) -> list[LlamaConfig]:
    """The configurations a command line asks for: every combination of the swept values, named by what differs
    (:func:`matrix`), with the arguments given after ``--`` for ``tool``: those the option table knows become
    settings of every configuration (``-ngl 99``), the others are passed through to that tool."""
    known, rest = opts.parse_args(args, "bench" if tool == "bench" else "server")
    out = []
    for c in matrix(sweeps, env):
        c = c.with_values({**known, **dict(c.settings)})
        out.append(
            dataclasses.replace(c, bench_args=rest) if tool == "bench" else dataclasses.replace(c, server_args=rest)
        )
    return out


# ---- the stores written before this model: their configuration records, read back --------------------------

_XOVER_SERVER_FLAGS = {"-np": 1, "--cache-ram": 1, "-fit": 1, "-lv": 1, "--cache-reuse": 1, "--slot-save-path": 1}


def from_bench_record(
    label: str, fields: Sequence[Sequence[str]], env: Sequence[Sequence[str]], extra: Sequence[str]
) -> LlamaConfig:
    """A stored llama-bench configuration of a store before schema 3 (its llama-bench ``(flag, value)`` fields,
    environment and pass-through arguments) as the configuration it measured."""
    values, rest = opts.parse_args([*(a for f, v in fields for a in (f, v)), *extra], "bench")
    config = LlamaConfig(name=label, bench_args=rest).with_env(dict((k, v) for k, v in env))
    return config.with_values(values)


def from_server_record(label: str, args: Sequence[str], env: Sequence[Sequence[str]]) -> LlamaConfig:
    """A stored llama-server configuration of a store before schema 3, its argument list with xover's own flags in
    it, as the configuration it served: ``-m`` and ``-c``, the ``-ngl 99`` xover put right after them, ``-np 1
    --cache-ram 0``, ``-fit off`` and a cache-lab scenario's or a session mode's flags are xover's; the rest is the
    configuration's. A server measured at ``--url`` stays that server."""
    args = list(args)
    if args[:1] == ["--url"] and len(args) == 2:
        return LlamaConfig(name=label, url=args[1])
    own: list[str] = []
    if args[:1] in (["-m"], ["--model"]):
        own, args = args[:2], args[2:]
    if args[:1] in (["-c"], ["--ctx-size"]):
        args = args[2:]
    if args[:1] == ["-ngl"]:  # xover's own, placed right after -c (a configuration's -ngl comes after its flags)
        args = args[2:]
    rest: list[str] = []
    i = 0
    while i < len(args):
        n = _XOVER_SERVER_FLAGS.get(args[i])
        if n is not None:
            i += 1 + n
            continue
        rest.append(args[i])
        i += 1
    values, unknown = opts.parse_args(rest, "server")
    del own
    config = LlamaConfig(name=label, server_args=unknown).with_env(dict((k, v) for k, v in env))
    return config.with_values(values)
