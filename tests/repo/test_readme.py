"""The README keeps its promises: its sections, the two quick-start commands, paths that exist."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
INSTALL = (ROOT / "docs" / "install.md").read_text()
SECTIONS = [
    "## Try it",
    "## What you write",
    "## How it decides",
    "## What the operator does",
    "## Install on a cluster",
    "## How it is tested",
]
# Folders of the repository a path in the README can start with.
TOP = ("docs", "examples", "helm", "operator", "trainer_image", "scripts", "benchmarks", "crds", "tests")


def headings(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("## ")]


def test_the_sections_come_in_order() -> None:
    found = headings(README)
    positions = [next(i for i, h in enumerate(found) if h.startswith(s)) for s in SECTIONS]
    assert positions == sorted(positions), found


def test_the_two_quick_start_commands_are_there_verbatim() -> None:
    try_it = README.split("## Try it", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", try_it, flags=re.DOTALL)
    assert blocks[:2] == ["bash scripts/bootstrap.sh && .venv/bin/btj render\n", "bash scripts/test.sh\n"]


def test_the_python_version_is_stated_as_pyproject_says() -> None:
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert requires == ">=3.11"
    assert "Python >= 3.11" in README


def test_every_path_the_readme_and_the_install_guide_name_exists() -> None:
    named = set()
    for text, base in ((README, ROOT), (INSTALL, ROOT / "docs")):
        for target in re.findall(r"\]\(([^)#\s]+)\)", text):  # markdown links
            if not target.startswith("http"):
                named.add((base / target).resolve())
        for quoted in re.findall(r"`([^`\s]+)`", text):
            first = quoted.split("/", 1)[0]
            if "/" in quoted and first in TOP and not any(c in quoted for c in "*<>{}"):
                named.add((ROOT / quoted.rstrip("/").split(":", 1)[0]).resolve())
    missing = sorted(str(p.relative_to(ROOT)) for p in named if not p.exists())
    assert not missing, missing
    assert len(named) > 20, "the check found the paths"


def test_the_install_section_builds_and_pushes_both_images_from_the_repos_dockerfiles() -> None:
    install = README.split("## Install on a cluster", 1)[1].split("\n## ", 1)[0]
    for text in (install, INSTALL):
        assert "docker build -f operator/Dockerfile" in text
        assert "docker build -f trainer_image/Dockerfile" in text
        assert "docker push" in text and "--set trainerImage.repository=" in text
    assert (ROOT / "operator" / "Dockerfile").is_file() and (ROOT / "trainer_image" / "Dockerfile").is_file()
    for mechanism in ("IRSA", "EKS Pod Identity", "serviceAccountName"):
        assert mechanism in install and mechanism in INSTALL
