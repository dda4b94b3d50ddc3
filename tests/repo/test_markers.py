"""Every multi-process test carries its marker, so `-m "not distributed and not integration"` is the fast set.

Static, over the test sources: a test that starts gloo ranks (torchrun, torch.multiprocessing) or the
calibration harness (which launches torchrun) must be marked `distributed`; one that runs the real operator
(KopfRunner, tests/operator/harness.running_operator) must be marked `integration`. A test counts when it,
a module-level helper or class it uses, or a fixture it requests does so (followed through the module and
its folder's conftest.py).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
# What makes a test multi-process, per marker: names it calls, and strings it launches.
CALLS = {"distributed": {"start_processes", "spawn"}, "integration": {"running_operator", "KopfRunner"}}
LAUNCHES = {"distributed": ("torch.distributed.run", "benchmarks.calibration.harness"), "integration": ()}


def _called(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Name):
            return func.id
        if isinstance(func, ast.Attribute):
            return func.attr
    return None


def _starts(node: ast.AST, marker: str) -> bool:
    """Whether this definition itself starts what the marker is about."""
    for sub in ast.walk(node):
        if _called(sub) in CALLS[marker]:
            return True
        text = sub.value if isinstance(sub, ast.Constant) and isinstance(sub.value, str) else ""
        if text and any(launch in text for launch in LAUNCHES[marker]):
            return True
    return False


def _definitions(paths: list[Path]) -> dict[str, ast.AST]:
    out: dict[str, ast.AST] = {}
    for path in paths:
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out[node.name] = node
    return out


def _tainted(defs: dict[str, ast.AST], marker: str) -> set[str]:
    tainted = {name for name, node in defs.items() if _starts(node, marker)}
    while True:
        more = set()
        for name, node in defs.items():
            if name in tainted:
                continue
            used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                used |= {a.arg for a in node.args.args}  # fixtures it requests
            if used & tainted:
                more.add(name)
        if not more:
            return tainted
        tainted |= more


def _marks(node: ast.AST) -> set[str]:
    """The pytest.mark.X names of a decorator list or a `pytestmark = ...` value."""
    return {
        n.attr
        for n in ast.walk(node)
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Attribute) and n.value.attr == "mark"
    }


def _unmarked(path: Path) -> list[str]:
    module = ast.parse(path.read_text())
    conftest = path.parent / "conftest.py"
    defs = _definitions([*([conftest] if conftest.exists() else []), path])
    module_marks = set().union(
        *(
            _marks(node.value)
            for node in module.body
            if isinstance(node, ast.Assign)
            and any(getattr(t, "id", "") == "pytestmark" for t in node.targets)
        )
    )
    missing = []
    for marker in CALLS:
        tainted = _tainted(defs, marker)
        for node in module.body:
            is_test = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith(
                "test"
            )
            if not is_test:
                continue
            marks = module_marks | set().union(*(_marks(d) for d in node.decorator_list))
            if node.name in tainted and marker not in marks:
                missing.append(f"{path.relative_to(TESTS.parent)}::{node.name} needs @pytest.mark.{marker}")
    return missing


# Not this file: its own sample launches are strings in a test of the check.
MODULES = sorted(p for p in TESTS.rglob("test_*.py") if p != Path(__file__).resolve())


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(TESTS)))
def test_multi_process_tests_are_marked(path: Path) -> None:
    assert not _unmarked(path), "\n".join(_unmarked(path))


def test_the_check_sees_a_launch_through_a_helper_and_a_fixture(tmp_path: Path) -> None:
    sample = tmp_path / "test_sample.py"
    sample.write_text(
        "import pytest\n"
        "def _launch():\n    return ['python', '-m', 'torch.distributed.run', 'x.py']\n"
        "@pytest.fixture\ndef ranks():\n    return _launch()\n"
        "def test_uses_the_fixture(ranks):\n    pass\n"
        "@pytest.mark.distributed\ndef test_marked(ranks):\n    pass\n"
        "async def test_operator():\n    async with running_operator(cluster):\n        pass\n"
        "def test_plain():\n    assert 'torchrun' != 'x'\n"
    )
    global TESTS
    saved, TESTS = TESTS, tmp_path.parent
    try:
        found = _unmarked(sample)
    finally:
        TESTS = saved
    assert [line.split("::")[1] for line in found] == [
        "test_uses_the_fixture needs @pytest.mark.distributed",
        "test_operator needs @pytest.mark.integration",
    ]
