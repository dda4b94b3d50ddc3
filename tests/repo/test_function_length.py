"""Short functions where the orchestration lives: none over 60 lines in the trainer's loop (train.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 60
# Files (or folders) held to LIMIT: the loop reads as calls to its components, each in its own module.
HELD = ["trainer_image/src/blackwell_trainer/train.py"]


def long_functions(source: str, where: str, limit: int = LIMIT) -> list[str]:
    """`where:line name (n lines)` for each function or method of `source` longer than `limit` lines."""
    return [
        f"{where}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > limit
    ]


@pytest.mark.parametrize("held", HELD)
def test_no_function_is_over_the_limit(held: str) -> None:
    path = ROOT / held
    files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
    assert files, f"{held} holds no Python file"
    found = [line for f in files for line in long_functions(f.read_text(), str(f.relative_to(ROOT)))]
    assert not found, f"over {LIMIT} lines (split them):\n" + "\n".join(found)


def test_the_check_counts_a_long_function() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(LIMIT))
    assert long_functions(f"def f() -> None:\n{body}\n", "x.py") == ["x.py:1 f (61 lines)"]
    assert not long_functions(f"def f() -> None:\n{body[: body.rindex(chr(10))]}\n", "x.py")
