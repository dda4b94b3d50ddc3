"""Tests by area: only tests/operator builds the emulated cluster, so every other area runs on its own.

`pytest tests/lifecycle` (or planner, render, ...) must not need the KMock emulator or Kopf's runner: a
module outside tests/operator that imports them, or the harness built on them, is named here. The plain
objects the operator tests send are in tests/operator/manifests.py and tests/operator/pods.py, which other
areas may use.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
CLUSTER_AREA = TESTS / "operator"
# What builds or drives the emulated cluster.
CLUSTER_MODULES = ("kmock", "kopf.testing", "tests.operator.harness", "blackwell_operator.testing")


def cluster_imports(source: str) -> list[str]:
    """The modules of CLUSTER_MODULES (or below them) that a module's source imports."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        else:
            continue
        found += [n for n in names if any(n == m or n.startswith(f"{m}.") for m in CLUSTER_MODULES)]
    return sorted(set(found))


OTHER_AREAS = sorted(
    p for p in TESTS.rglob("*.py") if CLUSTER_AREA not in p.parents and p != Path(__file__).resolve()
)


@pytest.mark.parametrize("path", OTHER_AREAS, ids=lambda p: str(p.relative_to(TESTS)))
def test_only_the_operator_area_builds_the_emulated_cluster(path: Path) -> None:
    found = cluster_imports(path.read_text())
    assert not found, (
        f"{path.relative_to(TESTS.parent)} imports {', '.join(found)}: a test that needs the emulated "
        "cluster belongs in tests/operator; plain objects are in tests/operator/manifests.py"
    )


def test_the_check_sees_each_form_of_import() -> None:
    source = (
        "import kmock\n"
        "from tests.operator.harness import btj\n"
        "from kopf.testing import KopfRunner\n"
        "from blackwell_operator import testing\n"
        "from tests.operator.manifests import btj\n"
        "import kopf\n"
    )
    assert cluster_imports(source) == [
        "blackwell_operator.testing",
        "kmock",
        "kopf.testing",
        "kopf.testing.KopfRunner",
        "tests.operator.harness",
        "tests.operator.harness.btj",
    ]
