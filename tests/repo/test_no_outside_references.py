"""No tracked file names a document outside the repository: facts from elsewhere live in docs/reference/.

A clone must be able to follow every citation. The changelog is exempt (it records history); the CRD
schemas the render tests read are data found through BTJ_CRD_SCHEMAS (docs/reference/crd-schemas.md).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXEMPT = {"CHANGELOG.md", "tests/repo/test_no_outside_references.py"}
# The sibling folder of research notes and tools, and the workspace's own paths, in any spelling.
OUTSIDE = re.compile(r"\.\./shared\b|\bshared/(reference|tools|schemas)\b|/work/\.library|/work/shared")


def tracked_files() -> list[str]:
    listing = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=True, timeout=60
    )
    return [name for name in listing.stdout.decode().split("\0") if name]


def outside_references(names: list[str]) -> list[str]:
    found = []
    for name in names:
        if name in EXEMPT:
            continue
        try:
            text = (ROOT / name).read_text()
        except (UnicodeDecodeError, FileNotFoundError, IsADirectoryError):
            continue  # binary files (plots, images) and files deleted in the working tree
        for number, line in enumerate(text.splitlines(), 1):
            if OUTSIDE.search(line):
                found.append(f"{name}:{number}: {line.strip()[:120]}")
    return found


def test_no_tracked_file_points_outside_the_repository() -> None:
    names = tracked_files()
    assert len(names) > 100, "not a git checkout of the whole project"
    found = outside_references(names)
    assert not found, "cite docs/reference/ instead:\n" + "\n".join(found)


def test_the_check_finds_each_spelling() -> None:
    lines = [
        "see ../shared/reference/x.md",
        "from shared/tools/te-on-h200",
        "# shared/schemas/crd.yaml",
        "/work/.library/device/README.md",
    ]
    assert all(OUTSIDE.search(line) for line in lines)
    assert not OUTSIDE.search("docs/reference/hyperpod-pytorchjob.md §2.1, a shared/state note")
