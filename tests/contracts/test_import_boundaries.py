"""The import boundaries (README, Layout), checked on the source tree with the ast module."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OPERATOR = ROOT / "operator" / "src" / "blackwell_operator"
TRAINER = ROOT / "trainer_image" / "src" / "blackwell_trainer"
PURE_PACKAGES = ("planner", "render", "models", "catalogs", "calibration", "calibrate")
CLUSTER_CLIENTS = {"kopf", "kubernetes", "boto3", "botocore", "aiohttp"}


def imported_modules(path: Path) -> Iterator[str]:
    """Every absolute module name a file imports, at any depth (lazy imports count too)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module


def top(name: str) -> str:
    return name.split(".")[0]


@pytest.mark.parametrize("package", PURE_PACKAGES)
def test_pure_core_imports_no_cluster_or_cloud_client(package: str) -> None:
    files = sorted((OPERATOR / package).rglob("*.py"))
    assert files, f"{package} has no modules"
    offenders = {
        f"{path.relative_to(ROOT)} imports {mod}"
        for path in files
        for mod in imported_modules(path)
        if top(mod) in CLUSTER_CLIENTS
    }
    assert not offenders, sorted(offenders)


def test_trainer_never_imports_the_operator() -> None:
    offenders = {
        f"{path.relative_to(ROOT)} imports {mod}"
        for path in sorted(TRAINER.rglob("*.py"))
        for mod in imported_modules(path)
        if top(mod) in {"blackwell_operator", "kopf", "kubernetes"}
    }
    assert not offenders, sorted(offenders)


def test_operator_imports_only_the_trainers_config_module() -> None:
    offenders = {
        f"{path.relative_to(ROOT)} imports {mod}"
        for path in sorted(OPERATOR.rglob("*.py"))
        for mod in imported_modules(path)
        if top(mod) == "blackwell_trainer" and mod != "blackwell_trainer.config"
    }
    assert not offenders, sorted(offenders)
