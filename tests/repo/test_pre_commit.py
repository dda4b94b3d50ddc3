"""The pre-commit hooks run the project's checks with the venv's tools, and each tool is installed."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / ".pre-commit-config.yaml"


def hooks() -> dict[str, dict[str, object]]:
    config = yaml.safe_load(CONFIG.read_text())
    return {hook["id"]: hook for repo in config["repos"] for hook in repo["hooks"]}


def test_the_hooks_are_the_project_checks() -> None:
    assert {"ruff", "ruff-format", "mypy", "lint-imports", "check-yaml", "generated-files"} <= set(hooks())
    # Local hooks: offline, at the versions pyproject.toml admits, the same tools scripts/test.sh runs.
    assert all(hook["language"] == "system" for hook in hooks().values())


def test_every_hook_command_is_installed() -> None:
    venv_bin = Path(sys.executable).parent
    for hook_id, hook in hooks().items():
        command = str(hook["entry"]).split()[0]
        found = shutil.which(command) or shutil.which(command, path=str(venv_bin))
        assert found, f"hook {hook_id}: {command} is not installed (pip install -e '.[dev]')"


def test_pre_commit_accepts_the_config() -> None:
    venv_bin = str(Path(sys.executable).parent)
    pre_commit = shutil.which("pre-commit") or shutil.which("pre-commit", path=venv_bin)
    assert pre_commit, "pre-commit is not installed (dev extra)"
    result = subprocess.run(
        [pre_commit, "validate-config", str(CONFIG)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
