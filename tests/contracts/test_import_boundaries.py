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
# The trainer's wire contracts, the only trainer modules the operator may import: the plan (config), the
# prepared data's manifest (shard_manifest, which `btj plan` checks as the trainer does) and the names of
# the metrics the trainer exports (metric_names, which the measure loop reads) and the trainer's switches
# (tuning: the BTJ_TRAINER_TUNING string GPU result files carry, and the rule for which path one GPU takes,
# which `btj calibrate import` resolves as the trainer does). All are pure pydantic or plain Python, so the
# operator image, which has no torch, can import them.
OPERATOR_VISIBLE = {
    "blackwell_trainer.plan.config",
    "blackwell_trainer.plan.shard_manifest",
    "blackwell_trainer.plan.metric_names",
    "blackwell_trainer.plan.tuning",
    # The trainer's environment variables and their checks (env_vars: admission checks spec.env with them).
    "blackwell_trainer.plan.env_vars",
}


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


def test_operator_imports_only_the_trainers_wire_contracts() -> None:
    offenders = {
        f"{path.relative_to(ROOT)} imports {mod}"
        for path in sorted(OPERATOR.rglob("*.py"))
        for mod in imported_modules(path)
        if top(mod) == "blackwell_trainer" and mod not in OPERATOR_VISIBLE
    }
    assert not offenders, sorted(offenders)


@pytest.mark.parametrize("module", sorted(OPERATOR_VISIBLE))
def test_the_wire_contracts_import_only_pydantic_and_each_other(module: str) -> None:
    import sys

    path = TRAINER / (module.removeprefix("blackwell_trainer.").replace(".", "/") + ".py")
    tree = ast.parse(path.read_text(), filename=str(path))
    relative = {
        f"blackwell_trainer.{node.module}"
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module
    }
    outside = {
        mod
        for mod in {*imported_modules(path), *relative}
        if top(mod) not in sys.stdlib_module_names
        and top(mod) not in {"__future__", "pydantic"}
        and mod not in OPERATOR_VISIBLE
    }
    assert not outside, f"{module} imports {sorted(outside)}: the operator image could not import it"
