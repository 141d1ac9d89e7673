"""How the values of the llama.cpp options that are more than a number or a name are written and checked: an
``--n-cpu-moe`` level or a ``fit`` placement, RPC workers, tensor overrides, a tensor split. Pure.

Each parser takes a value as written in a study spec (a TOML value) and a ``where`` for its one-line error, and
returns the setting's text as llama-server takes it. The option table (:mod:`xover.domain.llama_options`) names
the parser of each such option.
"""

from __future__ import annotations

import re
from typing import Any

from xover.errors import XoverError

FIT = "fit"
# In an override's buffer type, {rpc0}, {rpc1}, ... stand for the configuration's workers' endpoints (rpc-local
# workers get their ports only when they start): "exps=RPC0[{rpc0}]" is the first device of the first worker.
RPC_SLOT = re.compile(r"\{rpc(\d+)\}")
RPC_BUFT = re.compile(r"RPC\d+\[([^\]]*)\]")
_HOST = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\]")
_LENGTH = re.compile(r"^\s*(\d+)\s*([kK]?)\s*$")


def parse_n_cpu_moe(value: Any, where: str) -> str:
    """A level (a non-negative integer), ``"fit"`` (the smallest level that fits the study's longest prompt and
    response) or ``"fit@8k"`` (that fits an 8K context): ``fit`` or ``fit@8192`` until the study resolves it with
    the placement planner (:func:`xover.measure.fit.resolve_fits`)."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return str(value)
    text = value.strip().lower() if isinstance(value, str) else ""
    if text.isdigit():
        return str(int(text))
    if text == FIT:
        return FIT
    if text.startswith(FIT + "@"):
        m = _LENGTH.match(text[len(FIT) + 1 :])
        if m and int(m.group(1)):
            return f"{FIT}@{int(m.group(1)) * (1024 if m.group(2) else 1)}"
    raise XoverError(
        f"{where}: n-cpu-moe must be a non-negative integer, 'fit' or 'fit@LENGTH' (e.g. 'fit@8k'), got {value!r}"
    )


def fit_context(value: str | None) -> int | None | bool:
    """For an ``n-cpu-moe`` setting: the context a ``fit@L`` level must hold (L), True for plain ``fit``, None
    when the level is a number."""
    if value is None or not value.startswith(FIT):
        return None
    return int(value.split("@", 1)[1]) if "@" in value else True


def parse_rpc(value: Any, where: str) -> str:
    """``rpc = ["host:port", ...]`` (or one string, comma-separated) -> the endpoints, checked (a host name or
    address and a port of 1-65535 each, none twice), comma-joined."""
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
    return ",".join(endpoints)


def parse_overrides(value: Any, where: str) -> str:
    """``override-tensor = ["<regex>=<buffer type>", ...]`` (or one string, comma-separated, as llama-server takes
    it) -> the items, each checked to be a tensor-name pattern and a buffer type, comma-joined."""
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
    return ",".join(out)


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


def fill_rpc_slots(value: str, endpoints: tuple[str, ...]) -> str:
    """Overrides with ``{rpcN}`` replaced by the N-th worker's endpoint."""
    return RPC_SLOT.sub(lambda m: endpoints[int(m.group(1))], value)


def placed_overrides(value: str, endpoints: tuple[str, ...], rpc_local: int, where: str) -> str:
    """Overrides with ``{rpcN}`` replaced by user-run workers' endpoints; for rpc-local workers the slots stay until
    the workers run. Every RPC buffer type must name one of the configuration's own workers: llama.cpp knows no
    other."""
    n = len(endpoints) or rpc_local
    for m in RPC_SLOT.finditer(value):
        if int(m.group(1)) >= n:
            have = f"{n} RPC worker(s)" if n else "no RPC workers (add rpc = ['host:port'] or rpc-local = N)"
            raise XoverError(f"{where}: override-tensor names {m.group(0)}, but the configuration has {have}")
    filled = fill_rpc_slots(value, endpoints) if endpoints else value
    for m in RPC_BUFT.finditer(filled):
        if m.group(1) in endpoints or (rpc_local and RPC_SLOT.fullmatch(m.group(1))):
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
