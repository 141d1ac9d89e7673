"""The link theory (analysis/rpclink.py) on constructed numbers with answers worked out by hand, and the link
probe's wire format (llamacpp/rpclink.py) against a Python worker that speaks the protocol's probe commands."""

from __future__ import annotations

import dataclasses
import socket
import struct
import threading

import pytest

from xover.analysis.rpclink import (
    Link,
    LinkModel,
    Placement,
    Traffic,
    decode_limit_tps,
    expert_layers_on_workers,
    expert_traffic,
    prefill_limit_tps,
    prefill_link_s,
    ubatch_traffic,
    worker_ranges,
)
from xover.llamacpp import rpclink

M = LinkModel(n_layer=4, n_embd=256, n_vocab=1000)  # hidden state per token: 1024 bytes; logits: 4000 bytes
LINK = Link(rtt_s=0.001, up_bytes_s=1e6, down_bytes_s=2e6)


def test_worker_ranges_one_per_worker_that_gets_a_layer():
    assert worker_ranges(M, Placement(0, 1)) == 0
    assert worker_ranges(M, Placement(2, 0)) == 0
    assert worker_ranges(M, Placement(2, 1)) == 1
    assert worker_ranges(M, Placement(4, 2)) == 2
    assert worker_ranges(M, Placement(1, 3)) == 1  # one layer offloaded: only one worker can hold it
    assert worker_ranges(M, Placement(99, 8)) == 4


def test_traffic_per_ubatch():
    assert ubatch_traffic(M, Placement(2, 1), 1, 1) == Traffic(
        1, 1024, 1024
    )  # decode: state in, state out, one round trip
    assert ubatch_traffic(M, Placement(2, 1), 512, 0) == Traffic(1, 512 * 1024, 512 * 1024)
    assert ubatch_traffic(M, Placement(4, 2), 1, 1) == Traffic(
        2, 2048, 2048
    )  # through the host between the two workers
    # the output layer on the worker: the logits come back instead of the state
    assert ubatch_traffic(M, Placement(99, 1), 1, 1) == Traffic(1, 1024, 4000)
    assert ubatch_traffic(M, Placement(99, 2), 1, 1) == Traffic(2, 2048, 1024 + 4000)
    assert ubatch_traffic(M, Placement(99, 1), 256, 0) == Traffic(
        0, 256 * 1024, 0
    )  # nothing to read back, no wait counted
    assert ubatch_traffic(M, Placement(0, 1), 512, 1) == Traffic(0, 0, 0)


def test_decode_limit():
    # 1 ms + 1024 B / 1 MB/s + 1024 B / 2 MB/s = 2.536 ms per token
    assert decode_limit_tps(M, Placement(2, 1), LINK) == pytest.approx(1 / 0.002536)
    # 1 ms + 1024 / 1e6 + 4000 / 2e6 = 4.024 ms
    assert decode_limit_tps(M, Placement(99, 1), LINK) == pytest.approx(1 / 0.004024)
    assert decode_limit_tps(M, Placement(0, 1), LINK) is None
    assert Traffic(3, 0, 0).time_s(LINK) == pytest.approx(0.003)


def test_prefill_limit():
    # 600 tokens in ubatches of 256, 256, 88: three round trips, 600 x 1024 bytes each way
    assert prefill_link_s(M, Placement(2, 1), 600, 256, LINK) == pytest.approx(0.003 + 0.6144 + 0.3072)
    assert prefill_limit_tps(M, Placement(2, 1), 600, 256, LINK) == pytest.approx(600 / 0.9246)
    # output layer on the worker: only the last ubatch returns (one token's logits) and waits
    assert prefill_link_s(M, Placement(99, 1), 600, 256, LINK) == pytest.approx(0.001 + 0.6144 + 0.002)
    assert prefill_limit_tps(M, Placement(0, 1), 600, 256, LINK) is None


E = LinkModel(n_layer=4, n_embd=256, n_vocab=1000, n_expert_used=8)  # routing per token: 8 ids + 8 weights, 64 B


def test_experts_on_a_worker_cross_once_per_layer():
    # per layer: the input state and the routing up (256 + 16) x 4 = 1088 B a token, the weighted sum back 1024 B
    assert expert_traffic(E, 1, 1) == Traffic(1, 1088, 1024)
    assert expert_traffic(E, 3, 512) == Traffic(3, 3 * 512 * 1088, 3 * 512 * 1024)
    assert expert_traffic(E, 0, 512) == Traffic(0, 0, 0)
    # decode with 3 layers' experts away: 3 round trips, 3 x 1088 B / 1 MB/s, 3 x 1024 B / 2 MB/s: 7.7904 ms a token
    assert decode_limit_tps(E, Placement(0, 1, 3), LINK) == pytest.approx(1 / (0.003 + 0.003264 + 0.001536))
    # prefill of 600 tokens in ubatches of 256: 3 ubatches x 3 layers = 9 round trips; 600 x 3 x 1088 B up
    assert prefill_link_s(E, Placement(0, 1, 3), 600, 256, LINK) == pytest.approx(
        0.009 + 600 * 3 * 1088 / 1e6 + 600 * 3 * 1024 / 2e6
    )


def test_a_local_gpu_keeps_the_output_layer():
    """llama.cpp puts RPC devices first and the output layer on the last device: with a GPU here the logits never
    cross, and the state comes back from every range."""
    assert ubatch_traffic(M, Placement(99, 1, local_gpu=True), 1, 1) == Traffic(1, 1024, 1024)
    assert ubatch_traffic(M, Placement(99, 1), 1, 1) == Traffic(1, 1024, 4000)


def test_expert_layers_follow_the_first_matching_override():
    assert expert_layers_on_workers("blk\\.[23]\\.ffn_.*_exps=RPC0[127.0.0.1:50052]", 4) == 2
    assert expert_layers_on_workers("blk\\.(1[0-9]|2[0-3])\\.ffn_(up|down|gate)_exps=RPC0[h:1]", 48) == 14
    # the first match decides: layer 2's experts go to the CPU, only layer 3's to the worker
    assert expert_layers_on_workers("blk\\.2\\.=CPU;blk\\.[23]\\.ffn_.*_exps=RPC0[h:1]", 4) == 1
    assert expert_layers_on_workers("exps=CPU", 4) == 0 and expert_layers_on_workers("", 4) == 0
    assert expert_layers_on_workers("attn=RPC0[h:1]", 4) == 0  # attention weights, not experts


def test_link_model_from_the_theory_terms():
    from xover.analysis.theory import model_terms
    from xover.domain.presets import preset
    from xover.domain.shapes import tensor_table

    terms = model_terms(tensor_table(preset("tiny-moe")))
    m = LinkModel.from_terms(terms)
    assert (m.n_layer, m.n_embd, m.n_vocab) == (terms.n_layer, terms.n_embd, terms.n_vocab)


def test_the_probe_tensor_is_the_packed_rpc_tensor():
    t = rpclink.tensor_bytes(buffer=0xAB, data=0x1000, n_bytes=64)
    assert len(t) == 296
    assert struct.unpack_from("<QIQ", t) == (1, 0, 0xAB)  # id, GGML_TYPE_F32, buffer
    assert struct.unpack_from("<4I4I", t, 20) == (16, 1, 1, 1, 4, 64, 64, 64)  # ne, nb
    assert struct.unpack_from("<Q", t, 296 - 4 - 64 - 8)[0] == 0x1000  # data


def _serve(listener: socket.socket, seen: list[int]) -> None:
    """One client of a minimal worker: HELLO, GET_ALIGNMENT, ALLOC_BUFFER, BUFFER_GET_BASE, SET/GET_TENSOR,
    FREE_BUFFER, framed as ggml-rpc-server frames them."""
    conn, _ = listener.accept()
    store = bytearray()

    def exact(n: int) -> bytes:
        b = b""
        while len(b) < n:
            chunk = conn.recv(n - len(b))
            if not chunk:
                raise EOFError
            b += chunk
        return b

    def reply(payload: bytes) -> None:
        conn.sendall(struct.pack("<Q", len(payload)) + payload)

    with conn:
        try:
            while True:
                cmd, size = struct.unpack("<BQ", exact(9))
                body = exact(size)
                seen.append(cmd)
                if cmd == rpclink.CMD_HELLO:
                    reply(bytes([7, 0, 0, 0]) + bytes(24))
                elif cmd == rpclink.CMD_GET_ALIGNMENT:
                    reply(struct.pack("<Q", 32))
                elif cmd == rpclink.CMD_ALLOC_BUFFER:
                    _, n = struct.unpack("<IQ", body)
                    store[:] = bytes(n)
                    reply(struct.pack("<QQ", 0xB0, n))
                elif cmd == rpclink.CMD_BUFFER_GET_BASE:
                    reply(struct.pack("<Q", 0x1000))
                elif cmd == rpclink.CMD_SET_TENSOR:
                    assert len(body) == 296 + 1 + 8 + len(store)
                elif cmd == rpclink.CMD_GET_TENSOR:
                    _, n = struct.unpack_from("<QQ", body, 296)
                    reply(bytes(n))
        except EOFError:
            pass


def test_probe_speaks_the_protocol():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        seen: list[int] = []
        th = threading.Thread(target=_serve, args=(listener, seen), daemon=True)
        th.start()
        p = rpclink.probe(f"127.0.0.1:{listener.getsockname()[1]}", rtt_samples=5, block_mib=1, bw_samples=2)
        th.join(5)
    assert p.protocol == "7.0.0" and len(p.rtt_ms) == 5 and p.block_bytes == 1 << 20
    assert len(p.up_mib_s) == len(p.down_mib_s) == 2 and all(x > 0 for x in p.up_mib_s + p.down_mib_s)
    assert seen[:2] == [rpclink.CMD_HELLO, rpclink.CMD_GET_ALIGNMENT]
    assert seen.count(rpclink.CMD_SET_TENSOR) == seen.count(rpclink.CMD_GET_TENSOR) == 3  # one warm-up each
    assert seen[-2:] == [rpclink.CMD_FREE_BUFFER, rpclink.CMD_GET_ALIGNMENT]


def test_probe_refuses_another_protocol():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()

        def old() -> None:
            conn, _ = listener.accept()
            with conn:
                conn.recv(9 + 24)
                conn.sendall(struct.pack("<Q", 28) + bytes([3, 0, 0, 0]) + bytes(24))

        th = threading.Thread(target=old, daemon=True)
        th.start()
        with pytest.raises(rpclink.LinkError, match=r"speaks RPC protocol 3\.0\.0; the probe knows 7\.x"):
            rpclink.probe(f"127.0.0.1:{listener.getsockname()[1]}")
        th.join(5)


def test_report_section_shows_the_link_and_the_limit():
    from xover.domain.config import LlamaConfig
    from xover.domain.records import BenchResult
    from xover.report.rpclink import rpc_link_blocks
    from xover.results.read_model import Artifact, StudyData

    cfg = LlamaConfig("split", (("rpc", "127.0.0.1:50052"), ("n-gpu-layers", "2")))
    local = LlamaConfig("local")

    def res(key: str, n_prompt: int, n_gen: int, ts: float) -> BenchResult:
        return BenchResult(key, n_prompt, n_gen, 0, (1,), (ts,), ts, 0.0, {"n_gpu_layers": 2, "n_ubatch": 512})

    links = [
        {"endpoint": "127.0.0.1:50052", "protocol": "7.0.0", "connect_ms": 1.0, "rtt_ms": [1.0, 2.0, 1.0],
         "block_bytes": 8 << 20, "up_mib_s": [1.0], "down_mib_s": [1.0]},
        {"endpoint": "10.0.0.2:50052", "error": "connection refused"},
    ]  # fmt: skip
    from xover.domain.records import Provenance
    from xover.results.read_model import StoredRun

    worker = "xover's ggml-rpc-server 0c1e570 cpu, -t 1; CPU: AMD EPYC (24105 MiB)"
    prov = Provenance(None, None, None, None, None, None, None, "h", "Linux", "0", None,
                      (("loadavg_1m", "0.1"), ("rpc_worker 127.0.0.1:50052", worker)))  # fmt: skip
    data = StudyData(
        study_dir="s",
        runs=(StoredRun(1, "bench", ("xover",), "2026-12-01T00:00:00+0000", None, None, "done", prov),),
        labels={cfg.key: "split", local.key: "local"},
        bench=(("split", res(cfg.key, 0, 16, 50.0)), ("local", res(local.key, 0, 16, 99.0))),
        ttft=(),
        failures=(),
        artifacts=(Artifact(None, "inspect", {"synthetic_preset": "tiny-moe"}), Artifact(None, "rpc-link", links)),
        configs=(cfg, local),
    )
    blocks = rpc_link_blocks(data)
    assert blocks[0].text == "RPC link"
    link_rows = blocks[2].rows
    assert link_rows[0][:4] == ("127.0.0.1:50052", worker, "7.0.0", "1.000 (1.000-2.000, n=3)")
    assert link_rows[1][1] == "-"  # no run names that worker
    assert link_rows[1][-1] == "not probed: connection refused"
    (row,) = blocks[4].rows  # the RPC configuration only
    from xover.analysis.theory import model_terms
    from xover.domain.presets import preset
    from xover.domain.shapes import tensor_table

    n_embd = model_terms(tensor_table(preset("tiny-moe"))).n_embd
    limit = 1 / (0.001 + 2 * n_embd * 4 / (1 << 20))  # one round trip + the state up and down at 1 MiB/s
    assert row == ("split", "tg16", "2", "-", "1", "50.0", f"{limit:,.0f}", f"{50 / limit:.1%}")
    assert blocks[5].kind == "ul"
    # the experts of layers 2 and 3 on the worker, every layer here, this host a GPU: two round trips a token
    experts = LlamaConfig(
        "experts", (("rpc", "127.0.0.1:50052"), ("n-gpu-layers", "0"), ("override-tensor", "blk\\.[23]\\.=RPC0[x]"))
    )
    rec = {"n_gpu_layers": 0, "n_ubatch": 512, "backends": "CUDA,RPC"}
    rows = rpc_link_blocks(
        dataclasses.replace(
            data,
            configs=(experts,),
            bench=(("experts", BenchResult(experts.key, 0, 16, 0, (1,), (20.0,), 20.0, 0.0, rec)),),
        )
    )[4].rows
    k = model_terms(tensor_table(preset("tiny-moe"))).n_expert_used
    limit = 1 / (0.002 + 2 * ((n_embd + 2 * k) * 4 + n_embd * 4) / (1 << 20))
    assert rows == (("experts", "tg16", "0", "2", "1", "20.0", f"{limit:,.0f}", f"{20 / limit:.1%}"),)
    assert rpc_link_blocks(StudyData("s", (), {}, (), (), (), ())) == []
