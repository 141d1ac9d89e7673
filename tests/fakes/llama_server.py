"""A fake llama-server on 127.0.0.1: fixed prefill/decode rates, real cache semantics, and faults.

Two ways to use it:

* in-process: ``with FakeLlamaServer(fault="cut", fault_after=3) as fake: fake.url`` (a thread);
* as a stand-in binary: ``python llama_server.py <llama-server args> [--fake-* options]``, which
  is what :class:`xover.llamacpp.server.LlamaServer` starts in lifecycle tests. It honours
  ``--host``, ``--port``, ``-np``, ``--cache-ram``, prints a ``--help`` that lists ``-fit``, and
  writes its pid as its first log line.

Token ids are characters: text tokenizes to its characters' code points (ASCII: its bytes; a character past
``n_vocab``, 512: its UTF-8 bytes), ``/detokenize`` back; ``/apply-template`` renders ChatML, and
``/v1/chat/completions`` streams OpenAI-style deltas, then the usage with the timings and ``[DONE]``. Like llama-server,
it closes the connection after every streamed response without announcing it. Generated tokens are
``a``..``z`` (one event each). Cache semantics follow llama-server: with ``cache_prompt`` the
longest common prefix with the slot's cache is reused (a full hit still evaluates one token); with
more than one slot or a host-memory cache (defaults), a prompt seen before, even after others,
comes back from the cache. ``cache_prompt: false`` always evaluates the whole prompt.

Faults: ``never-healthy`` (``/health`` stays 503), ``http500``, ``cut`` (the connection closes
after half the tokens, without the final event), ``malformed`` (an event that is not JSON),
``cache-leak`` (reports half the prompt as cached whatever the request says), ``abort-hang`` (ggml's abort
message in the log, then a hang with a forked child, as ik_llama.cpp at a CUDA out of memory: SIGTERM ends the fake
but not its child, which holds the request's connection open), each after
``fault_after`` good completions and for ``fault_count`` completions (None: from then on). Every
instance stops by itself after ``max_life_s``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

FAULTS = ("never-healthy", "http500", "cut", "malformed", "cache-leak", "abort-hang")
# what ik_llama.cpp's llama-server printed on the H200 machine at a CUDA out of memory mid-request, before it hung in
# its backtrace's fork (ggml_print_backtrace: a child that finds no gdb exits through CUDA's atexit handlers)
ABORT_LINES = (
    "CUDA error: out of memory",
    "  current device: 0, in function alloc at /tmp/ik/ik_llama.cpp-ik0.1.5/ggml/src/ggml-cuda.cu:442",
    "  cuMemCreate(&handle, reserve_size, &prop, 0)",
    "/tmp/ik/ik_llama.cpp-ik0.1.5/ggml/src/ggml-cuda.cu:132: CUDA error",
)
N_VOCAB = 512


class FakeState:
    def __init__(
        self,
        *,
        prefill_tps: float = 20_000.0,
        decode_tps: float = 500.0,
        n_slots: int = 1,
        cache_ram: bool = False,
        fault: str | None = None,
        fault_after: int = 0,
        fault_count: int | None = None,
        load_s: float = 0.0,
        drift_per_s: float = 0.0,
        drift_epoch: float | None = None,
    ) -> None:
        if fault is not None and fault not in FAULTS:
            raise ValueError(fault)
        self._prefill_tps = prefill_tps
        self._decode_tps = decode_tps
        # the machine's slow drift: every rate divided by 1 + drift_per_s * (seconds since drift_epoch), the epoch
        # shared by every process of a test (unix time), so processes started later run slower
        self.drift_per_s = drift_per_s
        self.drift_epoch = time.time() if drift_epoch is None else drift_epoch
        self.n_slots = n_slots
        self.cache_ram = cache_ram
        self.fault = fault
        self.fault_after = fault_after
        self.fault_count = fault_count
        self.ready_at = time.monotonic() + load_s
        self.lock = threading.Lock()
        self.slot: list[int] = []  # tokens in the (single) slot's cache
        self.seen: list[list[int]] = []  # every evaluated prompt, for the host-memory cache / other slots
        self.completions = 0

    @property
    def slowdown(self) -> float:
        return 1.0 + self.drift_per_s * max(0.0, time.time() - self.drift_epoch)

    @property
    def prefill_tps(self) -> float:
        return self._prefill_tps / self.slowdown

    @property
    def decode_tps(self) -> float:
        return self._decode_tps / self.slowdown

    def cache_n(self, prompt: list[int], cache_prompt: bool) -> int:
        if not cache_prompt:
            return 0
        candidates = [self.slot] + (self.seen if (self.n_slots > 1 or self.cache_ram) else [])
        best = 0
        for c in candidates:
            n = 0
            for a, b in zip(c, prompt, strict=False):
                if a != b:
                    break
                n += 1
            best = max(best, n)
        return min(best, len(prompt) - 1)


def _tokens(prompt: Any) -> list[int]:
    if isinstance(prompt, str):
        return [t for c in prompt for t in ((ord(c),) if ord(c) < N_VOCAB else c.encode())]
    return [int(t) for t in prompt]


def _text(tokens: Any) -> str:
    """What ``/detokenize`` gives: each id its character (ASCII as the bytes it tokenizes to), so that text made
    of ids tokenizes back to them."""
    return "".join(chr(int(t)) for t in tokens)


def _template(messages: Any) -> str:
    """A ChatML rendering, the generation prompt opened (what llama-server applies where a model has no template)."""
    parts = [f"<|im_start|>{m.get('role', 'user')}\n{m.get('content') or ''}<|im_end|>\n" for m in messages]
    return "".join(parts) + "<|im_start|>assistant\n"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def setup(self) -> None:
        super().setup()
        # No Nagle delays: a known-answer fake must not add transport time of its own.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _json(self, code: int, obj: Any) -> None:
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _body(self) -> dict[str, Any]:
        n = int(self.headers.get("Content-Length") or 0)
        return json.loads(self.rfile.read(n) or b"{}")

    def do_GET(self) -> None:
        st = self.server.state
        if self.path == "/health":
            if st.fault == "never-healthy" or time.monotonic() < st.ready_at:
                self._json(503, {"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}})
            else:
                self._json(200, {"status": "ok"})
        elif self.path == "/props":
            self._json(200, {"build_info": "b0-fake", "total_slots": st.n_slots, "model_path": "/fake/model.gguf"})
        elif self.path == "/v1/models":
            self._json(200, {"data": [{"id": "fake", "meta": {"n_vocab": N_VOCAB, "n_ctx_train": 4096}}]})
        else:
            self._json(404, {"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}})

    def do_POST(self) -> None:
        st = self.server.state
        body = self._body()
        if self.path == "/tokenize":
            self._json(200, {"tokens": _tokens(body.get("content", ""))})
        elif self.path == "/detokenize":
            self._json(200, {"content": _text(body.get("tokens", []))})
        elif self.path == "/apply-template":
            self._json(200, {"prompt": _template(body.get("messages", []))})
        elif self.path == "/completion":
            self._completion(st, body)
        elif self.path == "/v1/chat/completions":
            self._completion(st, {**body, "prompt": _template(body.get("messages", [])),
                                  "n_predict": body.get("max_tokens", 16)}, chat=True)  # fmt: skip
        else:
            self._json(404, {"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}})

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def _completion(self, st: FakeState, body: dict[str, Any], chat: bool = False) -> None:
        prompt = _tokens(body["prompt"])
        n_predict = int(body.get("n_predict", 16))
        with st.lock:
            st.completions += 1
            k = st.completions - st.fault_after  # 1 for the first faulty completion
            fault = st.fault if k >= 1 and (st.fault_count is None or k <= st.fault_count) else None
            cache_n = st.cache_n(prompt, bool(body.get("cache_prompt", True)))
            if fault == "cache-leak":
                cache_n = len(prompt) // 2
        if fault == "http500":
            self._json(500, {"error": {"code": 500, "message": "fake internal error", "type": "server_error"}})
            return
        prompt_n = len(prompt) - cache_n
        # like llama-server: headers when prompt processing starts, the body with the first token
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        if fault == "abort-hang":  # ggml's abort message with the headers sent, then a hang (a forked child holds on)
            child = os.fork()
            if child == 0:  # ik's fork keeps llama-server's SIGTERM handler, which does not end it, and the sockets
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
                time.sleep(3600)
                os._exit(0)
            print(f"fake forked child pid {child}", flush=True)
            print("\n".join(ABORT_LINES), flush=True)
            time.sleep(3600)
            return
        t_start = time.perf_counter()
        time.sleep(prompt_n / st.prefill_tps)
        prompt_ms = (time.perf_counter() - t_start) * 1e3
        t_gen = time.perf_counter()
        for i in range(n_predict):
            if i > 0:
                time.sleep(1.0 / st.decode_tps)
            if fault in ("cut", "malformed") and i == n_predict // 2:
                if fault == "malformed":
                    self._chunk(b'data: {"content": "x", "tokens": [1\n\n')
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            ev = {
                "index": 0,
                "content": chr(97 + i % 26),
                "tokens": [97 + i % 26],
                "stop": False,
                "id_slot": 0,
                "tokens_predicted": i + 1,
                "tokens_evaluated": len(prompt),
            }
            if chat:  # the OpenAI-style delta llama-server streams on /v1/chat/completions
                ev = {"choices": [{"index": 0, "delta": {"content": chr(97 + i % 26)}, "finish_reason": None}]}
            self._chunk(b"data: " + json.dumps(ev).encode() + b"\n\n")
        predicted_ms = (time.perf_counter() - t_gen) * 1e3
        timings = {
            "cache_n": cache_n,
            "prompt_n": prompt_n,
            "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / max(prompt_n, 1),
            "prompt_per_second": prompt_n / (prompt_ms / 1e3),
            "predicted_n": n_predict,
            "predicted_ms": predicted_ms,
            "predicted_per_token_ms": predicted_ms / n_predict,
            "predicted_per_second": n_predict / (predicted_ms / 1e3) if predicted_ms > 0 else None,
        }
        final = {
            "index": 0,
            "content": "",
            "tokens": [],
            "stop": True,
            "id_slot": 0,
            "timings": timings,
            "tokens_predicted": n_predict,
            "tokens_evaluated": len(prompt),
        }
        if chat:  # the finish, then the usage with llama-server's timings, then [DONE]
            end = {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}
            usage = {"prompt_tokens": len(prompt), "completion_tokens": n_predict,
                     "prompt_tokens_details": {"cached_tokens": cache_n}}  # fmt: skip
            for obj in (end, {"choices": [], "usage": usage, "timings": timings}):
                self._chunk(b"data: " + json.dumps(obj).encode() + b"\n\n")
            self._chunk(b"data: [DONE]\n\n")
        else:
            self._chunk(b"data: " + json.dumps(final).encode() + b"\n\n")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
        self.close_connection = True  # as llama-server does after a stream, without a Connection: close header
        with st.lock:
            st.slot = prompt + [97 + i % 26 for i in range(n_predict)]
            st.seen.append(prompt)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, addr: tuple[str, int], state: FakeState) -> None:
        super().__init__(addr, _Handler)
        self.state = state


class FakeLlamaServer:
    """In-process fake on 127.0.0.1 and a free port; stops on exit or after ``max_life_s``."""

    def __init__(self, *, max_life_s: float = 60.0, **state: Any) -> None:
        if state.get("fault") == "abort-hang":
            raise ValueError("abort-hang forks: use the fake as a binary (main), never in the test's process")
        self.state = FakeState(**state)
        self.httpd = _Server(("127.0.0.1", 0), self.state)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._timer = threading.Timer(max_life_s, self.httpd.shutdown)
        self._timer.daemon = True

    def __enter__(self) -> FakeLlamaServer:
        self._thread.start()
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(timeout=5)


HELP = """----- common params -----
-h,    --help, --usage                  print usage and exit
-c,    --ctx-size N                     size of the prompt context
-fit,  --fit [on|off]                   whether to adjust unset arguments to fit in device memory
-np,   --parallel N                     number of server slots
-cram, --cache-ram N                    set the maximum cache size in MiB
"""


def main(argv: list[str]) -> int:
    """Stand-in for the llama-server binary (unknown llama-server flags are accepted and ignored)."""
    if "-h" in argv or "--help" in argv:
        print(HELP)
        return 0
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("-np", "--parallel", type=int, default=4)
    p.add_argument("--cache-ram", "-cram", type=int, default=8192)
    p.add_argument("--fake-fault", choices=FAULTS, default=None)
    p.add_argument("--fake-fault-after", type=int, default=0)
    p.add_argument("--fake-fault-count", type=int, default=None)
    p.add_argument("--fake-prefill-tps", type=float, default=20_000.0)
    p.add_argument("--fake-decode-tps", type=float, default=500.0)
    p.add_argument("--fake-load-s", type=float, default=0.2)
    p.add_argument("--fake-exit", type=int, default=None, help="exit at once with this code, as a failed load")
    p.add_argument("--fake-max-life-s", type=float, default=60.0)
    p.add_argument("--fake-drift-per-s", type=float, default=0.0, help="slowdown per second since the drift epoch")
    p.add_argument("--fake-drift-epoch", type=float, default=None, help="unix time the drift counts from")
    p.add_argument("--fake-tag", default=None, help="ignored: tells apart configurations that are otherwise the same")
    p.add_argument("--n-cpu-moe", "-ncmoe", type=int, default=0)
    p.add_argument("--fake-refuse-below", type=int, default=None, help="fail the load below this --n-cpu-moe")
    p.add_argument(
        "--fake-die-below", type=int, default=None, help="load, then fail every request, below this --n-cpu-moe"
    )
    args, _ = p.parse_known_args(argv)
    print(f"fake-llama-server pid {os.getpid()}", flush=True)
    if args.fake_exit is not None:
        print("llama_model_load: error loading model: fake failure", flush=True)
        return args.fake_exit
    if args.fake_refuse_below is not None and args.n_cpu_moe < args.fake_refuse_below:  # a card too small for it
        print(
            "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 4096.00 MiB on device 0: cudaMalloc failed: "
            "out of memory",
            flush=True,
        )
        print("llama_model_load: error loading model: unable to allocate CUDA0 buffer", flush=True)
        return 1
    if args.fake_die_below is not None and args.n_cpu_moe < args.fake_die_below:  # as cuBLAS's workspace at a request
        args.fake_fault, args.fake_fault_after, args.fake_fault_count = "http500", 0, None
    state = FakeState(
        prefill_tps=args.fake_prefill_tps,
        decode_tps=args.fake_decode_tps,
        n_slots=args.parallel,
        cache_ram=args.cache_ram != 0,
        fault=args.fake_fault,
        fault_after=args.fake_fault_after,
        fault_count=args.fake_fault_count,
        load_s=args.fake_load_s,
        drift_per_s=args.fake_drift_per_s,
        drift_epoch=args.fake_drift_epoch,
    )
    try:
        httpd = _Server((args.host, args.port), state)
    except OSError as e:
        print(
            f"srv    start: couldn't bind HTTP server socket, hostname: {args.host}, port: {args.port} ({e})",
            flush=True,
        )
        return 1
    print(f"main: server is listening on http://{args.host}:{args.port}", flush=True)
    timer = threading.Timer(args.fake_max_life_s, httpd.shutdown)
    timer.daemon = True
    timer.start()
    httpd.serve_forever(poll_interval=0.05)
    return 0


def write_bin_dir(folder: Path) -> Path:
    """A folder with ``llama-server`` (this fake) and ``llama-bench`` (never run), as ``--llama-bin-dir`` wants."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("llama-server", "llama-bench"):
        exe = folder / name
        exe.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{Path(__file__).resolve()}" "$@"\n')
        exe.chmod(0o755)
    return folder


def fake_config(name: str, prefill_tps: float, decode_tps: float, *extra: str) -> Any:
    """A study configuration served by this fake (its flags pass through llama-server's extra arguments): fixed
    prefill and decode rates, ``extra`` fake flags, a 50 ms load, tagged by ``name``."""
    from xover.domain.config import LlamaConfig

    rates = ("--fake-prefill-tps", f"{prefill_tps:g}", "--fake-decode-tps", f"{decode_tps:g}")
    return LlamaConfig(name, server_args=(*rates, *extra, "--fake-load-s", "0.05", "--fake-tag", name))


def pid_from_log(log: Path) -> int:
    """The pid the fake wrote as its first log line."""
    for line in log.read_text().splitlines():
        if line.startswith("fake-llama-server pid "):
            return int(line.split()[-1])
    raise AssertionError(f"no pid line in {log}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
