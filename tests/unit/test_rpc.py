"""RPC workers without llama.cpp: the spec's rpc / rpc-local keys, the --rpc both tools get, the workers a study
plans, ggml-rpc-server's startup lines, and a worker's lifecycle against a fake ggml-rpc-server (a Python script
that binds, prints and buffers its startup lines as the real one does)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from xover.domain.study_spec import config_from_table, spec_from_dict
from xover.errors import XoverError
from xover.llamacpp import bench, rpc
from xover.llamacpp.binaries import Binaries
from xover.measure import workers

STARTUP = """\
Starting RPC server v3.0.0
  endpoint       : 127.0.0.1:50052
  local cache    : n/a
Devices:
  CPU: Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz (7936 MiB, 7800 MiB free)
  transport      : TCP
Accepted client connection
Client connection closed
"""


def _toml(text: str) -> dict:
    from xover.domain.study_spec import tomllib  # tomli before Python 3.11

    return tomllib.loads(text)


def _spec(*configs: str) -> str:
    return '[model]\npreset = "tiny-moe"\n' + "".join(f"[[config]]\n{c}\n" for c in configs)


def test_rpc_endpoints_become_one_rpc_flag_for_both_tools():
    c = config_from_table({"name": "split", "rpc": ["10.0.0.2:50052", "gpu-box.lan:50053"], "n-gpu-layers": 99}, 0)
    assert c.rpc == ("10.0.0.2:50052", "gpu-box.lan:50053")
    assert c.bench_argv() == ("-ngl", "99", "--rpc", "10.0.0.2:50052,gpu-box.lan:50053")
    assert c.server_argv() == ("-ngl", "99", "--rpc", "10.0.0.2:50052,gpu-box.lan:50053")
    job = bench.BenchJob(c, 512, 128, (0,), 2)
    argv = job.to_argv(Path("llama-bench"), Path("m.gguf"))
    assert argv[argv.index("--rpc") + 1] == "10.0.0.2:50052,gpu-box.lan:50053"
    # one string is taken too (comma-separated, as llama.cpp spells it)
    assert config_from_table({"name": "s", "rpc": "10.0.0.2:50052"}, 0).rpc == ("10.0.0.2:50052",)


@pytest.mark.parametrize(
    ("table", "needle"),
    [
        ({"rpc": []}, "rpc must be a list of RPC workers"),
        ({"rpc": [50052]}, "rpc must be a list of RPC workers"),
        ({"rpc": ["10.0.0.2"]}, "rpc worker '10.0.0.2' is not host:port"),
        ({"rpc": ["10.0.0.2:0"]}, "is not host:port"),
        ({"rpc": ["10.0.0.2:70000"]}, "is not host:port"),
        ({"rpc": [":50052"]}, "is not host:port"),
        ({"rpc": ["a b:50052"]}, "is not host:port"),
        ({"rpc": ["h:1", "h:01"]}, "rpc worker 'h:1' is listed twice"),
        ({"rpc-local": -1}, "rpc-local must be a number of local RPC workers from 0 to 16"),
        ({"rpc-local": True}, "rpc-local must be a number"),
        ({"rpc-local": "2"}, "rpc-local must be a number"),
        ({"rpc-local": 1, "rpc-threads": 0}, "rpc-threads must be a positive number"),
        ({"rpc-threads": 2}, "give rpc-local = N too"),
        ({"rpc-local": 1, "rpc": ["h:1"]}, "give rpc (workers you run) or rpc-local (workers xover starts), not both"),
    ],
)
def test_bad_rpc_keys_are_one_line_errors(table, needle):
    with pytest.raises(XoverError, match=None) as e:
        config_from_table({"name": "x", **table}, 0)
    assert needle in str(e.value) and "\n" not in str(e.value)
    assert str(e.value).startswith("[[config]] 'x': ")


def test_rpc_local_configurations_cannot_run_before_their_workers():
    c = config_from_table({"name": "rpc", "rpc-local": 2, "rpc-threads": 1}, 0)
    assert (c.rpc_local, c.rpc_threads, c.rpc) == (2, 1, ())
    with pytest.raises(XoverError, match="its 2 rpc-local worker"):
        c.bench_argv()
    with pytest.raises(XoverError, match="not running"):
        c.server_argv()
    running = c.with_rpc(("127.0.0.1:50052", "127.0.0.1:50053"))
    assert running.bench_argv() == ("--rpc", "127.0.0.1:50052,127.0.0.1:50053")
    assert running.llama_server_command() == "--rpc 127.0.0.1:50052,127.0.0.1:50053"


EXPERTS = "blk\\.[23]\\.ffn_.*_exps"  # the experts of layers 2 and 3


def test_experts_on_a_user_run_worker_are_one_override_and_rpc_comes_first_for_both_tools():
    """{rpc0} is the first worker's endpoint; llama-bench joins one setting's overrides with ';' (it sweeps over
    ','), llama-server with ','; both resolve the buffer types while parsing, so --rpc goes before -ot."""
    c = config_from_table(
        {"name": "x", "override-tensor": [f"{EXPERTS}=RPC0[{{rpc0}}]", "output=CPU"], "rpc": ["10.0.0.2:50052"]}, 0
    )
    placed = f"{EXPERTS}=RPC0[10.0.0.2:50052]"
    assert c.get("override-tensor") == f"{placed},output=CPU"
    assert c.server_argv() == ("--rpc", "10.0.0.2:50052", "-ot", f"{placed},output=CPU")
    assert c.bench_argv() == ("--rpc", "10.0.0.2:50052", "-ot", f"{placed};output=CPU")
    argv = bench.BenchJob(c, 64, 16, (0,), 1).to_argv(Path("llama-bench"), Path("m.gguf"))
    assert argv.index("--rpc") < argv.index("-ot")


def test_experts_on_local_workers_wait_for_their_ports():
    c = config_from_table({"name": "x", "rpc-local": 2, "override-tensor": f"{EXPERTS}=RPC0[{{rpc1}}]"}, 0)
    assert c.get("override-tensor") == f"{EXPERTS}=RPC0[{{rpc1}}]"
    running = c.with_rpc(("127.0.0.1:50052", "127.0.0.1:50053"))
    assert running.server_argv() == (
        "--rpc",
        "127.0.0.1:50052,127.0.0.1:50053",
        "-ot",
        f"{EXPERTS}=RPC0[127.0.0.1:50053]",
    )


def test_tensor_split_takes_llama_cpps_form_or_a_list():
    assert config_from_table({"name": "x", "tensor-split": [1, 3]}, 0).settings == (("tensor-split", "1/3"),)
    assert config_from_table({"name": "x", "tensor-split": "0.5/1.5"}, 0).server_argv() == ("-ts", "0.5/1.5")


@pytest.mark.parametrize(
    ("table", "needle"),
    [
        ({"override-tensor": []}, "override-tensor must be a list of '<tensor regex>=<buffer type>'"),
        ({"override-tensor": [3]}, "override-tensor must be a list"),
        ({"override-tensor": ["exps"]}, "override-tensor item 'exps' is not '<tensor regex>=<buffer type>'"),
        ({"override-tensor": ["=CPU"]}, "is not '<tensor regex>=<buffer type>'"),
        ({"override-tensor": ["a;b=CPU"]}, "is not '<tensor regex>=<buffer type>'"),
        ({"override-tensor": ["blk\\.(=CPU"]}, "override-tensor pattern 'blk\\\\.(' is not a regular expression"),
        ({"override-tensor": ["exps=RPC0[{rpc0}]"]}, "names {rpc0}, but the configuration has no RPC workers"),
        ({"override-tensor": ["exps=RPC0[{rpc1}]"], "rpc": ["h:1"]}, "names {rpc1}, but the configuration has 1 RPC"),
        ({"override-tensor": ["exps=RPC0[h:2]"], "rpc": ["h:1"]}, "'RPC0[h:2]' is not one of its RPC workers: its"),
        ({"override-tensor": ["exps=RPC0[127.0.0.1:50052]"], "rpc-local": 1}, "write RPC0[{rpc0}] for xover's own"),
        ({"override-tensor": ["exps=RPC0[h:1]"]}, "is not one of its RPC workers: add rpc = "),
        ({"tensor-split": "1/x"}, "tensor-split must give each device's share"),
        ({"tensor-split": [0, 0]}, "tensor-split must give each device's share"),
        ({"tensor-split": [-1, 2]}, "tensor-split must give each device's share"),
        ({"tensor-split": [True, 1]}, "tensor-split must give each device's share"),
    ],
)
def test_bad_placement_keys_are_one_line_errors(table, needle):
    with pytest.raises(XoverError) as e:
        config_from_table({"name": "x", **table}, 0)
    assert needle in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_the_spec_file_takes_the_keys():
    doc = _toml(_spec('name = "local"', 'name = "rpc"\nrpc-local = 1\nrpc-threads = 2'))
    spec = spec_from_dict(doc)
    assert [(c.name, c.rpc_local, c.rpc_threads) for c in spec.configs] == [("local", 0, None), ("rpc", 1, 2)]


def test_plan_shares_workers_per_thread_count_and_resolve_assigns_them():
    cs = tuple(
        config_from_table(t, i)
        for i, t in enumerate(
            [
                {"name": "local"},
                {"name": "one", "rpc-local": 1},
                {"name": "two", "rpc-local": 2},
                {"name": "pinned", "rpc-local": 1, "rpc-threads": 3},
                {"name": "theirs", "rpc": ["10.0.0.2:50052"]},
            ]
        )
    )
    p = workers.plan(cs, cpu_count=4)
    # one: 4 threads (all CPUs), two: 2 each, pinned: 3; a worker of each thread count is shared
    assert p.threads == (4, 2, 2, 3)
    assert dict(p.assigned) == {"one": (0,), "two": (1, 2), "pinned": (3,)}
    from xover.domain.study_spec import StudySpec

    spec = StudySpec(configs=cs, model_preset="tiny-moe")
    got = workers.resolve(spec, ("e0", "e1", "e2", "e3"), p)
    assert [c.rpc for c in got.configs] == [(), ("e0",), ("e1", "e2"), ("e3",), ("10.0.0.2:50052",)]
    assert workers.plan(cs[:1], cpu_count=2).threads == ()
    assert workers.plan(cs[1:2], cpu_count=1).threads == (1,)


def test_startup_lines_and_provenance():
    assert rpc.parse_startup(STARTUP) == (
        "3.0.0",
        "TCP",
        ("CPU: Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz (7936 MiB, 7800 MiB free)",),
    )
    assert rpc.parse_startup("") == (None, None, ())
    cuda = STARTUP.replace(
        "  CPU: Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz (7936 MiB, 7800 MiB free)",
        "  CUDA0: NVIDIA H200 (143156 MiB, 142500 MiB free)",
    ).replace("TCP", "TCP (RDMA auto-negotiate enabled)")
    assert rpc.parse_startup(cuda)[1:] == (
        "TCP (RDMA auto-negotiate enabled)",
        ("CUDA0: NVIDIA H200 (143156 MiB, 142500 MiB free)",),
    )
    info = rpc.WorkerInfo(
        "127.0.0.1:50052",
        "xover",
        build="0c1e570 cpu",
        protocol="3.0.0",
        transport="TCP",
        devices=("CPU: x (1 MiB, 1 MiB free)",),
        threads=2,
    )
    assert (
        info.describe()
        == "127.0.0.1:50052, xover's ggml-rpc-server (0c1e570 cpu, RPC 3.0.0, TCP), -t 2; CPU: x (1 MiB, 1 MiB free)"
    )
    assert "run by the user" in rpc.WorkerInfo("10.0.0.2:50052", "user").describe()
    assert rpc.cuda_env("1", "cuda") == (("CUDA_VISIBLE_DEVICES", "1"),) and rpc.cuda_env("1", "cpu") == ()


def test_local_workers_get_the_gpus_this_host_leaves_them():
    """xover run with CUDA_VISIBLE_DEVICES=0 on a two-GPU machine: its llama processes see GPU 0, its worker GPU 1
    (another card, as on another host); without the variable worker i sees GPU i."""
    assert rpc.worker_gpus(1, "0", 2) == ("1",)
    assert rpc.worker_gpus(3, "0", 3) == ("1", "2", "1")
    assert rpc.worker_gpus(2, "1", 4) == ("0", "2")
    assert rpc.worker_gpus(2, None, 2) == ("0", "1")
    assert rpc.worker_gpus(1, "0", 1) == ("0",)  # no other GPU: the worker shares GPU 0
    assert rpc.worker_gpus(1, "0,1", 2) == ("0",)


def test_worker_argv():
    spec = rpc.WorkerSpec(port=50060, threads=2, env=(("CUDA_VISIBLE_DEVICES", "1"),))
    assert spec.to_argv(Path("/b/ggml-rpc-server")) == [
        "/b/ggml-rpc-server",
        "-H",
        "127.0.0.1",
        "-p",
        "50060",
        "-t",
        "2",
    ]
    assert rpc.WorkerSpec(port=1).to_argv(Path("r"))[-2:] == ["-p", "1"]


def test_free_ports_skip_taken_ones():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        got = rpc.free_ports(2, first=taken)
        assert taken not in got and got[0] > taken


def test_unreachable_user_worker_is_a_one_line_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: refuses connections
        with pytest.raises(XoverError, match=f"RPC worker 127.0.0.1:{port} does not accept connections"):
            rpc.check_reachable([f"127.0.0.1:{port}"], timeout_s=1)


def test_rpc_local_without_a_worker_binary_says_what_to_do(tmp_path: Path):
    spec = spec_from_dict(_toml(_spec('name = "rpc"\nrpc-local = 1')))
    d = tmp_path / "bin"
    d.mkdir()
    b = Binaries(bench=d / "llama-bench", server=d / "llama-server", source="--llama-bin-dir")
    if b.rpc_server is not None:  # one on PATH
        pytest.skip("a ggml-rpc-server is on PATH")
    with pytest.raises(XoverError, match="rpc-local needs llama.cpp's ggml-rpc-server"):
        with workers.study_workers(spec, tmp_path, b):
            pass


def test_free_ports_keep_the_preferred_ones_that_are_free():
    first = rpc.free_ports(3, first=52000)
    assert rpc.free_ports(2, first=52000, preferred=[first[2], first[1]]) == (first[2], first[1])
    with socket.socket() as s:
        s.bind(("127.0.0.1", first[1]))
        s.listen()
        got = rpc.free_ports(2, first=52000, preferred=[first[2], first[1]])
        assert got[0] == first[2] and got[1] not in (first[1], first[2])
