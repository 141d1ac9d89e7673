"""TTFT through the real llama-server (CPU build) on the tiny-moe model: the cold check is exact.

What these establish about the pinned llama-server (0c1e570):
* a prompt of L token ids is evaluated as exactly L tokens, even for a model that adds BOS (it
  is added to text prompts only, and ``/tokenize`` with ``add_special`` counts it);
* with ``-np 1 --cache-ram 0`` and ``cache_prompt: false`` every sample is ``cache_n == 0``;
* resending a prompt with ``cache_prompt: true`` gives ``cache_n == L - 1, prompt_n == 1``;
* with default settings (several slots, host-memory prompt cache) a naive client that resends an
  earlier prompt after a different one gets it from a cache, and the cold check catches it.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from procs import pid_gone
from xover.cli import main
from xover.client.http import completion_body
from xover.domain.config import LlamaConfig
from xover.domain.prompts import TokenPrompts, token_pool
from xover.llamacpp.binaries import Binaries
from xover.llamacpp.server import LlamaServer, ServerLaunch, context_size
from xover.measure.ttft import TtftPlan, TtftRun, check_cache, gguf_token_types, summarize_points
from xover.results.store import Store

pytestmark = pytest.mark.real

THREADS = 2  # the test machine has 2 cores


@pytest.fixture(scope="module")
def bos_model(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny-moe with ``tokenizer.ggml.add_bos_token`` flipped to true (the preset says false)."""
    import gguf

    path = tmp_path_factory.mktemp("bos") / "tiny-moe-bos.gguf"
    shutil.copy(tiny_model, path)
    field = gguf.GGUFReader(path, "r+").get_field("tokenizer.ggml.add_bos_token")
    assert field is not None
    field.parts[field.data[0]][0] = True
    return path


def _spec(model: Path, label: str = "tiny", max_len: int = 1024, cold_cache: bool = True) -> ServerLaunch:
    config = LlamaConfig(label, settings=(("threads", str(THREADS)),))
    return ServerLaunch(config, model, context_size(max_len, 16), cold_cache=cold_cache)


def _run(tmp_path: Path, bins: Binaries, model: Path, plan: TtftPlan, specs: list[ServerLaunch]):  # type: ignore[no-untyped-def]
    with Store(tmp_path) as store:
        out = asyncio.run(
            TtftRun(store, plan, ["test"], binaries=bins, model=model).run_managed(specs, tmp_path / "logs")
        )
        pids = [body["pid"] for _, _, body in store.artifacts("server-props")]
        prov = store.runs()[-1]["provenance"]
    return out, pids, prov


def test_cold_samples_pass_the_cold_check_at_several_lengths(
    tmp_path: Path, llama_bins: Binaries, tiny_model: Path
) -> None:
    plan = TtftPlan(lengths=(64, 256, 1024), reps=2, response_tokens=8, seed=1)
    out, pids, prov = _run(tmp_path, llama_bins, tiny_model, plan, [_spec(tiny_model)])
    assert out.failures == ()
    assert len(out.samples) == 6
    for s in out.samples:
        assert s.error is None and s.cache_ok
        assert s.timings is not None and (s.timings.cache_n, s.timings.prompt_n) == (
            0,
            s.length,
        )  # no BOS on id prompts
        assert s.timings.predicted_n == 8  # ignore_eos: exactly n_predict
        # random weights emit raw bytes: a token that ends inside a UTF-8 character is held back and streamed with
        # the next (one chunk for two tokens, anywhere in the answer), and a last one is never streamed (seen: 6 of 8)
        assert 0 < s.n_tokens_received <= s.timings.predicted_n
        assert s.first_byte_ns is not None and s.first_token_ns is not None and s.end_ns is not None
        assert s.first_byte_ns <= s.first_token_ns <= s.end_ns
        assert s.first_token_ns > s.timings.prompt_ms * 1e6  # client TTFT contains the server's prefill
    assert len({s.prompt_id for s in out.samples}) == 6
    assert prov.llama_build_commit == "0c1e570"
    assert all(pid_gone(p) for p in pids)
    for p in summarize_points(out.samples):
        assert p.n_ok == 2 and p.ttft_ns is not None and p.gap_ns is not None


def test_warm_resend_is_served_from_the_slot(tmp_path: Path, llama_bins: Binaries, tiny_model: Path) -> None:
    plan = TtftPlan(lengths=(64, 512), reps=2, response_tokens=8, mode="warm", seed=2)
    out, _, _ = _run(tmp_path, llama_bins, tiny_model, plan, [_spec(tiny_model)])
    assert out.failures == () and len(out.samples) == 4
    for s in out.samples:
        assert s.cache_ok and s.timings is not None
        assert (s.timings.cache_n, s.timings.prompt_n) == (s.length - 1, 1)


@pytest.mark.parametrize("text", [False, True], ids=["ids", "text"])
def test_length_is_exact_on_a_model_that_adds_bos(
    tmp_path: Path, llama_bins: Binaries, bos_model: Path, text: bool
) -> None:
    plan = TtftPlan(lengths=(64, 300), reps=1, response_tokens=8, text=text, seed=3)
    out, _, _ = _run(tmp_path, llama_bins, bos_model, plan, [_spec(bos_model)])
    assert out.failures == ()
    assert [(s.length, s.timings.prompt_n if s.timings else None, s.cache_ok) for s in out.samples] == [
        (64, 64, True),
        (300, 300, True),
    ]
    assert all(s.prompt_id.startswith("text:" if text else "ids:") for s in out.samples)


async def _a_b_a(srv: LlamaServer, cache_prompt: bool, length: int) -> list[str | None]:
    """Send prompt A, then B, then A again; the cold check of each response."""
    assert srv.client is not None
    maker = TokenPrompts(token_pool(gguf_token_types(srv.spec.model)), seed=4)
    a, b = maker.make(0, length).prompt, maker.make(1, length).prompt
    checks = []
    for prompt in (a, b, a):
        rec = await srv.client.stream_completion(completion_body(prompt, 8, cache_prompt=cache_prompt))
        assert rec.result.error is None
        checks.append(check_cache("cold", length, rec.result.timings))
    return checks


def test_default_cache_settings_are_detected_as_cache_assisted(
    tmp_path: Path, llama_bins: Binaries, tiny_model: Path
) -> None:
    async def go(spec: ServerLaunch, cache_prompt: bool) -> list[str | None]:
        async with LlamaServer(llama_bins.server, spec, tmp_path) as srv:
            return await _a_b_a(srv, cache_prompt, 256)

    naive = asyncio.run(go(_spec(tiny_model, "defaults", cold_cache=False), cache_prompt=True))
    assert naive[:2] == [None, None]
    assert naive[2] is not None and naive[2].startswith("cold check failed: cache_n=255 prompt_n=1")
    controlled = asyncio.run(go(_spec(tiny_model, "controlled"), cache_prompt=False))
    assert controlled == [None, None, None]


def test_server_is_gone_after_the_context_even_on_error(tmp_path: Path, llama_bins: Binaries, tiny_model: Path) -> None:
    pids: list[int] = []

    async def go() -> None:
        async with LlamaServer(llama_bins.server, _spec(tiny_model), tmp_path) as srv:
            assert srv.pid is not None and srv.props["total_slots"] == 1 and srv.model_meta["n_vocab"] == 1024
            pids.append(srv.pid)
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        asyncio.run(go())
    assert len(pids) == 1 and pid_gone(pids[0])


def test_cli_end_to_end(
    tmp_path: Path, tiny_model: Path, llama_bins: Binaries, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        main(
            [
                "ttft",
                "-m",
                str(tiny_model),
                "--ncmoe",
                "0,2",
                "--lengths",
                "64,256",
                "-r",
                "1",
                "--response-tokens",
                "8",
                "--threads",
                str(THREADS),
                "-o",
                str(tmp_path),
                "--llama-bin-dir",
                str(llama_bins.bin_dir),
            ]
        )
    except SystemExit as e:
        assert e.code in (0, None)
    out = capsys.readouterr().out
    assert "ncmoe=0" in out and "ncmoe=2" in out and "1/1" in out
    with Store(tmp_path) as store:
        samples = [s for _, _, _, s in store.ttft_samples()]
        configs = store.configs()
    assert len(samples) == 4 and all(s.cache_ok for s in samples)
    # the configurations are what was asked (xover's own -np 1 --cache-ram 0 -fit off are not part of them) ...
    assert sorted(c.settings for c in configs) == [
        (("n-cpu-moe", "0"), ("threads", str(THREADS))),
        (("n-cpu-moe", "2"), ("threads", str(THREADS))),
    ]
    # ... and every server was started with them
    for log in (tmp_path / "logs").iterdir():
        command = log.read_text().splitlines()[0].split()
        assert {"-np", "--cache-ram", "-fit"} <= set(command), command
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == ["server-ncmoe=0-1.log", "server-ncmoe=2-1.log"]


def test_the_first_measured_prompt_costs_what_the_same_prompt_costs_later(
    llama_bins: Binaries, tiny_model: Path, tmp_path: Path
) -> None:
    """Issue 66: after an 8-token warm-up, a fresh server's first large prompt paid one-time costs: about 1.4x the
    same length later in the same server here (256-512 tokens, tiny-moe, one thread), 1.4-2.2x on the H200. The warm-up
    now prefills the server's largest ubatch, then its shortest length, both discarded.

    Sixteen fresh servers each measure six cold 256-token prompts. Were the first no different from the later ones,
    each of a server's six would be its slowest one time in six, and the first would be slowest in 9 or more of 16
    servers about 4 times in 10,000; with the one-time cost (here about 2-10 ms on a 22 ms prompt, idle) it was the
    slowest in 6 of 8 servers, a rate at which 9 or more of 16 come about 97 times in 100. The server's own prefill
    time (``prompt_ms``) is compared, not the client's clock."""
    servers = 16
    specs = [ServerLaunch(LlamaConfig(f"s{i}", settings=(("threads", "1"),)), tiny_model, 4096) for i in range(servers)]
    plan = TtftPlan(lengths=(256,), reps=6, response_tokens=4)
    out, _, _ = _run(tmp_path, llama_bins, tiny_model, plan, specs)
    assert not out.failures
    assert len(out.samples) == servers * 6  # one configuration's servers, one after another: six samples each
    slowest_first = 0
    for i in range(servers):
        mine = out.samples[6 * i : 6 * i + 6]
        assert [s.rep for s in mine] == list(range(6)) and all(s.cache_ok for s in mine)
        ms = [s.timings.prompt_ms for s in mine if s.timings is not None and s.timings.prompt_ms is not None]
        assert len(ms) == 6
        slowest_first += ms[0] > max(ms[1:])
    assert slowest_first <= 8, f"the first prompt was the slowest of its server in {slowest_first} of {servers}"
    # each server's provenance says which of llama-server's own defaults xover overrode, and what they were
    with Store(tmp_path) as store:
        bodies = [body for _, _, body in store.artifacts("server-props")]
    assert len(bodies) == servers and all(
        b["overrode"]
        == [
            {"flag": "-np", "value": "1", "default": "-1"},
            {"flag": "--cache-ram", "value": "0", "default": "8192"},
            {"flag": "-fit", "value": "off", "default": "on"},
        ]
        for b in bodies
    )
