"""Short functions where the orchestration lives: none over 60 lines in the operator's handlers and in the
trainer's loop (train.py and the loop/ package: the Trainer's step, its metrics, its exits), issues 23 and 34.

The handlers read, call and apply: a long one holds a decision that belongs in lifecycle/. train.py keeps
the training loop; its components live in their own modules. Measured with ast, from the `def` line to the
function's last line (docstring, comments and blank lines included: they are read too).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 60
# Files (or folders) held to LIMIT: the handlers, and the loop that reads as calls to its components.
HELD = [
    "operator/src/blackwell_operator/handlers",
    "trainer_image/src/blackwell_trainer/train.py",
    "trainer_image/src/blackwell_trainer/loop",
]


def long_functions(source: str, where: str, limit: int = LIMIT) -> list[str]:
    """`where:line name (n lines)` for each function or method of `source` (nested ones too) longer than
    `limit` lines."""
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


def test_the_check_counts_nested_functions_and_methods() -> None:
    body = "\n".join(f"        x{i} = {i}" for i in range(LIMIT))
    nested = f"def outer() -> None:\n    def f() -> None:\n{body}\n"
    assert [line.split(" ")[1] for line in long_functions(nested, "x.py")] == ["outer", "f"]
    method = f"class C:\n    async def m(self) -> None:\n{body}\n"
    assert long_functions(method, "x.py") == ["x.py:2 m (61 lines)"]


# The reconciler reads its pass's inputs in handlers/pass_inputs.py and makes the child calls in
# handlers/child_calls.py (issue 34): what grows here is a decision that belongs in lifecycle/.
RECONCILE = ROOT / "operator/src/blackwell_operator/handlers/reconcile.py"
RECONCILE_LINES, RECONCILER_LINES = 400, 300


def test_the_reconciler_stays_small() -> None:
    source = RECONCILE.read_text()
    assert len(source.splitlines()) <= RECONCILE_LINES, f"{RECONCILE.name} is over {RECONCILE_LINES} lines"
    (reconciler,) = (
        node
        for node in ast.parse(source).body
        if isinstance(node, ast.ClassDef) and node.name == "Reconciler"
    )
    assert reconciler.end_lineno is not None
    length = reconciler.end_lineno - reconciler.lineno + 1
    assert length < RECONCILER_LINES, f"Reconciler is {length} lines, under {RECONCILER_LINES}"
