"""The README is for users (issue 47): short, every path its layout names exists, LICENSE and CHANGELOG beside it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _layout_paths() -> list[str]:
    """The paths of the README's Layout block: each top-level entry, and each entry under ``src/xover/``."""
    block = README.split("## Layout", 1)[1].split("```", 2)[1]
    paths, parent = [], ""
    for line in block.splitlines():
        if not line.strip():
            continue
        name = line.split()[0]
        if line.startswith(" "):
            paths.append(parent + name)
        else:
            parent = name if name.endswith("/") else ""
            paths.append(name)
    return paths


def test_the_readme_is_short() -> None:
    assert len(README.splitlines()) < 200


def test_every_path_the_layout_names_exists() -> None:
    paths = _layout_paths()
    assert len(paths) >= 15 and "src/xover/measure/" in paths
    missing = [p for p in paths if not (ROOT / p).exists()]
    assert not missing, missing


def test_every_link_of_the_readme_and_the_guide_resolves() -> None:
    for page in (ROOT / "README.md", ROOT / "docs" / "guide.md"):
        for target in re.findall(r"\]\(([^)#]+)\)", page.read_text(encoding="utf-8")):
            if not target.startswith("http"):
                assert (page.parent / target).exists(), f"{page.name}: {target}"


def test_the_license_matches_pyproject_and_the_changelog_exists() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert re.search(r'^license = \{ text = "MIT" \}$', pyproject, re.M)
    assert (ROOT / "LICENSE").read_text(encoding="utf-8").startswith("MIT License")
    assert re.search(r"^## \d{4}-\d{2}-\d{2}$", (ROOT / "CHANGELOG.md").read_text(encoding="utf-8"), re.M)
