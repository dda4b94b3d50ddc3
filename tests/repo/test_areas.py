"""Tests by area: only tests/operator builds the emulated cluster, so every other area runs on its own.

`pytest tests/lifecycle` (or planner, render, ...) must not need the KMock emulator or Kopf's runner: a
module outside tests/operator that imports them, or the harness built on them, is named here. The plain
objects the operator tests send are in tests/support/manifests.py and tests/support/pods.py, which other
areas may use.

Nor does an area import another area's modules (issue 34): what more than one area uses lives in
tests/support/ (manifests, plans, specs, the CRD schema reference, small models and data, the chart's
render) or at the top of tests/ (ports, pod_security, conftest's fixtures).
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
        "cluster belongs in tests/operator; plain objects are in tests/support/manifests.py"
    )


def test_the_check_sees_each_form_of_import() -> None:
    source = (
        "import kmock\n"
        "from tests.operator.harness import btj\n"
        "from kopf.testing import KopfRunner\n"
        "from blackwell_operator import testing\n"
        "from tests.support.manifests import btj\n"
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


# Not areas: what every area may import.
SHARED = frozenset({"support", "conftest", "ports", "pod_security"})
AREA_MODULES = sorted(p for p in TESTS.rglob("*.py") if len(p.relative_to(TESTS).parts) > 1)


def other_area_imports(source: str, area: str) -> list[str]:
    """The modules of another test area (tests.<other>..., not SHARED) that a module of `area` imports."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "tests" and len(parts) > 1 and parts[1] not in SHARED | {area}:
                found.append(name)
    return sorted(set(found))


@pytest.mark.parametrize("path", AREA_MODULES, ids=lambda p: str(p.relative_to(TESTS)))
def test_no_area_imports_another_areas_modules(path: Path) -> None:
    area = path.relative_to(TESTS).parts[0]
    found = other_area_imports(path.read_text(), area)
    assert not found, (
        f"{path.relative_to(TESTS.parent)} imports {', '.join(found)}, another area's: move what both use "
        "into tests/support/ (or a fixture into tests/conftest.py)"
    )


def test_the_area_check_sees_each_form_of_import() -> None:
    source = (
        "from tests.trainer.hf_models import save_hf_model\n"
        "import tests.planner.conftest\n"
        "from tests.planner import golden_plans\n"
        "from tests.render.plans import plan_for\n"
        "from tests.support.plans import tiny_plan\n"
        "from tests.ports import free_port\n"
    )
    assert other_area_imports(source, "render") == [
        "tests.planner",
        "tests.planner.conftest",
        "tests.trainer.hf_models",
    ]
