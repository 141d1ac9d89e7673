"""The tests of tests/unit/test_rpc.py that start a process (a subprocess, xover's CLI or a fake llama.cpp binary):
tests/unit starts none (its conftest.py refuses)."""

from __future__ import annotations

import socket
import stat
import sys
import textwrap
from pathlib import Path

import pytest

from procs import pid_gone
from xover.domain.study_spec import spec_from_dict
from xover.errors import XoverError
from xover.llamacpp import rpc
from xover.llamacpp.binaries import Binaries
from xover.measure import workers


def _toml(text: str) -> dict:
    from xover.domain.study_spec import tomllib  # tomli before Python 3.11

    return tomllib.loads(text)


def _spec(*configs: str) -> str:
    return '[model]\npreset = "tiny-moe"\n' + "".join(f"[[config]]\n{c}\n" for c in configs)


FAKE = textwrap.dedent(
    """\
    #!{python}
    # A stand-in for ggml-rpc-server: the same flags, its startup lines buffered until the first accept.
    import socket, sys
    args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
    if args.get("-p") == "1":
        print("Failed to create server socket", file=sys.stderr)
        sys.exit(1)
    print("Starting RPC server v3.0.0")
    print("  endpoint       : %s:%s" % (args["-H"], args["-p"]))
    print("  local cache    : n/a")
    print("Devices:")
    print("  CPU: Fake CPU (%s threads) (1024 MiB, 1000 MiB free)" % args.get("-t", "?"))
    print("  transport      : TCP")
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((args["-H"], int(args["-p"])))
    s.listen()
    while True:
        c, _ = s.accept()
        print("Accepted client connection", flush=True)
        c.recv(1)
        c.close()
        print("Client connection closed", flush=True)
    """
)


@pytest.fixture
def fake_bin(tmp_path: Path) -> Binaries:
    d = tmp_path / "bin"
    d.mkdir()
    for name in ("llama-bench", "llama-server"):
        (d / name).write_text("#!/bin/sh\n")
    (d / "ggml-rpc-server").write_text(FAKE.format(python=sys.executable))
    for p in d.iterdir():
        p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return Binaries(bench=d / "llama-bench", server=d / "llama-server", source="--llama-bin-dir")


def test_a_worker_is_owned_like_a_server(fake_bin: Binaries, tmp_path: Path):
    (port,) = rpc.free_ports(1, first=51000)
    binary = fake_bin.rpc_server
    assert binary is not None
    with rpc.RpcWorker(binary, rpc.WorkerSpec(port, threads=2), tmp_path / "logs", build="0c1e570 cpu") as w:
        assert w.pid is not None and not pid_gone(w.pid)
        assert w.info.devices == ("CPU: Fake CPU (2 threads) (1024 MiB, 1000 MiB free)",)
        assert (w.info.protocol, w.info.transport, w.info.threads) == ("3.0.0", "TCP", 2)
        assert rpc.accepts("127.0.0.1", port)
        log = Path(w.info.log or "")
        assert log.parent == tmp_path / "logs" and log.read_text().startswith(f"$ {binary} -H 127.0.0.1 -p {port} -t 2")
        pid = w.pid
    assert pid_gone(pid)
    assert not rpc.accepts("127.0.0.1", port)


def test_a_worker_that_cannot_start_says_why_in_one_line(fake_bin: Binaries, tmp_path: Path):
    assert fake_bin.rpc_server is not None
    with pytest.raises(XoverError) as e:
        with rpc.RpcWorker(fake_bin.rpc_server, rpc.WorkerSpec(1), tmp_path / "logs"):
            pass
    assert "RPC worker 127.0.0.1:1 exited with code 1 while starting" in str(e.value)
    assert "Failed to create server socket" in str(e.value) and "\n" not in str(e.value)


def test_study_workers_run_around_the_study_and_stop_on_an_error(fake_bin: Binaries, tmp_path: Path):
    from xover.llamacpp import process

    spec = spec_from_dict(_toml(_spec('name = "local"', 'name = "rpc"\nrpc-local = 2\nrpc-threads = 1')))
    lines: list[str] = []
    with pytest.raises(RuntimeError, match="the study failed"):
        with workers.study_workers(spec, tmp_path, fake_bin, lines.append) as resolved:
            rpc_config = resolved.configs[1]
            assert len(rpc_config.rpc) == 2 and all(e.startswith("127.0.0.1:") for e in rpc_config.rpc)
            assert resolved.configs[0].rpc == ()
            assert [w.endpoint for w in rpc.active()] == list(rpc_config.rpc)
            pids = process.live_pids()
            assert len(lines) == 4 and "xover's ggml-rpc-server" in lines[0] and "-t 1" in lines[0]
            # the link probe: the fake worker does not speak the RPC protocol, so each link is recorded unprobed
            assert all(ln.startswith(f"RPC link {e}: not probed (") for ln, e in zip(lines[2:], rpc_config.rpc))
            from xover.results.store import Store

            with Store(tmp_path) as store:
                ((_, _, links),) = store.artifacts(workers.LINK_ARTIFACT)
            assert [x["endpoint"] for x in links] == list(rpc_config.rpc) and all(x["error"] for x in links)
            from xover.measure.provenance import _rpc_workers

            assert [k for k, _ in _rpc_workers()] == [f"rpc_worker {e}" for e in rpc_config.rpc]
            raise RuntimeError("the study failed")
    assert rpc.active() == ()
    assert all(pid_gone(p) for p in pids)


def test_a_resumed_study_gets_its_workers_ports_back(fake_bin: Binaries, tmp_path: Path):
    from xover.results.store import Store

    spec = spec_from_dict(_toml(_spec('name = "rpc"\nrpc-local = 1\nrpc-threads = 1')))
    with socket.socket() as s:  # the first run finds the lowest free port taken
        lowest = rpc.free_ports(1)[0]
        s.bind(("127.0.0.1", lowest))
        with workers.study_workers(spec, tmp_path, fake_bin) as first:
            pass
    with Store(tmp_path) as store:
        ((_, _, body),) = store.artifacts(workers.ARTIFACT)
    assert body[0]["threads"] == 1 and body[0]["port"] != lowest
    assert first.configs[0].rpc == (f"127.0.0.1:{body[0]['port']}",)
    with workers.study_workers(spec, tmp_path, fake_bin) as again:  # the lowest is free again: the stored one wins
        assert again.configs[0].rpc == first.configs[0].rpc
    with Store(tmp_path) as store:
        assert len(store.artifacts(workers.ARTIFACT)) == 1  # nothing changed: nothing stored again
