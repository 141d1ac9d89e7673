"""`xover study` end to end on the real CPU binaries: interrupted, resumed without re-measuring,
then the report rendered in a real browser (Debian's Chromium driven by Playwright)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

pytestmark = pytest.mark.real

SPEC = """
[model]
path = "{model}"

[study]
lengths = [256, 1024]
response-tokens = [16]
decode-tokens = 4  # each cold request generates 4 tokens for its decode speed; the totals assume 16
repetitions = 2
rounds = 2  # two rounds of fresh servers, interrupted and resumed between them; no round added
max-rounds = 2
bench-repetitions = 2
pp = 64
tg = 16
cache-length = 1024
skip = ["session"]  # replayed in tests/real/test_session_real.py
tune = false  # a kept knob would add variants to the exact counts below; tests/real/test_tune_real.py covers tuning
cached-turns = [64, 256]  # cached agentic turns on a 512-token context, after each server's cold samples
cached-depth = 512

[[config]]
name = "t=1"
threads = 1

[[config]]
name = "t=2"
threads = 2
"""


def _xover(*args: str) -> list[str]:
    return [sys.executable, "-m", "xover", *args]


def _ids(db: Path) -> tuple[set[int], set[int]]:
    if not db.exists():
        return set(), set()
    con = sqlite3.connect(db)
    try:
        bench = {r[0] for r in con.execute("SELECT id FROM bench_results")}
        ttft = {r[0] for r in con.execute("SELECT id FROM ttft_samples")}
    except sqlite3.OperationalError:
        return set(), set()
    finally:
        con.close()
    return bench, ttft


def _children(pid: int) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.add(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.fixture(scope="module")
def study_dir(tmp_path_factory, tiny_model: Path, llama_bins) -> Path:
    """A small study, interrupted with SIGINT once TTFT samples exist, then resumed to completion."""
    root = tmp_path_factory.mktemp("study")
    spec = root / "spec.toml"
    spec.write_text(SPEC.format(model=tiny_model))
    out = root / "out"
    env = dict(os.environ, XOVER_LLAMA_BIN_DIR=str(llama_bins.bin_dir))
    proc = subprocess.Popen(
        _xover("study", str(spec), "-o", str(out), "-q"),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    llama_pids: set[int] = set()
    deadline = time.monotonic() + 600  # a hang guard, not a speed check: a busy core slows llama.cpp 10x
    while time.monotonic() < deadline and proc.poll() is None:
        llama_pids |= _children(proc.pid)
        if len(_ids(out / "results.sqlite")[1]) >= 2:
            break
        time.sleep(0.05)
    assert proc.poll() is None, f"the study finished before it could be interrupted: {proc.communicate()}"
    llama_pids |= _children(proc.pid)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err
    assert llama_pids and not any(_alive(p) for p in llama_pids), "a llama process outlived the interrupted study"
    before = _ids(out / "results.sqlite")
    assert before[0] and before[1]
    con = sqlite3.connect(out / "results.sqlite")
    assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    con.close()

    done = subprocess.run(
        _xover("study", str(spec), "-o", str(out), "-q"), env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr
    after = _ids(out / "results.sqlite")
    # nothing measured before the interruption was lost or measured again
    assert before[0] <= after[0] and before[1] <= after[1]
    root.joinpath("verdict.txt").write_text(done.stdout)
    return out


def test_resumed_study_measured_each_point_once(study_dir: Path) -> None:
    con = sqlite3.connect(study_dir / "results.sqlite")
    labels = dict(con.execute("SELECT key, label FROM configs"))
    ok = Counter(
        (labels[k], L)
        for k, L in con.execute(
            "SELECT config_key, length FROM ttft_samples WHERE mode='cold' AND cache_ok=1 AND error IS NULL "
            "AND round > 0"
        )
    )
    drift = Counter(
        (labels[k], L)
        for k, L in con.execute("SELECT config_key, length FROM ttft_samples WHERE mode='cold' AND round < 0")
    )
    rounds = Counter(r for (r,) in con.execute("SELECT round FROM ttft_samples WHERE mode='cold' AND round > 0"))
    bench = Counter((labels[k], t) for k, t in con.execute("SELECT config_key, test FROM bench_results"))
    con.close()
    assert ok == {(c, L): 2 * 2 for c in ("t=1", "t=2") for L in (256, 1024)}  # 2 samples in each of 2 rounds
    assert rounds == {1: 8, 2: 8}
    assert drift == {("t=1", 256): 1, ("t=1", 1024): 1}  # the first configuration once more, after the last round
    assert set(bench.values()) == {1}  # every llama-bench test stored exactly once
    assert len(bench) == 2 * 2 * 2  # 2 configs x 2 depths x (pp, tg)
    assert "Verdict" in (study_dir.parent / "verdict.txt").read_text()


def test_cached_turns_are_proven_cached_by_the_real_server_and_answered_per_turn_size(study_dir: Path) -> None:
    """Every cached turn on real llama-server: its 512-token context from the slot's cache (cache_n), its new tokens
    prefilled (prompt_n), 2 samples in each of the 2 rounds (resumed across the interruption), never counted as
    cold; the report answers the pair per turn size and tabulates each configuration's turns."""
    con = sqlite3.connect(study_dir / "results.sqlite")
    labels = dict(con.execute("SELECT key, label FROM configs"))
    rows = con.execute(
        "SELECT config_key, length, round, cache_n, prompt_n, predicted_n FROM ttft_samples "
        "WHERE mode='cached:512' AND cache_ok=1 AND error IS NULL"
    ).fetchall()
    con.close()
    assert rows and all((cache_n, prompt_n) == (512, n) for _, n, _, cache_n, prompt_n, _ in rows), rows
    # each generated the whole 16-token response (not decode-tokens' 4): the verdicts' decode, measured, not scaled
    assert {predicted for *_, predicted in rows} == {16}
    counted = Counter((labels[k], n, r) for k, n, r, *_ in rows)
    assert counted == {(c, n, r): 2 for c in ("t=1", "t=2") for n in (64, 256) for r in (1, 2)}
    md = (study_dir / "report.md").read_text()
    verdicts = md.split("## Verdict", 1)[1].split("## ", 1)[0]
    assert "t=1 vs t=2 on cached turns (512-token context in the cache): " in verdicts
    assert "64-256 new tokens a turn, 16-token responses, 2 rounds of fresh servers" in verdicts
    # which to run: per cold prompt length and per turn size, a winner or the two the rounds cannot part
    work = next(ln for ln in verdicts.splitlines() if "Which to run for which kind of work" in ln)
    assert re.search(r"cold prompts: .+; cached turns on a 512-token context: 64.* new tokens (t=1|t=2)", work), work
    section = md.split("## Cached agentic turns", 1)[1].split("## ", 1)[0]
    assert len([ln for ln in section.splitlines() if ln.startswith("| t=")]) == 4  # 2 configs x 2 turn sizes


def test_chat_shaped_prompts_are_proven_cold_at_their_length_beside_the_blobs(study_dir: Path) -> None:
    """Issue 66: at one length (no length is in the 10K-40K band here, so the longest, 1K) each server also sends the
    prompt as chat on /v1/chat/completions, exactly as long as the server counts it with its chat template, cold
    (cache_n 0) like the blob of that length; the report compares the two shapes, and with 2 rounds calls nothing."""
    con = sqlite3.connect(study_dir / "results.sqlite")
    labels = dict(con.execute("SELECT key, label FROM configs"))
    rows = con.execute(
        "SELECT config_key, length, round, cache_n, prompt_n, prompt_id FROM ttft_samples "
        "WHERE mode='chat' AND cache_ok=1 AND error IS NULL"
    ).fetchall()
    con.close()
    assert rows and all((cache_n, prompt_n) == (0, 1024) for _, _, _, cache_n, prompt_n, _ in rows), rows
    assert all(pid.startswith("chat:") for *_, pid in rows) and len({pid for *_, pid in rows}) == len(rows)
    assert Counter((labels[k], n, r) for k, n, r, *_ in rows) == {
        (c, 1024, r): 2 for c in ("t=1", "t=2") for r in (1, 2)
    }
    section = (study_dir / "report.md").read_text().split("## Chat-shaped prompts", 1)[1].split("## ", 1)[0]
    assert "not yet compared with blobs: fewer than 3 shared rounds" in section
    assert len([ln for ln in section.splitlines() if ln.startswith("| t=")]) == 2


def test_cold_requests_generate_decode_tokens_and_the_totals_assume_the_response(study_dir: Path) -> None:
    """decode-tokens = 4: every cold request (the cached turns generate the whole response) asked for 4 tokens (llama-server's n_predict) and the server decoded
    4; the report reads their decode speed and the verdict prices 16-token responses. (The client may see fewer
    events than tokens: llama-server holds back a byte token that does not end a UTF-8 character.)"""
    con = sqlite3.connect(study_dir / "results.sqlite")
    rows = con.execute("SELECT n_tokens_received, predicted_n FROM ttft_samples WHERE mode='cold'").fetchall()
    con.close()
    assert rows and {predicted for _, predicted in rows} == {4}
    assert all(1 <= received <= 4 for received, _ in rows), rows
    md = (study_dir / "report.md").read_text()
    assert "16-token responses" in md.split("## Verdict", 1)[1].split("## ", 1)[0]
    table = md.split("## Prefill and TTFT", 1)[1].split("## ", 1)[0]
    rows = [ln for ln in table.splitlines() if ln.startswith("| t=")]
    assert len(rows) == 4 and all(ln.rstrip(" |").endswith("(4)") for ln in rows), rows


def test_report_shows_the_blind_prediction_beside_every_point(study_dir: Path) -> None:
    md = (study_dir / "report.md").read_text()
    section = md.split("## Predicted vs measured", 1)[1].split("## ", 1)[0]
    assert "before the first measurement started" in section
    rows = [ln for ln in section.splitlines() if ln.startswith("| t=")]
    assert len(rows) == 4  # 2 configs x 2 lengths
    for row in rows:
        ttft, pp, tg = row.split("|")[3:6]
        assert "/" in ttft and "%" in ttft and "%" in pp and "%" in tg, row


def test_report_rebuilds_offline_and_renders_in_chromium(study_dir: Path, tmp_path: Path) -> None:
    from playwright import sync_api as playwright  # the test extra installs it; never skipped

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "Chromium is needed: scripts/setup.sh test installs Debian's chromium package"
    copy = tmp_path / "copied-study"
    shutil.copytree(study_dir, copy, ignore=shutil.ignore_patterns("models", "report.*", "plot-*.png"))
    r = subprocess.run(_xover("report", str(copy)), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    html = copy / "report.html"
    assert "http://" not in html.read_text() and "https://" not in html.read_text()  # nothing to fetch
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=chromium,
            args=[
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
            ],
        )
        try:
            page = browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("requestfailed", lambda req: errors.append(f"request failed: {req.url}"))
            page.goto(html.as_uri())
            images = page.evaluate("""() => Array.from(document.images).map(img => {
                const c = document.createElement('canvas'); c.width = img.naturalWidth; c.height = img.naturalHeight;
                const ctx = c.getContext('2d'); ctx.drawImage(img, 0, 0);
                const d = ctx.getImageData(0, 0, c.width, c.height).data; let ink = 0;
                for (let i = 0; i < d.length; i += 4) if (d[i] < 240 || d[i + 1] < 240 || d[i + 2] < 240) ink++;
                return {id: img.id, ok: img.complete && img.naturalWidth > 0, ink: ink / (d.length / 4)}; })""")
            title = page.title()
        finally:
            browser.close()
    assert errors == []
    assert "xover report" in title
    ids = {i["id"] for i in images}
    assert {"plot-total", "plot-ttft", "plot-depth"} <= ids
    for img in images:
        assert img["ok"], img
        assert 0.02 < img["ink"] < 0.9, img  # drawn on, not blank (and not a solid block)


def test_a_moved_study_of_a_preset_resumes_without_measuring_again(tmp_path: Path, llama_bins) -> None:
    """A preset's model is linked into the study's own models/, so its path is in every llama-server argument
    list the store keeps. Copied elsewhere, the study still finds its samples (same server, same model) and
    measures nothing again."""
    spec = tmp_path / "spec.toml"
    spec.write_text(
        '[model]\npreset = "tiny-moe"\n[study]\nlengths = [256]\nresponse-tokens = [8]\nrepetitions = 1\nrounds = 1\n'
        "max-rounds = 1\n"
        'tune = false\nskip = ["bench", "cache", "session"]\n[[config]]\nname = "t=2"\nthreads = 2\n'
    )
    env = dict(os.environ, XOVER_LLAMA_BIN_DIR=str(llama_bins.bin_dir))
    first = tmp_path / "first"
    r = subprocess.run(_xover("study", str(spec), "-o", str(first), "-q"), env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    moved = tmp_path / "moved"
    shutil.copytree(first, moved, symlinks=False)
    before = _ids(moved / "results.sqlite")[1]
    assert len(before) == 3  # round 1's cold sample and its chat-shaped one (the one length), the drift check's
    r = subprocess.run(_xover("study", str(spec), "-o", str(moved)), env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert _ids(moved / "results.sqlite")[1] == before
    assert "ttft: nothing left to measure: every configuration's cold samples are stored" in r.stdout + r.stderr
