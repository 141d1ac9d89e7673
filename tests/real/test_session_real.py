"""Agentic session replay through the real llama-server (CPU build) on tiny-moe.

A 4-turn session (system prompt ~1.3K tokens, tiny-moe's byte-level vocabulary so chars_per_token
1, a context rewrite at turn 3 that deletes a function from a file read at turn 1) is replayed in
the three cache modes, 8 response tokens per turn. cache_n / prompt_n are exact facts and asserted
exactly; times only for order.

What this establishes about the pinned llama-server (0c1e570):
* its default chat template for a GGUF without one (chatml) serves the session, and
  ``/apply-template`` + ``/tokenize`` count exactly the tokens the chat endpoint evaluates;
* with the default cache a turn is served from cache up to exactly the unchanged prefix; the
  fed-back reply does not match the cached generated tokens here (tiny-moe's padding tokens come
  back as text), so everything after the prefix is prefilled;
* with cache_prompt false on ``-np 1 --cache-ram 0`` every turn is cold;
* after the rewrite, default caching falls back to the common prefix and --cache-reuse recovers
  the text after the deleted block.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from xover.cli import main
from xover.domain.config import LlamaConfig
from xover.domain.records import SessionTurn
from xover.domain.workload import WorkloadSpec, dumps, generate
from xover.llamacpp import process
from xover.llamacpp.binaries import Binaries
from xover.measure.events import ConfigFailed, SessionEvent, Sized
from xover.measure.session import SessionOutcome, run_session
from xover.results.store import Store

pytestmark = pytest.mark.real

THREADS = (("threads", "2"),)  # the test machine has 2 cores


def _config(name: str, settings: tuple[tuple[str, str], ...] = THREADS, **kw: object) -> LlamaConfig:
    return LlamaConfig(name, settings, **kw)  # type: ignore[arg-type]


SPEC = WorkloadSpec(seed=1, turns=4, system_tokens=1200, target_tokens=4000, rewrite_every=3, chars_per_token=1.0)
REWRITE = 3
RESPONSE = 8


@pytest.fixture(scope="module")
def workload(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("workload") / "session.jsonl"
    path.write_text(dumps(generate(SPEC)), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def short_workload(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two turns, about 1.1K and 2.5K tokens."""
    path = tmp_path_factory.mktemp("workload") / "short.jsonl"
    path.write_text(
        dumps(
            generate(
                WorkloadSpec(
                    seed=2, turns=2, system_tokens=1024, target_tokens=2048, rewrite_every=0, chars_per_token=1.0
                )
            )
        ),
        encoding="utf-8",
    )
    return path


@pytest.fixture(scope="module")
def replay(
    tmp_path_factory: pytest.TempPathFactory, llama_bins: Binaries, tiny_model: Path, workload: Path
) -> tuple[SessionOutcome, list[SessionEvent], Path]:
    study = tmp_path_factory.mktemp("study")
    events: list[SessionEvent] = []
    out = run_session(
        study,
        llama_bins,
        tiny_model,
        workload,
        [_config("tiny")],
        ("default", "off", "reuse"),
        RESPONSE,
        command=["test"],
        on_event=events.append,
    )
    assert process.live_pids() == []
    return out, events, study


def _by_mode(out: SessionOutcome) -> dict[str, list[SessionTurn]]:
    modes: dict[str, list[SessionTurn]] = {}
    for t in out.turns:
        modes.setdefault(t.mode, []).append(t)
    return modes


def _n(t: SessionTurn) -> tuple[int, int]:
    assert t.timings is not None and t.timings.cache_n is not None and t.timings.prompt_n is not None
    return t.timings.cache_n, t.timings.prompt_n


def test_every_turn_is_measured_and_consistent(replay: tuple[SessionOutcome, list[SessionEvent], Path]) -> None:
    out, events, _ = replay
    assert out.failures == ()
    modes = _by_mode(out)
    assert {m: [t.turn for t in ts] for m, ts in modes.items()} == {
        m: list(range(SPEC.turns)) for m in ("default", "off", "reuse")
    }
    sized = [e for e in events if isinstance(e, Sized)]
    assert len(sized) == 1 and sized[0].reply_growth is not None and out.ctx_size == sized[0].ctx_size
    for t in out.turns:
        cache_n, prompt_n = _n(t)
        assert t.error is None and t.prompt_tokens == cache_n + prompt_n and t.cached_tokens == cache_n
        assert t.completion_tokens == RESPONSE and t.timings is not None and t.timings.predicted_n == RESPONSE
        assert t.first_byte_ns is not None and t.first_token_ns is not None and t.end_ns is not None
        assert t.first_byte_ns <= t.first_token_ns <= t.end_ns
        assert t.first_token_ns > (t.timings.prompt_ms or 0) * 1e6  # client TTFT contains the server's prefill
        assert t.reply_tokens is not None and t.feed == "generated"
        assert t.rewrite == (t.turn == REWRITE)
    # greedy decoding: every mode fed back the same replies, so every mode sent the same prompts
    assert len({tuple(t.prompt_tokens for t in ts) for ts in modes.values()}) == 1
    prompts = [t.prompt_tokens or 0 for t in modes["default"]]
    assert 1000 < prompts[0] < 2500 and prompts == sorted(prompts)


def test_default_cache_serves_the_unchanged_prefix(replay: tuple[SessionOutcome, list[SessionEvent], Path]) -> None:
    turns = _by_mode(replay[0])["default"]
    assert _n(turns[0]) == (0, turns[0].prompt_tokens)
    for t in turns[1:]:
        cache_n, prompt_n = _n(t)
        assert t.prefix_tokens is not None
        appended = (t.prompt_tokens or 0) - t.prefix_tokens
        assert cache_n == t.prefix_tokens and prompt_n == appended
    before, after = turns[REWRITE - 1], turns[REWRITE]
    assert (after.prefix_tokens or 0) < (before.prompt_tokens or 0)  # the rewrite broke the prefix match
    assert _n(after)[0] < _n(before)[0] + _n(before)[1]


def test_caching_off_prefills_every_turn_in_full(replay: tuple[SessionOutcome, list[SessionEvent], Path]) -> None:
    for t in _by_mode(replay[0])["off"]:
        assert _n(t) == (0, t.prompt_tokens)


def test_cache_reuse_recovers_text_after_the_rewrite(replay: tuple[SessionOutcome, list[SessionEvent], Path]) -> None:
    modes = _by_mode(replay[0])
    default, reuse = modes["default"][REWRITE], modes["reuse"][REWRITE]
    assert _n(reuse)[0] > _n(default)[0] == default.prefix_tokens
    assert _n(reuse)[1] < _n(default)[1]
    for d, r in zip(modes["default"], modes["reuse"]):  # elsewhere reuse has nothing more to find
        if d.turn != REWRITE:
            assert _n(d) == _n(r)


def test_turns_and_provenance_are_stored(replay: tuple[SessionOutcome, list[SessionEvent], Path]) -> None:
    out, _, study = replay
    with Store(study) as st:
        stored = [t for _, _, _, t in st.session_turns()]
        run = st.runs()[-1]
        (config,) = st.configs()  # three cache modes, one configuration
        props = [body for _, _, body in st.artifacts("server-props")]
    assert stored == list(out.turns) and {t.config_key for t in stored} == {config.key}
    assert run["kind"] == "session" and run["status"] == "done"
    assert run["provenance"].llama_build_commit == "0c1e570" and run["provenance"].model is not None
    args = {b["mode"]: b["args"] for b in props}  # each server's whole argument list is its provenance
    assert {"-np", "--cache-ram"} <= set(args["off"]) and "--cache-reuse" not in args["off"]
    assert "--cache-reuse" in args["reuse"] and "--cache-ram" not in args["default"]
    logs = sorted(p.name for p in (study / "logs").iterdir())
    assert logs == [
        "server-sizing-1.log",
        "server-tiny-default-1.log",
        "server-tiny-off-1.log",
        "server-tiny-reuse-1.log",
    ]
    from xover.report.export import sample_rows

    rows = sample_rows(study, "session")  # `xover export --what session`: one flat row per stored turn
    assert [(r["mode"], r["turn"], r["prompt_tokens"]) for r in rows] == [
        (t.mode, t.turn, t.prompt_tokens) for t in stored
    ]


def test_exact_replay_sends_the_recorded_replies(
    tmp_path: Path, llama_bins: Binaries, tiny_model: Path, short_workload: Path
) -> None:
    out = run_session(
        tmp_path, llama_bins, tiny_model, short_workload, [_config("tiny")], ("default",), RESPONSE, exact=True
    )
    assert out.failures == () and [t.turn for t in out.turns] == [0, 1]
    assert all(t.feed == "recorded" and t.reply_tokens is None for t in out.turns)
    assert _n(out.turns[1]) == (
        out.turns[1].prefix_tokens,
        (out.turns[1].prompt_tokens or 0) - out.turns[0].prompt_tokens,
    )


def test_a_turn_past_the_context_fails_that_replay_only(
    tmp_path: Path, llama_bins: Binaries, tiny_model: Path, short_workload: Path
) -> None:
    events: list[SessionEvent] = []
    out = run_session(
        tmp_path,
        llama_bins,
        tiny_model,
        short_workload,
        [_config("small"), _config("big", server_args=("-c", "4096"))],
        ("off",),
        RESPONSE,
        exact=True,
        ctx_size=2048,
        on_event=events.append,
    )
    assert [(out.labels[t.config_key], t.turn) for t in out.turns] == [("small", 0), ("big", 0), ("big", 1)]
    (failed,) = [e for e in events if isinstance(e, ConfigFailed)]
    assert failed.label == "small" and failed.skipped == 1
    assert "exceed the server's 2048-token context: pass a larger --ctx-size" in failed.reason
    with Store(tmp_path) as st:
        assert st.runs()[-1]["status"] == "failed" and len(st.failures()) == 1


def test_a_configuration_placed_for_a_shorter_context_is_not_started(
    tmp_path: Path, llama_bins: Binaries, tiny_model: Path, short_workload: Path
) -> None:
    """A "fit" level placed for 2,048 tokens would not load under its budget at the session's 4,096: it is
    recorded as a failure that says so, without a server, and the configuration that holds it is replayed."""
    events: list[SessionEvent] = []
    out = run_session(
        tmp_path,
        llama_bins,
        tiny_model,
        short_workload,
        [_config("long"), _config("short", (("threads", "1"),), max_context=2048)],  # each its own key
        ("off",),
        RESPONSE,
        exact=True,
        ctx_size=4096,
        on_event=events.append,
    )
    assert [(out.labels[t.config_key], t.turn) for t in out.turns] == [("long", 0), ("long", 1)]
    (failed,) = [e for e in events if isinstance(e, ConfigFailed)]
    assert failed.label == "short" and failed.skipped == 2
    assert "short is placed for 2,048 tokens (its fit level) and the session needs a 4,096-token context" in (
        failed.reason
    )
    assert not list((tmp_path / "logs").glob("server-short*"))
    with Store(tmp_path) as st:
        assert len(st.failures()) == 1


def test_cli_end_to_end(
    tmp_path: Path, tiny_model: Path, llama_bins: Binaries, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        main(
            [
                "session",
                "-m",
                str(tiny_model),
                "--turns",
                "2",
                "--system-tokens",
                "512",
                "--target-tokens",
                "1k",
                "--chars-per-token",
                "1",
                "--response-tokens",
                "4",
                "--cache-modes",
                "default",
                "--threads",
                "2",
                "-o",
                str(tmp_path),
                "--llama-bin-dir",
                str(llama_bins.bin_dir),
            ]
        )
    except SystemExit as e:
        assert e.code in (0, None)
    captured = capsys.readouterr()
    assert "agentic session replay" in captured.out and "Over the whole 2-turn agentic session" in captured.out
    assert "--exact" in captured.err  # tiny-moe's replies come back longer: the note says what to do
    (generated,) = tmp_path.glob("session-seed0-turns2-*.jsonl")
    with Store(tmp_path) as st:
        assert [t.turn for _, _, _, t in st.session_turns()] == [0, 1]
    assert (
        generated.read_bytes()
        == dumps(generate(WorkloadSpec(turns=2, system_tokens=512, target_tokens=1024, chars_per_token=1.0))).encode()
    )
