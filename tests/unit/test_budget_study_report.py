"""The committed 16 GiB study (studies/h200-16gib-qwen3-30b-a3b, measured on an H200) rebuilt from its store by
the current code: the budget line, the Fit section with llama.cpp's own --fit, verdicts that know a fit@8k
placement cannot hold the agentic band, and the desktop translation kept apart and marked as predicted, its
measured column equal to the measurements."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from xover.report.html import build_report, render_markdown
from xover.results.read_model import load

STUDY = Path(__file__).resolve().parents[2] / "studies" / "h200-16gib-qwen3-30b-a3b"


def test_the_16_gib_study_report(tmp_path: Path) -> None:
    study = tmp_path / "st"
    study.mkdir()
    shutil.copy(STUDY / "results.sqlite", study / "results.sqlite")
    md = render_markdown(build_report(load(study)))
    assert "16 GiB VRAM budget on an NVIDIA H200" in md
    assert "| fit@8k | fit@8192 | 8,704 | 16.0 GiB | 512 | 10 |" in md
    assert "experts of 19 layers on the CPU, -ngl 49" in md  # llama.cpp's own fit for fit@32k
    assert "fit@8k's placement holds none of it and fit@32k's it up to 32K, so agentic turns need fit@32k" in md
    assert "llama-server -m qwen3-30b-a3b.gguf -ncmoe 23 -ngl 99 -lm none -ub 4096 -b 4096" in md
    desktop = md.split("## On a desktop", 1)[1].split("\n## ", 1)[0]
    assert "(predicted, not measured)" in desktop.splitlines()[0]
    assert re.findall(r"^### (\S+):", desktop, re.M) == ["rtx-4080+ddr4", "rtx-5080+ddr5"]
    # the measured side of each translated row is the measured median of the Prefill and TTFT table
    prefill = md.split("## Prefill and TTFT", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (fit@\S+(?: tuned)?) \| (\d+K) \| [^|]* \| ([\d.]+) \[", prefill, re.M)
    assert len(rows) == 16  # 3 + 3 lengths for the fit@8k pair, 5 + 5 for fit@32k
    for config, length, ms in rows:
        assert f"| {config} | {length} | {float(ms) / 1000:.2f} s → " in desktop
    # each predicted decode beside the target's limit, and what carrying this host's share of its own limit means
    # (qwen3-30b-a3b decoded at 34-44% of it on the H200 host)
    decode = re.findall(r"\| ([\d.]+) → ([\d.]+) \(limit ([\d.]+)\) \|", desktop)
    assert len(decode) == 2 * len(rows) and all(float(p) <= float(lim) for _, p, lim in decode)
    assert desktop.count("Decode here ran at 34%-44% of this host's limit for the same placement") == 1


GPT_OSS = Path(__file__).resolve().parents[2] / "studies" / "h200-gpt-oss-120b-budgets"


def _report(tmp_path: Path, study: Path) -> str:
    copy = tmp_path / study.name
    copy.mkdir()
    shutil.copy(study / "results.sqlite", copy / "results.sqlite")
    return render_markdown(build_report(load(copy)))


def test_the_gpt_oss_24_gib_study_report(tmp_path: Path) -> None:
    """gpt-oss-120b under 24 GiB: one placement and its tuned variant, the defaults too slow past 4K. The verdict
    answers that pair and the band from the tuned side alone; the desktop section carries the host's 8-12%
    decode share and says so."""
    md = _report(tmp_path, GPT_OSS / "g24")
    assert "24 GiB VRAM budget on an NVIDIA H200" in md
    assert "| fit@32k | fit@32768 | 33,280 | 24.0 GiB | 512 | 24 |" in md
    assert "cudaMalloc failed: out of memory" in md and "experts of 25 layers on the CPU, -ngl 37" in md
    assert "| fit@32k | 16K | 230 s | 4K | 60 s |" in md
    verdict = md.split("## Verdict", 1)[1].split("\n## ", 1)[0]
    assert "- Tuned against llama.cpp's defaults: fit@32k vs fit@32k tuned: " in verdict
    assert "past 4K only fit@32k tuned was measured (16K 46.8 s, 32K 53.6 s a turn)" in verdict
    assert "so fit@32k tuned is faster there" in verdict
    desktop = md.split("## On a desktop", 1)[1].split("\n## ", 1)[0]
    assert re.findall(r"^### (\S+):", desktop, re.M) == ["rtx-3090+ddr4", "rtx-4090+ddr5"]
    assert "| fit@32k | 1K | 13.07 s → 13.24 s | 6.9 → 3.5 (limit 29.1) |" in desktop
    assert "16K fit@32k tuned (the only one measured there)" in desktop
    assert "Decode here ran at 8%-12% of this host's limit for the same placement" in desktop


def test_the_gpt_oss_32_gib_study_report(tmp_path: Path) -> None:
    md = _report(tmp_path, GPT_OSS / "g32")
    assert "32 GiB VRAM budget on an NVIDIA H200" in md
    assert "| fit@32k | fit@32768 | 33,280 | 32.0 GiB | 512 | 19 |" in md
    assert "| fit@32k lm=none ub=4096 | fit@32768 | 33,280 | 32.0 GiB | 4096 | 21 |" in md
    verdict = md.split("## Verdict", 1)[1].split("\n## ", 1)[0]
    assert "fit@32k lm=none ub=4096 is faster at every length both hold (1K-4K tokens" in verdict
    desktop = md.split("## On a desktop", 1)[1].split("\n## ", 1)[0]
    assert re.findall(r"^### (\S+):", desktop, re.M) == ["rtx-5090+ddr5"]
    assert "(predicted, not measured)" in desktop.splitlines()[0]
