"""llama-server lifecycle: one configuration, one process, never left behind.

:class:`LlamaServer` is an async context manager. Entering starts ``llama-server`` in its own
session (:func:`xover.llamacpp.process.spawn`) on 127.0.0.1 and a free port, logs to a file in
the study directory, waits for ``/health`` to answer 200 (503 while loading) while watching for
an early exit, and reads ``/props`` and ``/v1/models``. Leaving stops it (SIGTERM to its group,
then SIGKILL) whatever the way out: success, error, cancellation or Ctrl-C.

Controlled runs pass every option that matters explicitly: ``-c`` sized to the longest prompt plus
the response plus a margin, ``-ngl``, and ``-fit off`` where the binary has ``-fit`` (it would
otherwise change unset options to fit free memory). Cold measurements also need ``-np 1
--cache-ram 0``: with several slots or the host-memory prompt cache, a prompt seen before can come
back from a cache even with ``cache_prompt: false`` elsewhere, and saving the previous slot to
host memory is counted in the next request's TTFT.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import os
import re
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, Generic, TypeVar

from xover.client.chat import ChatClient
from xover.client.http import LlamaClient, wait_healthy
from xover.domain import llama_options
from xover.domain.config import LlamaConfig
from xover.errors import XoverError
from xover.llamacpp import process

HOST = "127.0.0.1"
CONTEXT_MARGIN = 256  # tokens beyond prompt + response (BOS, warm-up), and the rounding unit of -c
_BIND_ATTEMPTS = 3
_WATCH_S = 0.05  # how often the process is checked while waiting for it
_NGL = frozenset(llama_options.BY_NAME["n-gpu-layers"].server)  # -ngl's llama-server spellings
_OWN_PORT_S = 10.0  # how long a healthy answer from a port this process does not hold may take to explain itself
_LOG_WATCH_S = 0.25  # how often a running server's log is read for ggml's abort line


def context_size(max_prompt_tokens: int, response_tokens: int, margin: int = CONTEXT_MARGIN) -> int:
    """``-c`` for prompts up to ``max_prompt_tokens`` with ``response_tokens`` back, rounded up to ``margin``."""
    need = max_prompt_tokens + response_tokens + margin
    return -(-need // margin) * margin


@dataclasses.dataclass(frozen=True)
class ServerLaunch:
    """One llama-server process: a configuration (:class:`xover.domain.config.LlamaConfig`) and the flags xover adds
    to measure it, which are not part of the configuration's identity.

    xover's own flags come first: the model, ``-c``, ``-ngl 99`` unless the configuration sets ``-ngl`` (llama-server
    warns about a repeated ``-ngl``), ``-np 1 --cache-ram 0`` with ``cold_cache`` (one slot, no host-memory prompt
    cache: what a proven-cold measurement needs; ``False`` leaves llama-server's defaults, several slots and an
    8 GiB prompt cache, which exist to show that they leak warm caches), ``-fit off`` where the binary has it, and
    ``own_args`` (a cache-lab scenario's or a session mode's flags). The configuration's arguments follow, so they
    override xover's (llama.cpp takes the last value); host and port come last. The configuration's environment is
    set for the server process only; ``log_verbosity`` (``-lv``; 4 logs llama.cpp's buffer sizes) is xover's.
    ``label`` names its log file (default: the configuration's name).
    """

    config: LlamaConfig
    model: Path
    ctx_size: int
    cold_cache: bool = True
    fit_off: bool = True  # pass "-fit off"; set False for builds that have no -fit
    own_args: tuple[str, ...] = ()
    log_verbosity: int | None = None
    n_gpu_layers: int = 99
    label: str | None = None

    @property
    def name(self) -> str:
        return self.label or self.config.name

    def args(self) -> tuple[str, ...]:
        """The whole argument list but for the binary, host and port."""
        a = ["-m", str(self.model), "-c", str(self.ctx_size)]
        if self.config.get(llama_options.N_GPU_LAYERS.name) is None and not _NGL.intersection(self.config.server_args):
            a += ["-ngl", str(self.n_gpu_layers)]
        for flag, value in self.controls():
            a += [flag, value]
        engine = llama_options.traits(self.config.engine)
        return (*a, *engine.server_args, *self.own_args, *self.config.server_argv())

    def controls(self) -> tuple[tuple[str, str], ...]:
        """llama-server's own defaults that xover overrides for control, as (flag, value): one slot and no host
        prompt cache for proven-cold samples (several slots and an 8 GiB cache otherwise hide warm caches), and
        ``-fit off`` (its fitter would move layers and context that the configuration leaves at their defaults)."""
        owned: list[tuple[str, str]] = []
        if self.cold_cache:
            owned += [("-np", "1"), ("--cache-ram", "0")]
        if self.fit_off and llama_options.traits(self.config.engine).server_fit:
            owned.append(("-fit", "off"))
        return tuple(owned)

    def to_argv(self, binary: Path, port: int) -> list[str]:
        lv = self.log_verbosity is not None and llama_options.traits(self.config.engine).server_log_verbosity
        verbosity = ["-lv", str(self.log_verbosity)] if lv else []
        return [str(binary), *self.args(), *verbosity, "--host", HOST, "--port", str(port)]

    @property
    def env(self) -> tuple[tuple[str, str], ...]:
        return self.config.environment()


def check_explicit_context(extra_args: tuple[str, ...] | list[str], need: int, where: str = "after `--`") -> None:
    """Fail early when llama-server arguments set ``-c``/``--ctx-size`` below ``need`` tokens (every
    request would be refused); ``-c 0`` (the model's own context) is checked by the caller."""
    args = list(extra_args)
    for i, a in enumerate(args):
        flag, _, inline = a.partition("=")
        if flag not in ("-c", "--ctx-size"):
            continue
        value = inline or (args[i + 1] if i + 1 < len(args) else "")
        try:
            n = int(value)
        except ValueError:
            raise XoverError(f"{flag} {value!r} {where} is not a token count: give an integer, e.g. -c 8192") from None
        if 0 < n < need:
            raise XoverError(
                f"{flag} {n} {where} is shorter than the longest prompt plus response ({need} tokens): "
                f"raise it to at least {need} or drop it (xover sizes -c itself)"
            )


@functools.lru_cache(maxsize=16)
def help_text(binary: Path) -> str:
    try:
        out = subprocess.run([str(binary), "--help"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        raise XoverError(f"cannot run {binary} --help ({e}): check --llama-bin-dir") from None
    return out.stdout + out.stderr


def help_default(help: str, flag: str) -> str | None:
    """The default ``--help`` states for ``flag`` (``-np``: ``-1``, ``--cache-ram``: ``8192``, ``-fit``: ``on``):
    the first ``default: X`` in the entry that names the flag; None where the help has no such entry or states
    none. An entry begins at a line that starts, at most a few spaces in, with a flag (llama.cpp's help starts at
    the margin, ik_llama.cpp's two spaces in) and runs on through the more deeply indented lines below it."""
    entries: list[list[str]] = []
    for line in help.splitlines():
        text = line.lstrip()
        if text.startswith("-") and len(line) - len(text) < 8:
            entries.append([line])
        elif entries and text and len(line) - len(text) >= 8:
            entries[-1].append(line)
    for entry in entries:
        names = re.split(r"\s{2,}(?=[^-\s])", entry[0].strip(), maxsplit=1)[0]  # the flags, before the description
        if flag in (n.strip().split(" ")[0] for n in names.split(",")):
            found = re.search(r"default:\s*'?([^',)\s]+)", " ".join(entry))
            return found.group(1) if found else None
    return None


def overridden_defaults(spec: ServerLaunch, binary: Path) -> list[dict[str, str | None]]:
    """Each of llama-server's defaults that xover overrides for ``spec`` (:meth:`ServerLaunch.controls`), with the
    value xover gives and the default ``binary --help`` states for it (None: the help states none): provenance that
    says what a user's plain ``llama-server`` would have run instead."""
    text = help_text(binary) if spec.controls() else ""
    return [{"flag": f, "value": v, "default": help_default(text, f)} for f, v in spec.controls()]


def has_flag(binary: Path, flag: str) -> bool:
    """Whether ``binary --help`` lists ``flag`` (e.g. ``-fit``), so options are only passed where they exist."""
    return re.search(rf"(^|[\s,]){re.escape(flag)}([\s,=]|$)", help_text(binary), re.M) is not None


def buffer_log_verbosity(binary: Path) -> int | None:
    """The ``-lv`` level at which llama-server's load log names every buffer and its size (CUDA0 compute, CUDA_Host,
    CPU_REPACK...): 4 where the binary takes ``-lv``, else None (pass nothing)."""
    return 4 if has_flag(binary, "-lv") else None


def parse_build_info(build_info: object) -> dict[str, object]:
    """``/props`` ``build_info`` (``b<number>-<commit>``) as provenance's ``build_number``/``build_commit``."""
    m = re.fullmatch(r"b(\d+)-(\S+)", str(build_info or ""))
    if not m:
        return {}
    return {"build_number": int(m.group(1)), "build_commit": m.group(2)}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _listening_inodes(port: int) -> set[str] | None:
    """Socket inodes listening on TCP ``port`` (Linux ``/proc/net``); None where that cannot be read."""
    found: set[str] = set()
    readable = False
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        readable = True
        for line in lines:
            f = line.split()
            if len(f) > 9 and f[3] == "0A" and int(f[1].rsplit(":", 1)[1], 16) == port:  # 0A: LISTEN
                found.add(f[9])
    return found if readable else None


def owns_listening_port(pid: int, port: int) -> bool | None:
    """Whether process ``pid`` holds the socket listening on ``port``; None when it cannot be told."""
    inodes = _listening_inodes(port)
    if inodes is None:
        return None
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return None
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:[") and target[8:-1] in inodes:
            return True
    return False


def _slug(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", label).strip("_") or "server"


def next_log_path(log_dir: Path, stem: str) -> Path:
    """``log_dir/<stem>-<n>.log``: the first n whose name is taken nowhere under ``log_dir`` (its subfolders
    included: a lent machine's logs kept per lease), so every start of a llama process keeps its own log and name."""
    taken = {p.name for p in log_dir.rglob(f"{stem}-*.log")} if log_dir.is_dir() else set()
    n = 1
    while (path := log_dir / f"{stem}-{n}.log").name in taken:
        n += 1
    return path


def log_path_for(log_dir: Path, label: str) -> Path:
    """``logs/server-<label>-<n>.log``."""
    return next_log_path(log_dir, f"server-{_slug(label)}")


# llama.cpp's src/llama.cpp: "%s: using device %s (%s) (%s) - %zu MiB free" (name, description, id); a
# description may hold parentheses of its own (lavapipe's "llvmpipe (LLVM 15.0.6, 256 bits)")
_USING_DEVICE = re.compile(r"using device (?P<name>\S+) \((?P<desc>.*)\) \([^()]*\) - \d+ MiB free")


def logged_devices(path: Path) -> tuple[tuple[str, str], ...]:
    """The devices a llama-server's log says its model uses (``llama_model_load_from_file_impl: using device
    Vulkan0 (NVIDIA H200) ...``), as (name, description), in order; none for a process that found no accelerator."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ()
    found = {m.group("name"): m.group("desc") for m in _USING_DEVICE.finditer(text)}
    return tuple(found.items())


def device_problem(log: Path | None, backend: str | None) -> tuple[str | None, tuple[tuple[str, str], ...]]:
    """Whether a llama-server ran where its build's ``backend`` should (:func:`llama_options.backend_problem` on the
    devices its log names): the one-line problem or None, and the devices (:func:`logged_devices`)."""
    devices = logged_devices(log) if log is not None else ()
    return llama_options.backend_problem(
        backend, llama_options.ran_on_server([d for d, _ in devices]), "llama-server"
    ), devices


def log_tail(path: Path, lines: int = 3, max_chars: int = 400) -> str:
    """The last non-empty lines of a log, on one line."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    tail = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
    return (" | ".join(tail) or "(empty log)")[-max_chars:]


_ERROR_LINE = re.compile(r"^[\d.]+ E |\b(error|failed|invalid|insufficient|out of memory)\b", re.I)
_LOG_STAMP = re.compile(r"^[\d.]+ [A-Z] +")


def first_error(path: Path, max_chars: int = 300) -> str | None:
    """The first error line of a log (llama.cpp's ``E`` level, or one that says error/failed/invalid),
    without its timestamp: usually the cause, where the last lines are its consequences."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if not line.startswith("$ ") and _ERROR_LINE.search(line):
            return _LOG_STAMP.sub("", line.strip())[:max_chars]
    return None


S = TypeVar("S")


class LlamaProcess(Generic[S]):
    """A llama.cpp program xover starts (:class:`LlamaServer`, :class:`xover.llamacpp.rpc.RpcWorker`): ``binary``
    run as ``spec`` says, given ``startup_timeout_s`` to be ready, its log a new file in ``log_dir``. ``proc`` is
    its process once started (kept after it stops, for its pid and return code), ``log_path`` its log."""

    def __init__(self, binary: Path, spec: S, log_dir: Path, startup_timeout_s: float) -> None:
        self.binary = binary
        self.spec = spec
        self.log_dir = log_dir
        self.startup_timeout_s = startup_timeout_s
        self.proc: subprocess.Popen[Any] | None = None
        self.log_path: Path | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def failed(self, what: str, error: XoverError) -> XoverError:
        """``error`` as the one line that says ``what`` failed to start: with the first error its log shows and
        the log's last lines."""
        where = "no log"
        if self.log_path is not None:
            tail = log_tail(self.log_path)
            first = first_error(self.log_path)
            cause = f"first error: {first}; " if first and first not in tail else ""
            where = f"{cause}log tail: {tail} ({self.log_path})"
        return XoverError(f"{what} {error}; {where}")


class LlamaServer(LlamaProcess[ServerLaunch]):
    """A running llama-server for one :class:`ServerLaunch`: ``async with LlamaServer(...) as srv``.

    Inside: ``srv.url``, ``srv.client`` (a :class:`ChatClient`: a :class:`LlamaClient` that also speaks chat), ``srv.props`` (``/props``),
    ``srv.model_meta`` (``/v1/models`` ``meta``: ``n_vocab``, ``n_ctx_train``...), ``srv.pid``,
    ``srv.log_path``.
    """

    def __init__(self, binary: Path, spec: ServerLaunch, log_dir: Path, *, startup_timeout_s: float = 600.0) -> None:
        super().__init__(binary, spec, log_dir, startup_timeout_s)
        self.client: ChatClient | None = None
        self.url = ""
        self.props: dict[str, Any] = {}
        self.model_meta: dict[str, Any] = {}
        self.crash: str | None = None  # ggml's abort line, once the server printed one (see _watch_log)
        self._running = False
        self._watch: asyncio.Future[None] | None = None

    async def __aenter__(self) -> LlamaServer:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        try:
            for attempt in range(1, _BIND_ATTEMPTS + 1):
                port = free_port()
                client = self._start(port)
                try:
                    await self._wait_ready(client, port)
                    break
                except _PortTakenError:
                    await self._stop()
                    if attempt == _BIND_ATTEMPTS:
                        raise XoverError(f"could not bind a free port on {HOST} in {_BIND_ATTEMPTS} tries") from None
            assert self.client is not None
            self.props = await self.client.get_json("/props")
            models = await self.client.get_json("/v1/models")
            data = models.get("data") if isinstance(models, dict) else None
            self.model_meta = dict(data[0].get("meta") or {}) if isinstance(data, list) and data else {}
        except XoverError as e:
            await self._stop()
            raise self.failed(f"llama-server ({self.spec.name})", e) from None
        except BaseException:
            await self._stop()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stop()

    def _start(self, port: int) -> ChatClient:
        process.ready_to_start()  # under a VRAM budget: the previous llama process's memory is back first
        argv = self.spec.to_argv(self.binary, port)
        self.log_path = log_path_for(self.log_dir, self.spec.name)
        self.proc = process.spawn_logged(argv, self.log_path, dict(self.spec.env))
        self._running = True
        self.crash = None
        self._watch = asyncio.ensure_future(self._watch_log(self.proc, self.log_path))
        self.url = f"http://{HOST}:{port}"
        self.client = ChatClient(self.url, explain=self._crash_note)
        return self.client

    async def _watch_log(self, proc: subprocess.Popen[Any], log: Path) -> None:
        """While the server runs: at ggml's abort line in its log (:func:`xover.llamacpp.process.fatal_line`),
        ``crash`` says so, and a server that has not exited :data:`~xover.llamacpp.process.ABORT_GRACE_S` later
        (hung in its backtrace) is stopped, which ends the request in flight with that reason. A server that exits
        while running has its group stopped at once: a child it left there would keep the request waiting."""
        offset = 0
        while proc.poll() is None:
            await asyncio.sleep(_LOG_WATCH_S)
            offset, line = _fatal_after(log, offset)
            if line is None:
                continue
            self.crash = line
            deadline = time.monotonic() + process.ABORT_GRACE_S
            while proc.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(_WATCH_S)
            if proc.poll() is None:
                self.crash = f"{line}; it hung there, stopped after {process.ABORT_GRACE_S:g} s"
            break
        if self.crash is None:
            self.crash = _fatal_after(log, offset)[1]  # lines written as it exited
        # Exited or hung: its group goes now, not when the request ends, because what the server left in its group (a
        # backtrace's fork) keeps the request's connection open.
        await asyncio.to_thread(process.stop, proc)
        self._running = False  # stopped: _stop has nothing left to stop

    def _crash_note(self) -> str | None:
        """Why a request failed, from the server's side: its abort line, if its log has one."""
        if self.crash is None and self.log_path is not None:
            self.crash = _fatal_after(self.log_path, 0)[1]  # it exited before the watch read its last lines
        return None if self.crash is None else f"llama-server aborted: {self.crash}"

    async def _wait_ready(self, client: LlamaClient, port: int) -> None:
        """``/health`` answers 200 from *this* process, or raise.

        The process is watched while a ``/health`` request is pending, so an exit is seen at once even
        when something else holds the port and never answers. After a 200, the listening socket must
        belong to this process: when another program took the port between :func:`free_port` and the
        bind, the 200 came from it, and measuring it would store another server's numbers.
        """
        health = asyncio.ensure_future(wait_healthy(client, self.startup_timeout_s, check_alive=self._check_alive))
        try:
            while not health.done():
                await asyncio.wait({health}, timeout=_WATCH_S)
                if not health.done():
                    self._check_alive()
            health.result()
        finally:
            if not health.done():
                health.cancel()
                with contextlib.suppress(BaseException):
                    await health
        deadline = time.monotonic() + _OWN_PORT_S
        while True:
            self._check_alive()  # a server that failed to bind exits: _PortTakenError
            assert self.proc is not None
            if owns_listening_port(self.proc.pid, port) is not False:  # True, or cannot tell (no /proc)
                return
            if time.monotonic() >= deadline:
                raise _PortTakenError
            await asyncio.sleep(_WATCH_S)

    def _check_alive(self) -> None:
        assert self.proc is not None and self.log_path is not None
        if self.crash is not None:
            raise XoverError(f"aborted while starting: {self.crash}")
        code = self.proc.poll()
        if code is None:
            return
        if "couldn't bind" in log_tail(self.log_path):
            raise _PortTakenError
        raise XoverError(f"exited with code {code} while starting")

    async def _stop(self) -> None:
        """Close the client and stop the process, once; ``proc`` stays for inspection (pid, return code)."""
        client, self.client = self.client, None
        watch, self._watch = self._watch, None
        if watch is not None and not watch.done():
            watch.cancel()
            with contextlib.suppress(BaseException):
                await watch
        try:
            if client is not None:
                await client.aclose()
        finally:
            if self.proc is not None and self._running:
                self._running = False
                process.stop(self.proc)


def _fatal_after(log: Path, offset: int) -> tuple[int, str | None]:
    """(where the log's complete lines end, the first abort line among them after ``offset``, or None)."""
    try:
        with log.open("rb") as f:
            f.seek(offset)
            data = f.read()
    except OSError:
        return offset, None
    end = data.rfind(b"\n") + 1
    return offset + end, process.abort_message(data[:end].decode(errors="replace").splitlines())


class _PortTakenError(Exception):
    """The free port was taken between choosing it and the server binding it."""
