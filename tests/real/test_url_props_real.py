"""`xover ttft --url` rests its gap warning on what the real server reports (issue 18, item 4).

With ``--url`` xover did not start the server, so it knows its flags only from ``/props``. The pinned
llama-server (0c1e570) reports ``total_slots`` there but not ``--cache-ram``
(``tools/server/server-context.cpp``, ``get_res_props``). A server started with ``-np 1 --cache-ram 0``
must therefore not be told that several slots may cause its gap; one started with llama-server's
defaults reports several slots, and the warning names them. The warning text is checked on a point
whose gap is made large (the real gaps here are a few ms and need not trigger it).
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from xover.analysis.stats import summarize
from xover.cli import main
from xover.domain.config import LlamaConfig
from xover.llamacpp.binaries import Binaries
from xover.llamacpp.server import LlamaServer, ServerLaunch, context_size
from xover.measure.ttft import TtftPlan, TtftRun, gap_note, summarize_points
from xover.results.store import Store

pytestmark = pytest.mark.real


def _measure_url(bins: Binaries, model: Path, tmp_path: Path, cold_cache: bool, capsys: pytest.CaptureFixture[str]):  # type: ignore[no-untyped-def]
    config = LlamaConfig("served", settings=(("threads", "2"),))
    spec = ServerLaunch(config, model, context_size(256, 8), cold_cache=cold_cache)
    plan = TtftPlan(lengths=(64,), reps=1, response_tokens=4, seed=11)

    async def go():  # type: ignore[no-untyped-def]
        async with LlamaServer(bins.server, spec, tmp_path / "logs") as srv:
            with Store(tmp_path / "run") as store:
                outcome = await TtftRun(store, plan, ["test"]).run_url(srv.url)
            # the CLI as a user types it, against the same server
            await asyncio.to_thread(
                _cli, ["ttft", "--url", srv.url, "--lengths", "64", "-r", "1", "-R", "4", "-o", str(tmp_path / "cli")]
            )
            return outcome, srv.props

    return asyncio.run(go())


def _cli(argv: list[str]) -> None:
    try:
        main(argv)
    except SystemExit as e:
        assert e.code in (0, None)


def _large_gap(outcome):  # type: ignore[no-untyped-def]
    (point,) = summarize_points(outcome.samples)
    return dataclasses.replace(point, ttft_ns=summarize([30_000e6]), gap_ns=summarize([1_100e6]))


def test_one_slot_no_cache_ram_server_is_not_blamed_on_slots(
    llama_bins: Binaries, tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    outcome, props = _measure_url(llama_bins, tiny_model, tmp_path, True, capsys)
    assert props["total_slots"] == 1 and "cache_ram" not in str(props)  # what /props says, and what it does not
    (key,) = outcome.labels
    assert outcome.slots[key] == 1 and outcome.cold_cache[key] is None
    note = gap_note(_large_gap(outcome), outcome.labels[key], outcome.cold_cache[key], outcome.slots[key])
    assert note is not None and "reports 1 slot (/props) but not whether --cache-ram is on" in note
    assert "several slots" not in note
    assert "several slots" not in capsys.readouterr().err


def test_default_server_reports_its_slots(
    llama_bins: Binaries, tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    outcome, props = _measure_url(llama_bins, tiny_model, tmp_path, False, capsys)
    (key,) = outcome.labels
    assert outcome.slots[key] == props["total_slots"] > 1
    note = gap_note(_large_gap(outcome), outcome.labels[key], outcome.cold_cache[key], outcome.slots[key])
    assert (
        note is not None and f"reports {props['total_slots']} slots (/props)" in note and "-np 1 --cache-ram 0" in note
    )
