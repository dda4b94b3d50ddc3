"""The trainer's import contracts (its packages, the layers inside each, its wire contracts), each shown to
fail when it is broken.

Run against a copy of the trainer's source (and the operator's, for the contract that holds the operator to
the trainer's plan package) with one offending import added, with the contract as pyproject.toml states it
(so that a contract weakened there is weakened here too).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
OPERATOR = ROOT / "operator" / "src" / "blackwell_operator"
TRAINER = ROOT / "trainer_image" / "src" / "blackwell_trainer"
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
PACKAGES = "Trainer packages"
WIRE = "The trainer's wire contracts"
OPERATOR_CONTRACT = "The operator imports only the trainer's plan package"


def _contracts() -> list[dict[str, Any]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    return [dict(c) for c in config["contracts"]]


def _contract(starts: str) -> dict[str, Any]:
    (found,) = [c for c in _contracts() if c["name"].startswith(starts)]
    return found


def _ini(contract: dict[str, Any], number: int) -> list[str]:
    """One contract as import-linter's INI form (its list options one item a line)."""
    lines = [f"[importlinter:contract:c{number}]", f"name = {contract['name']}", f"type = {contract['type']}"]
    for key, value in contract.items():
        if key in {"name", "type"}:
            continue
        if isinstance(value, list):
            lines.append(f"{key} =" + "".join(f"\n    {item}" for item in value))
        else:
            lines.append(f"{key} = {value}")
    return lines


def _check(
    tmp_path: Path, contracts: list[dict[str, Any]], edits: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """lint-imports with only `contracts`, on a copy of both packages with `edits` (path under src: a line
    appended, the file made if new)."""
    src = tmp_path / "src"
    for package in (TRAINER, OPERATOR):
        shutil.copytree(package, src / package.name, ignore=shutil.ignore_patterns("__pycache__"))
    for path, line in edits.items():
        with (src / path).open("a") as handle:
            handle.write(f"\n{line}\n")
    lines = ["[importlinter]", "root_packages =\n    blackwell_trainer\n    blackwell_operator"]
    lines += ["include_external_packages = True", ""]
    for number, contract in enumerate(contracts):
        lines += [*_ini(contract, number), ""]
    config = tmp_path / ".importlinter"
    config.write_text("\n".join(lines))
    return subprocess.run(
        [str(LINT_IMPORTS), str(config), "--no-cache"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(src)},
        capture_output=True,
        text=True,
        timeout=300,
    )


def _trainer_contracts() -> list[dict[str, Any]]:
    return [
        c
        for c in _contracts()
        if c["name"].startswith(("Trainer ", WIRE, OPERATOR_CONTRACT, "The trainer never imports"))
    ]


def test_every_trainer_package_has_its_layers_contract() -> None:
    packages = {p.parent.name for p in TRAINER.glob("*/__init__.py")}
    layered = {
        container.removeprefix("blackwell_trainer.")
        for c in _contracts()
        if c["type"] == "layers"
        for container in c["containers"]
        if container.startswith("blackwell_trainer.")
    }
    assert layered == packages, "a new trainer package needs its own layers contract (pyproject.toml)"


@pytest.mark.parametrize(
    ("contract", "path", "line", "offender"),
    [
        (PACKAGES, "blackwell_trainer/plan/config.py", "import blackwell_trainer.model.loss", "plan.config"),
        (PACKAGES, "blackwell_trainer/model/loss.py", "import blackwell_trainer.data.tokens", "model.loss"),
        (PACKAGES, "blackwell_trainer/stray.py", '"""A module no layer names."""', "stray"),
        (
            "Trainer plan",
            "blackwell_trainer/plan/units.py",
            "import blackwell_trainer.plan.config",
            "plan.units",
        ),
        (
            "Trainer data",
            "blackwell_trainer/data/tokens.py",
            "import blackwell_trainer.data.packed",
            "data.tokens",
        ),
        (
            "Trainer model",
            "blackwell_trainer/model/loss.py",
            "import blackwell_trainer.model.transformer",
            "model.loss",
        ),
        (
            "Trainer parallel",
            "blackwell_trainer/parallel/runtime.py",
            "import blackwell_trainer.parallel.parallelize",
            "parallel.runtime",
        ),
        (
            "Trainer checkpoint",
            "blackwell_trainer/checkpoint/manifest.py",
            "import blackwell_trainer.checkpoint.store",
            "checkpoint.manifest",
        ),
        (
            "Trainer weights",
            "blackwell_trainer/weights/hf_layout.py",
            "import blackwell_trainer.weights.store",
            "weights.hf_layout",
        ),
        (
            "Trainer loop",
            "blackwell_trainer/loop/optimizer.py",
            "import blackwell_trainer.loop.trainer",
            "loop.optimizer",
        ),
        (WIRE, "blackwell_trainer/plan/tuning.py", "import torch", "plan.tuning"),
        (
            OPERATOR_CONTRACT,
            "blackwell_operator/lifecycle/probe.py",
            "import blackwell_trainer.data.tokens",
            "lifecycle.probe",
        ),
    ],
    ids=[
        "plan-imports-model",
        "model-imports-data",
        "module-without-a-layer",
        "plan-layers",
        "data-layers",
        "model-layers",
        "parallel-layers",
        "checkpoint-layers",
        "weights-layers",
        "loop-layers",
        "wire-contract-imports-torch",
        "operator-imports-trainer-data",
    ],
)
def test_the_contract_fails_on_an_offending_import(
    tmp_path: Path, contract: str, path: str, line: str, offender: str
) -> None:
    broken = _check(tmp_path, [_contract(contract)], {path: line})
    assert broken.returncode != 0, broken.stdout + broken.stderr
    assert offender in broken.stdout + broken.stderr, broken.stdout + broken.stderr


def test_the_trainer_contracts_hold_on_the_source_as_it_is(tmp_path: Path) -> None:
    kept = _check(tmp_path, _trainer_contracts(), {})
    assert kept.returncode == 0, kept.stdout + kept.stderr
    assert f"{len(_trainer_contracts())} kept, 0 broken" in kept.stdout
