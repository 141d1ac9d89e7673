"""The link to an RPC worker, measured through ggml-rpc-server's own protocol over the TCP path llama.cpp uses.

One connection per worker (the worker serves one client at a time, so the probe runs while no llama process is
connected): ``HELLO``, then

* round-trip time: ``GET_ALIGNMENT`` requests, each a 9-byte command answered with an 8-byte reply, timed from
  the send to the end of the reply (the same request/reply turn a ``GET_TENSOR`` of an activation makes);
* bandwidth towards the worker ("up"): one ``ALLOC_BUFFER`` of the block size, then per sample a ``SET_TENSOR``
  of the whole block (the command llama.cpp sends an activation with; it has no reply) followed by a
  ``GET_ALIGNMENT`` whose reply proves the worker has read and stored the block: bytes / that time, which
  includes one round trip and the worker's copy into its buffer;
* bandwidth from the worker ("down"): per sample a ``GET_TENSOR`` of the whole block, bytes / time to the last
  byte of the reply (also one round trip included);
* then ``FREE_BUFFER``. One warm-up of each kind is discarded.

The wire format (ggml/src/ggml-rpc/ggml-rpc.cpp, protocol 7.x of llama.cpp 0c1e570): a request is
``cmd (1 byte) | size (u64) | payload``, a reply ``size (u64) | payload``; tensors travel as the packed 296-byte
``rpc_tensor``. A worker of another protocol major version is not probed (:class:`LinkError`).
"""

from __future__ import annotations

import dataclasses
import socket
import struct
import time

from xover.errors import XoverError

PROTO_MAJOR = 7
CAPS_SIZE = 24  # RPC_CONN_CAPS_SIZE: all zero = plain TCP, no RDMA upgrade
CMD_ALLOC_BUFFER = 0
CMD_GET_ALIGNMENT = 1
CMD_BUFFER_GET_BASE = 3
CMD_FREE_BUFFER = 4
CMD_SET_TENSOR = 6
CMD_GET_TENSOR = 8
CMD_HELLO = 14
GGML_TYPE_F32 = 0
_TENSOR = struct.Struct("<QIQ4I4II16ii10QQQQ64si")  # struct rpc_tensor, #pragma pack(1)
assert _TENSOR.size == 296
METHOD = (
    "ggml-rpc protocol over TCP: RTT = GET_ALIGNMENT request/reply; up = SET_TENSOR of the block + a "
    "GET_ALIGNMENT reply; down = GET_TENSOR of the block (each bandwidth sample includes one round trip)"
)


class LinkError(XoverError):
    """The worker could not be probed (refused, closed, spoke another protocol)."""


@dataclasses.dataclass(frozen=True)
class LinkProbe:
    """What one probe of one worker measured: every sample kept."""

    endpoint: str
    protocol: str  # the worker's answer to HELLO, "7.0.0"
    connect_ms: float  # TCP connect + HELLO
    rtt_ms: tuple[float, ...]
    block_bytes: int
    up_mib_s: tuple[float, ...]
    down_mib_s: tuple[float, ...]
    method: str = METHOD


def _recv_exact(sock: socket.socket, n: int) -> bytearray:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise LinkError(f"the worker closed the connection ({got} of {n} bytes of a reply read)")
        got += k
    return buf  # no copy: the timed path reads the bytes once


def _send(sock: socket.socket, cmd: int, payload: bytes) -> None:
    sock.sendall(struct.pack("<BQ", cmd, len(payload)))
    if payload:
        sock.sendall(payload)


def _reply(sock: socket.socket, size: int) -> bytearray:
    (n,) = struct.unpack("<Q", _recv_exact(sock, 8))
    if n != size:
        raise LinkError(f"reply of {n} bytes where {size} were expected")
    return _recv_exact(sock, n)


def tensor_bytes(buffer: int, data: int, n_bytes: int) -> bytes:
    """A 1-D F32 ``rpc_tensor`` of ``n_bytes`` (a multiple of 4) at ``data`` in the worker's ``buffer``. Pure."""
    ne0 = n_bytes // 4
    return _TENSOR.pack(
        1, GGML_TYPE_F32, buffer, ne0, 1, 1, 1, 4, n_bytes, n_bytes, n_bytes, 0, *([0] * 16), 0,
        *([0] * 10), 0, 0, data, b"xover-link-probe", 0,
    )  # fmt: skip


def _round_trip(sock: socket.socket) -> None:
    _send(sock, CMD_GET_ALIGNMENT, struct.pack("<I", 0))
    _reply(sock, 8)


def probe(
    endpoint: str, *, rtt_samples: int = 20, block_mib: int = 8, bw_samples: int = 3, timeout_s: float = 30.0
) -> LinkProbe:
    """Probe the worker at ``endpoint`` (``host:port``); raises :class:`LinkError` (or OSError) when it cannot."""
    host, _, port = endpoint.rpartition(":")
    size = block_mib << 20
    t0 = time.perf_counter()
    with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as llama.cpp's client sets it
        _send(sock, CMD_HELLO, bytes(CAPS_SIZE))
        hello = _reply(sock, 4 + CAPS_SIZE)
        connect_ms = (time.perf_counter() - t0) * 1e3
        if hello[0] != PROTO_MAJOR:
            raise LinkError(f"speaks RPC protocol {hello[0]}.{hello[1]}.{hello[2]}; the probe knows {PROTO_MAJOR}.x")
        rtts = []
        for i in range(rtt_samples + 1):
            t = time.perf_counter()
            _round_trip(sock)
            if i:  # the first one is a warm-up
                rtts.append((time.perf_counter() - t) * 1e3)
        _send(sock, CMD_ALLOC_BUFFER, struct.pack("<IQ", 0, size))
        remote, remote_size = struct.unpack("<QQ", _reply(sock, 16))
        if remote == 0 or remote_size < size:
            raise LinkError(f"the worker could not allocate a {block_mib} MiB buffer")
        try:
            _send(sock, CMD_BUFFER_GET_BASE, struct.pack("<Q", remote))
            (base,) = struct.unpack("<Q", _reply(sock, 8))
            tensor = tensor_bytes(remote, base, size)
            set_payload = tensor + b"\0" + struct.pack("<Q", 0) + bytes(size)  # built before the clock starts
            get_payload = tensor + struct.pack("<QQ", 0, size)
            up, down = [], []
            for i in range(bw_samples + 1):
                t = time.perf_counter()
                _send(sock, CMD_SET_TENSOR, set_payload)
                _round_trip(sock)
                if i:
                    up.append(size / (1 << 20) / (time.perf_counter() - t))
                t = time.perf_counter()
                _send(sock, CMD_GET_TENSOR, get_payload)
                _reply(sock, size)
                if i:
                    down.append(size / (1 << 20) / (time.perf_counter() - t))
        finally:
            _send(sock, CMD_FREE_BUFFER, struct.pack("<Q", remote))
            _round_trip(sock)  # the worker has freed it before the connection closes
    return LinkProbe(
        endpoint=endpoint,
        protocol=f"{hello[0]}.{hello[1]}.{hello[2]}",
        connect_ms=connect_ms,
        rtt_ms=tuple(rtts),
        block_bytes=size,
        up_mib_s=tuple(up),
        down_mib_s=tuple(down),
    )
