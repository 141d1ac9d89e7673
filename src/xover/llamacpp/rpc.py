"""RPC workers: llama.cpp's ``ggml-rpc-server`` processes that xover starts, owned like a llama-server.

A worker exposes this host's devices (a CPU build: one ``CPU`` device) to llama.cpp's RPC backend: llama-bench
and llama-server given ``--rpc 127.0.0.1:PORT`` put the offloaded layers (``-ngl``) on it as on a GPU. Each
worker xover starts (:class:`RpcWorker`, a context manager) runs in its own session and dies with xover, even a
SIGKILLed xover (:func:`xover.llamacpp.process.spawn` with ``die_with_parent``), logs to the study's ``logs/``,
listens on 127.0.0.1 only (the RPC protocol is unauthenticated: llama.cpp warns never to expose it), and is
ready when its port accepts a TCP connection and that port is its own. Leaving stops it (SIGTERM to its group,
then SIGKILL) on every way out: success, error, Ctrl-C.

Its provenance (:class:`WorkerInfo`) comes from the startup lines ``ggml-rpc-server`` prints (protocol version,
endpoint, transport, one line per device with its memory). It prints them to stdout without flushing and flushes
at its first accepted connection, so the readiness probe (a connection closed at once; the worker logs
``Accepted client connection`` / ``Client connection closed`` and waits for the next) also brings them into the
log. A worker serves one client at a time, so a configuration's llama process must end before the next one's
starts (every runner of xover's does so).

Workers the user runs elsewhere (``rpc = ["host:port"]``) are only checked for a listening port: their build and
devices are unknown to xover (:func:`check_reachable`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import socket
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from xover.errors import XoverError
from xover.llamacpp import process
from xover.llamacpp.server import LlamaProcess, next_log_path, owns_listening_port

HOST = "127.0.0.1"
FIRST_PORT = 50052  # ggml-rpc-server's own default; xover takes the first free ports from here
_WATCH_S = 0.05
_STARTUP_LINES_S = 5.0  # how long the worker may take to flush its startup lines after the first connection


@dataclasses.dataclass(frozen=True)
class WorkerSpec:
    """One worker: its port, threads of its CPU device (``-t``; None: the worker's default, half the CPUs) and
    environment (``CUDA_VISIBLE_DEVICES`` to give it one GPU of a CUDA host)."""

    port: int
    threads: int | None = None
    env: tuple[tuple[str, str], ...] = ()
    host: str = HOST

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    def to_argv(self, binary: Path) -> list[str]:
        argv = [str(binary), "-H", self.host, "-p", str(self.port)]
        if self.threads is not None:
            argv += ["-t", str(self.threads)]
        return argv


@dataclasses.dataclass(frozen=True)
class WorkerInfo:
    """What a worker is, for provenance: endpoint, binary, its build (xover's build manifest for a worker xover
    started), what it printed at startup (RPC protocol version, transport, devices with their memory), its
    threads and environment, and its log."""

    endpoint: str
    started_by: str  # "xover" or "user"
    binary: str | None = None
    build: str | None = None  # "0c1e570 cpu": the llama.cpp commit and backend of the worker's build
    protocol: str | None = None  # "3.0.0"
    transport: str | None = None  # "TCP"
    devices: tuple[str, ...] = ()  # "CPU: Intel(R) Xeon(R) ... (7936 MiB, 7936 MiB free)"
    threads: int | None = None
    env: tuple[tuple[str, str], ...] = ()
    log: str | None = None

    def describe(self) -> str:
        """One line: ``127.0.0.1:50052, xover's ggml-rpc-server (0c1e570 cpu, RPC 3.0.0, TCP), -t 1; CPU: ...``."""
        if self.started_by == "user":
            return f"{self.endpoint}, run by the user (its build and devices are not known to xover)"
        what = ", ".join(
            x for x in (self.build, f"RPC {self.protocol}" if self.protocol else None, self.transport) if x
        )
        parts = [f"{self.endpoint}, xover's ggml-rpc-server ({what or 'build unknown'})"]
        if self.threads is not None:
            parts.append(f"-t {self.threads}")
        parts += [f"{k}={v}" for k, v in self.env]
        text = ", ".join(parts)
        return text + ("; " + "; ".join(self.devices) if self.devices else "; devices not reported")


_VERSION = re.compile(r"^Starting RPC server v(\S+)")
_TRANSPORT = re.compile(r"^\s+transport\s*:\s*(.+?)\s*$")
_DEVICE = re.compile(r"^\s+(\S+: .+\(\d+ MiB, \d+ MiB free\))\s*$")


def parse_startup(text: str) -> tuple[str | None, str | None, tuple[str, ...]]:
    """``ggml-rpc-server``'s startup lines -> (protocol version, transport, device lines). Pure.

    The lines (ggml/src/ggml-rpc/ggml-rpc.cpp, ``ggml_backend_rpc_start_server``)::

        Starting RPC server v3.0.0
          endpoint       : 127.0.0.1:50052
          local cache    : n/a
        Devices:
          CPU: Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz (7936 MiB, 7936 MiB free)
          transport      : TCP
    """
    version = transport = None
    devices: list[str] = []
    in_devices = False
    for line in text.splitlines():
        if m := _VERSION.match(line):
            version = m.group(1)
        elif line.strip() == "Devices:":
            in_devices = True
        elif m := _TRANSPORT.match(line):
            transport = m.group(1)
            in_devices = False
        elif in_devices and (m := _DEVICE.match(line)):
            devices.append(m.group(1))
    return version, transport, tuple(devices)


def port_is_free(port: int, host: str = HOST) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_ports(n: int, first: int = FIRST_PORT, preferred: Sequence[int] = ()) -> tuple[int, ...]:
    """``n`` free ports: worker i keeps ``preferred[i]`` where it is free (a resumed study's configurations keep
    their ``--rpc``, part of what identifies them), the others take the first free ports from ``first`` up."""
    found: list[int | None] = [
        p if p not in preferred[:i] and port_is_free(p) else None for i, p in enumerate(preferred[:n])
    ]
    found += [None] * (n - len(found))
    port = first
    for i in range(n):
        while found[i] is None:
            if port > 65535:
                raise XoverError(f"no {n} free TCP ports on {HOST} from {first} up")
            if port not in found and port_is_free(port):
                found[i] = port
            port += 1
    return tuple(p for p in found if p is not None)


def accepts(host: str, port: int, timeout_s: float = 1.0) -> bool:
    """Whether ``host:port`` accepts a TCP connection (closed at once)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def check_reachable(endpoints: Sequence[str], timeout_s: float = 3.0) -> None:
    """Fail early, in one line, when a user-run worker does not accept connections."""
    for endpoint in endpoints:
        host, _, port = endpoint.rpartition(":")
        if not accepts(host.strip("[]"), int(port), timeout_s):
            raise XoverError(
                f"RPC worker {endpoint} does not accept connections: start `ggml-rpc-server -H HOST -p {port}` "
                "there (a llama.cpp build with -DGGML_RPC=ON), or use rpc-local = N for workers xover starts"
            )


def log_path_for(log_dir: Path, port: int) -> Path:
    """``logs/rpc-worker-<port>-<n>.log``."""
    return next_log_path(log_dir, f"rpc-worker-{port}")


class RpcWorker(LlamaProcess[WorkerSpec]):
    """A running ``ggml-rpc-server``: ``with RpcWorker(binary, spec, log_dir) as w`` -> ``w.info``, ``w.pid``."""

    def __init__(
        self,
        binary: Path,
        spec: WorkerSpec,
        log_dir: Path,
        *,
        build: str | None = None,
        startup_timeout_s: float = 30.0,
    ) -> None:
        super().__init__(binary, spec, log_dir, startup_timeout_s)
        self.build = build
        self.info = WorkerInfo(spec.endpoint, "xover")

    def __enter__(self) -> RpcWorker:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._start()
            self._wait_ready()
            self.info = self._read_info()
        except XoverError as e:
            self._stop()
            raise self.failed(f"RPC worker {self.spec.endpoint}", e) from None
        except BaseException:
            self._stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop()

    def _start(self) -> None:
        argv = self.spec.to_argv(self.binary)
        self.log_path = log_path_for(self.log_dir, self.spec.port)
        self.proc = process.spawn_logged(argv, self.log_path, dict(self.spec.env))

    def _check_alive(self) -> None:
        assert self.proc is not None
        code = self.proc.poll()
        if code is not None:
            raise XoverError(f"exited with code {code} while starting")

    def _wait_ready(self) -> None:
        """The port accepts a connection and the listening socket is this process's (not another program's that
        took the port between choosing it and the worker binding it)."""
        assert self.proc is not None
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            self._check_alive()
            if owns_listening_port(self.proc.pid, self.spec.port) is not False and accepts(
                self.spec.host, self.spec.port, timeout_s=0.5
            ):
                return
            if time.monotonic() >= deadline:
                raise XoverError(f"did not accept connections within {self.startup_timeout_s:.0f} s")
            time.sleep(_WATCH_S)

    def _read_info(self) -> WorkerInfo:
        """Its startup lines, flushed when it accepted the readiness probe (a few ms later)."""
        assert self.log_path is not None
        deadline = time.monotonic() + _STARTUP_LINES_S
        text = ""
        while time.monotonic() < deadline:
            text = self.log_path.read_text(errors="replace")
            if "Accepted client connection" in text:
                break
            self._check_alive()
            time.sleep(_WATCH_S)
        version, transport, devices = parse_startup(text)
        return WorkerInfo(
            endpoint=self.spec.endpoint,
            started_by="xover",
            binary=str(self.binary),
            build=self.build,
            protocol=version,
            transport=transport,
            devices=devices,
            threads=self.spec.threads,
            env=self.spec.env,
            log=str(self.log_path),
        )

    def _stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            process.stop(proc)
            self.proc = proc  # kept for inspection (pid, return code)


_active: list[WorkerInfo] = []


def active() -> tuple[WorkerInfo, ...]:
    """The workers this process runs or was told of, now (provenance records them with every run)."""
    return tuple(_active)


@contextlib.contextmanager
def running(
    specs: Sequence[WorkerSpec],
    binary: Path,
    log_dir: Path,
    *,
    build: str | None = None,
    user_endpoints: Sequence[str] = (),
) -> Iterator[tuple[WorkerInfo, ...]]:
    """Start every worker of ``specs`` (and check that the user's ``user_endpoints`` accept connections), yield
    their :class:`WorkerInfo`, stop them all on the way out, whichever it is."""
    check_reachable(user_endpoints)
    with contextlib.ExitStack() as stack:
        infos = [stack.enter_context(RpcWorker(binary, s, log_dir, build=build)).info for s in specs]
        infos += [WorkerInfo(e, "user") for e in user_endpoints]
        _active.extend(infos)
        try:
            yield tuple(infos)
        finally:
            for info in infos:
                _active.remove(info)


_VISIBLE = {"cuda": "CUDA_VISIBLE_DEVICES", "hip": "HIP_VISIBLE_DEVICES"}


def visible_devices_variable(backend: str | None) -> str | None:
    """The variable that limits a GPU build's processes to some GPUs (None: a CPU build)."""
    return _VISIBLE.get(backend or "")


def worker_gpus(n_workers: int, host_visible: str | None, n_gpus: int) -> tuple[str, ...]:
    """The GPU each local worker sees. Pure. Where this host's llama processes are limited to some GPUs (xover run
    with ``CUDA_VISIBLE_DEVICES=0``) and the machine has others, the workers get those others in turn, so a worker
    is another card as on another host; otherwise worker ``i`` gets GPU ``i``."""
    host = {v.strip() for v in host_visible.split(",") if v.strip()} if host_visible else None
    rest = [str(i) for i in range(n_gpus) if host is not None and str(i) not in host]
    if rest:
        return tuple(rest[i % len(rest)] for i in range(n_workers))
    return tuple(str(i) for i in range(n_workers))


def cuda_env(gpu: str, backend: str | None) -> tuple[tuple[str, str], ...]:
    """A worker's environment on a GPU build: it sees ``gpu`` only (its own device, as on another host); on a CPU
    build nothing (each worker is a CPU worker)."""
    var = visible_devices_variable(backend)
    return ((var, gpu),) if var is not None else ()
