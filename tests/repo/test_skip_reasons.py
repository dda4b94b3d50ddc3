"""A check that cannot run says what would make it run (issue 39): every `pytest.importorskip` in the tests
names the command that installs what it imports."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# What installs a missing package: the project's bootstrap (its extras), or the system's package manager.
INSTALLERS = ("bash scripts/bootstrap.sh", "apt-get install", "pip install")


def unexplained_skips(source: str, where: str) -> list[str]:
    """`where:line` of each importorskip call in `source` whose reason names no installing command."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr != "importorskip":
            continue
        reason = next((k.value for k in node.keywords if k.arg == "reason"), None)
        text = reason.value if isinstance(reason, ast.Constant) and isinstance(reason.value, str) else ""
        if not any(command in text for command in INSTALLERS):
            found.append(f"{where}:{node.lineno}")
    return found


def test_every_importorskip_names_what_to_run() -> None:
    found = [
        line
        for path in sorted((ROOT / "tests").rglob("*.py"))
        for line in unexplained_skips(path.read_text(), str(path.relative_to(ROOT)))
    ]
    assert not found, "an importorskip without reason=... naming the command that installs it:\n" + "\n".join(
        found
    )


def test_the_check_sees_a_bare_importorskip() -> None:
    assert unexplained_skips('import pytest\npytest.importorskip("x")\n', "t.py") == ["t.py:2"]
    assert unexplained_skips('pytest.importorskip("x", reason="x is missing")\n', "t.py") == ["t.py:1"]
    named = 'pytest.importorskip("x", reason="x (dev extra): bash scripts/bootstrap.sh --all")\n'
    assert unexplained_skips(named, "t.py") == []
