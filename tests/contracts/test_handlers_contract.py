"""The contracts that hold handlers/ to I/O and orchestration (and a pass's decision to none), shown to fail
when they are broken.

Run against a copy of the operator's source with one offending import added, with the contract as
pyproject.toml states it (so that a contract weakened there is weakened here too).
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
TRAINER_SRC = ROOT / "trainer_image" / "src"
HANDLERS_CONTRACT = "Handlers do I/O and orchestration"
KOPF_CONTRACT = "Only the handlers, the CLI and the emulated cluster import Kopf"
DECISION_CONTRACT = "A pass's decision makes no API call"
# The packages that may import Kopf: its handlers, the CLI that runs them, the emulated cluster of `btj demo`.
KOPF_USERS = {"handlers", "cli", "testing"}
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _contract(starts: str) -> dict[str, Any]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (found,) = [c for c in config["contracts"] if c["name"].startswith(starts)]
    return dict(found)


def _check(
    tmp_path: Path, contract: dict[str, Any], edits: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """lint-imports with only `contract`, on a copy of the operator with `edits` (path: line appended)."""
    src = tmp_path / "src"
    shutil.copytree(OPERATOR, src / "blackwell_operator", ignore=shutil.ignore_patterns("__pycache__"))
    for path, line in edits.items():
        with (src / "blackwell_operator" / path).open("a") as handle:
            handle.write(f"\n{line}\n")
    lines = ["[importlinter]", "root_package = blackwell_operator", "include_external_packages = True", ""]
    lines += ["[importlinter:contract:one]", f"name = {contract['name']}", f"type = {contract['type']}"]
    for key in ("source_modules", "forbidden_modules"):
        lines.append(f"{key} =" + "".join(f"\n    {module}" for module in contract[key]))
    if contract.get("allow_indirect_imports"):
        lines.append("allow_indirect_imports = True")
    config = tmp_path / ".importlinter"
    config.write_text("\n".join(lines) + "\n")
    env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{TRAINER_SRC}"}
    return subprocess.run(
        [str(LINT_IMPORTS), str(config), "--no-cache"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_kopf_contract_names_every_package_but_the_handlers_the_cli_and_testing() -> None:
    modules = {p.stem for p in OPERATOR.glob("*.py") if not p.name.startswith("__")}
    packages = modules | {p.parent.name for p in OPERATOR.glob("*/__init__.py")}
    listed = {
        module.removeprefix("blackwell_operator.") for module in _contract(KOPF_CONTRACT)["source_modules"]
    }
    assert listed == packages - KOPF_USERS, (
        "a new package must be named in the Kopf contract (pyproject.toml)"
    )


@pytest.mark.parametrize(
    ("contract", "path", "line"),
    [
        (
            HANDLERS_CONTRACT,
            "handlers/reconcile.py",
            "from blackwell_operator.lifecycle.conditions import set_condition",
        ),
        (HANDLERS_CONTRACT, "handlers/children.py", "import blackwell_operator.lifecycle.patch"),
        (KOPF_CONTRACT, "lifecycle/outcome.py", "import kopf"),
        (KOPF_CONTRACT, "discovery/capacity.py", "import kopf"),
        (
            DECISION_CONTRACT,
            "handlers/pass_decision.py",
            "from blackwell_operator.handlers.api import KubeApi",
        ),
    ],
    ids=[
        "handler-builds-conditions",
        "handler-builds-patches",
        "lifecycle-imports-kopf",
        "discovery-imports-kopf",
        "decision-takes-the-client",
    ],
)
def test_the_contract_fails_on_an_offending_import(
    tmp_path: Path, contract: str, path: str, line: str
) -> None:
    rules = _contract(contract)
    broken = _check(tmp_path, rules, {path: line})
    assert broken.returncode != 0, broken.stdout + broken.stderr
    assert "BROKEN" in broken.stdout and path.removesuffix(".py").replace("/", ".") in broken.stdout


def test_the_contracts_hold_on_the_source_as_it_is(tmp_path: Path) -> None:
    for name in (HANDLERS_CONTRACT, KOPF_CONTRACT, DECISION_CONTRACT):
        kept = _check(tmp_path / name.split()[0], _contract(name), {})
        assert kept.returncode == 0, kept.stdout + kept.stderr
