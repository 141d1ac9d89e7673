"""Which backend? (issue 45) The pinned llama.cpp built twice by xover, for the CPU and for Vulkan (on Mesa's lavapipe
here), compared in one study on tiny-moe as the README shows it; every record and server checked against its
build's backend; a Vulkan build that finds no device refused in one line with nothing stored."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from xover.analysis.crossover import round_interval
from xover.results.read_model import cached_inputs, crossover_inputs, load

pytestmark = pytest.mark.real
EXAMPLE = Path(__file__).parents[2] / "examples" / "backends.toml"  # run as the README shows it


def _xover(*args: str, env: dict[str, str] | None = None, timeout: int = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "xover", *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def test_the_example_compares_the_cpu_and_vulkan_builds_each_on_its_own(llama_bins, vulkan_bins, tmp_path) -> None:
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith("XOVER_LLAMA")}
    r = _xover("study", str(EXAMPLE), "-o", str(out), "-q", env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    db = sqlite3.connect(out / "results.sqlite")
    label_of = dict(db.execute("SELECT key, label FROM configs"))
    # every cold sample of both, in rounds 1 to 3 of fresh servers, proven cold
    rounds: dict[str, list[int]] = {}
    for key, length, cache_n, prompt_n, rnd in db.execute(
        "SELECT config_key, length, cache_n, prompt_n, round FROM ttft_samples WHERE mode = 'cold'"
    ):
        assert (cache_n, prompt_n) == (0, length)
        rounds.setdefault(label_of[key], []).append(rnd)
    for label in ("cpu", "vulkan"):
        assert sorted(x for x in rounds[label] if x > 0) == [1, 1, 2, 2, 3, 3], label
    # the cached turns of both: the 512-token context proven cached
    cached = db.execute("SELECT config_key, cache_n FROM ttft_samples WHERE mode LIKE 'cached:%'").fetchall()
    assert {label_of[k] for k, _ in cached} == {"cpu", "vulkan"} and all(c == 512 for _, c in cached)
    # each server's devices stored with it: lavapipe's for Vulkan, none for the CPU build
    props = [json.loads(b) for (b,) in db.execute("SELECT body FROM artifacts WHERE name = 'server-props'")]
    devices = {p["label"]: p.get("devices") for p in props}
    assert devices["cpu"] is None and "Vulkan0 (llvmpipe" in devices["vulkan"]
    # the runs' provenance: the build, its backend, the device and the driver
    provs = [json.loads(p) for (p,) in db.execute("SELECT provenance FROM runs")]
    vk = [p for p in provs if p["llama_backend"] == "Vulkan"]
    assert vk and all(p["llama_bin_dir"] == str(vulkan_bins.bin_dir) for p in vk)
    extra = dict(vk[0]["extra"])
    assert "llvmpipe" in extra["devices"] and "llvmpipe" in extra.get("driver", "llvmpipe")
    assert {p["llama_backend"] for p in provs} == {"CPU", "Vulkan"}
    # the verdicts compare the two builds, each at its own defaults
    report = (out / "report.md").read_text()
    assert "Builds: llama.cpp:cpu: cpu; llama.cpp:vulkan: vulkan." in report
    # lavapipe prefills at tens of tokens a second where the CPU build does thousands: no round interval calls vulkan
    # faster. Whether 3 rounds *call* cpu faster is the spread's to decide (issue 64): t(2) = 4.3, so one round slowed
    # ~10x by a busy core (llama.cpp's threads wait on each other) widens the interval past 1. The verdicts and
    # "which to run" follow the stored round-paired intervals, whichever way they went.
    data = load(out)
    called: dict[tuple[str, int], bool] = {}  # (kind of turn, size) -> 3 rounds call cpu faster there
    for kind, inputs, sizes in (("cold", crossover_inputs(data), (128, 512)), ("cached", cached_inputs(data), (64,))):
        cpu, vk = (next(c for c in inputs if c.label == label) for label in ("cpu", "vulkan"))
        for n in sizes:
            r = round_interval(cpu, vk, n, 16)  # cpu's total time per turn over vulkan's, paired by round
            assert r is not None and r.n == 3, (kind, n, r)
            assert r.sign <= 0, (kind, n, r)  # never vulkan faster (a round of a cpu server starved by another
            # program can put even cpu's median above lavapipe's: seen with the machine far oversubscribed)
            called[kind, n] = r.sign < 0
    cold = [called["cold", n] for n in (128, 512)]
    told = (
        "cpu is faster at every measured length ("
        if all(cold)
        else "cpu is faster at every length where they differ ("
        if any(cold)
        else "indistinguishable here at every measured length ("
    )
    assert f"- cpu vs vulkan: {told}" in report
    told = (
        "cpu is faster for every turn size measured ("
        if called["cached", 64]
        else "indistinguishable here at every turn size measured ("
    )
    assert f"- cpu vs vulkan on cached turns (512-token context in the cache): {told}" in report
    # "which to run": cpu, alone where the rounds call it, else with vulkan (the rounds cannot part them)
    which = {True: "cpu", False: "cpu or vulkan (indistinguishable here)"}
    on_cold = f"128-512 {which[cold[0]]}" if cold[0] == cold[1] else f"128 {which[cold[0]]}, 512 {which[cold[1]]}"
    on_cached = f"64 new tokens {which[called['cached', 64]]}"
    assert f"cold prompts: {on_cold}; cached turns on a 512-token context: {on_cached}." in report
    # every server's warm-up went through its prompt path (issue 66): the Vulkan servers' first prompt prefilled
    # past a whole ubatch, toward 4,096 positions, within the 1,024-token context less room for its answer (its
    # pipelines compiled before anything was measured); the CPU servers' filled their 512-token ubatch; then each
    # sent one of the study's shortest length, 128 tokens
    for logs in (sorted((out / "logs").glob(f"server-{name}-*.log")) for name in ("vulkan", "cpu")):
        warm = [
            [int(n) for n in re.findall(r"new prompt, .* task\.n_tokens = (\d+)", log.read_text())[:2]] for log in logs
        ]
        fill = 1024 - 8 if "vulkan" in logs[0].name else 512
        assert len(warm) >= 3 and all(w == [fill, 128] for w in warm), warm
    # the Vulkan build's first server on this machine was started and warmed once before round 1, and nothing of
    # it was stored; the CPU build compiles nothing, so it has none
    (prewarm,) = (out / "logs").glob("server-prewarm-*.log")
    assert prewarm.name == "server-prewarm-vulkan-1.log"
    assert "task.n_tokens = 1016" in prewarm.read_text()


def _vulkan_only(tmp_path: Path, env_line: str = "") -> Path:
    spec = tmp_path / "vk.toml"
    spec.write_text(
        '[model]\npreset = "tiny-moe"\n[study]\nlengths = [256]\nresponse-tokens = [8]\nrepetitions = 1\n'
        'rounds = 1\nmax-rounds = 1\nskip = ["tune", "cache", "session"]\n'
        f'[[config]]\nname = "vk"\nbackend = "vulkan"\n{env_line}'
    )
    return spec


@pytest.mark.parametrize(
    ("env_line", "env", "cause"),
    [
        # lavapipe is the only device and ggml_vulkan skips CPU drivers unless GGML_VK_VISIBLE_DEVICES names them
        ("", {}, "lavapipe"),
        # no ICD at all: the loader finds no driver
        ('env = { GGML_VK_VISIBLE_DEVICES = "0" }\n', {"VK_ICD_FILENAMES": "/nonexistent.json"}, "ICD"),
    ],
)
def test_a_vulkan_build_that_finds_no_device_is_refused_in_one_line_with_nothing_stored(
    vulkan_bins, tmp_path: Path, env_line: str, env: dict[str, str], cause: str
) -> None:
    out = tmp_path / "out"
    r = _xover("study", str(_vulkan_only(tmp_path, env_line)), "-o", str(out), "-q", env={**os.environ, **env})
    assert r.returncode != 0
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "lists no Vulkan device" in lines[0] and "no Vulkan device found" in lines[0], r.stderr
    assert cause in lines[0]
    db = out / "results.sqlite"
    if db.exists():
        con = sqlite3.connect(db)
        assert con.execute("SELECT count(*) FROM bench_results").fetchone() == (0,)
        assert con.execute("SELECT count(*) FROM ttft_samples").fetchone() == (0,)


def test_a_number_the_build_did_not_make_on_its_device_is_never_stored(llama_bins, tiny_model, tmp_path) -> None:
    """Without the study's preflight (xover bench and ttft on a folder whose ggml library says Vulkan): every
    llama-bench record and every llama-server is checked against the folder's backend. A Vulkan build that finds no
    driver runs every layer on the CPU and exits 0 (seen on the H200 machine before libglvnd was there); here that
    is injected, since this machine's CPU advertises AMX that traps and a real Vulkan build's CPU fallback crashes
    instead: the folder holds the real CPU build's binaries beside an empty libggml-vulkan.so. Each process fails
    with the cause, and no number is stored."""
    shim = tmp_path / "vk-bin"
    shim.mkdir()
    for tool in ("llama-bench", "llama-server"):
        (shim / tool).symlink_to(llama_bins.bin_dir / tool)
    (shim / "libggml-vulkan.so").write_text("")
    out = tmp_path / "out"
    b = _xover("bench", "-m", str(tiny_model), "--depth", "0", "-r", "1", "-o", str(out), "--llama-bin-dir", str(shim))
    t = _xover("ttft", "-m", str(tiny_model), "--lengths", "256", "-R", "4", "-r", "1", "-o", str(out),
               "--llama-bin-dir", str(shim))  # fmt: skip
    con = sqlite3.connect(out / "results.sqlite")
    assert con.execute("SELECT count(*) FROM bench_results").fetchone() == (0,)
    assert con.execute("SELECT count(*) FROM ttft_samples").fetchone() == (0,)
    reasons = [r for (r,) in con.execute("SELECT reason FROM failures")]
    assert any(r.startswith("llama-bench of the vulkan build ran on the CPU: no Vulkan device found") for r in reasons)
    assert any(r.startswith("llama-server of the vulkan build ran on the CPU: no Vulkan device found") for r in reasons)
    assert "ran on the CPU" in b.stdout + b.stderr and "ran on the CPU" in t.stdout + t.stderr
