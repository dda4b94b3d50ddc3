"""Manifests as people paste them (issue 39): tabs, `kubectl get -o yaml` Lists and objects, and help."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from blackwell_operator.cli import _register_commands, app
from blackwell_operator.cli.manifest import read_manifest_text

_register_commands()
runner = CliRunner()


def _example() -> dict[str, object]:
    manifest: dict[str, object] = yaml.safe_load(read_manifest_text(None)[0])
    return manifest


def test_a_tab_indented_file_names_the_line_and_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(_example(), sort_keys=False).replace("\n  name:", "\n\tname:", 1))
    for command in ("plan", "render"):
        result = runner.invoke(app, [command, str(path)])
        assert result.exit_code == 2
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith(f"error: {path}: not valid YAML (line 4, column 1: a tab "), line
        assert "replace each tab with spaces" in line and "cannot start any token" not in line


@pytest.mark.parametrize("kind", ["List", "BlackwellTrainingJobList"])
def test_a_list_from_kubectl_get_is_named_as_unsupported(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "jobs.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": kind, "items": [_example()]}))
    result = runner.invoke(app, ["plan", str(path)])
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        f"error: {path}: document 1 is a {kind} (what `kubectl get -o yaml` writes), which btj does not "
        "read: it reads one BlackwellTrainingJob object; save the job alone (`kubectl get btj NAME -o "
        "yaml`) or copy the item out of items"
    )


def test_a_job_pasted_from_kubectl_get_is_planned_with_a_warning_naming_its_fields(tmp_path: Path) -> None:
    # kubectl create refuses a set resourceVersion; the API server sets uid and drops status on create.
    # btj plans the spec and names the fields, so a failed pod's job can be read back and run (btj train).
    plain = _example()
    pasted = yaml.safe_load(yaml.safe_dump(plain))
    pasted["metadata"].update(resourceVersion="81234", uid="5f0c7a4e-1c2b-4f7e-9d55-6a1f0e1b2c3d")
    pasted["status"] = {"phase": "Failed", "message": "pod failed"}
    paths = {}
    for label, manifest in (("plain", plain), ("pasted", pasted)):
        paths[label] = tmp_path / f"{label}.yaml"
        paths[label].write_text(yaml.safe_dump(manifest))
    plans = {label: runner.invoke(app, ["plan", str(path), "-o", "json"]) for label, path in paths.items()}
    assert plans["pasted"].exit_code == 0, plans["pasted"].stderr
    assert plans["pasted"].stdout == plans["plain"].stdout
    (warning,) = [line for line in plans["pasted"].stderr.splitlines() if line.startswith("warning: ")]
    assert warning.startswith(
        f"warning: {paths['pasted']}: metadata.resourceVersion, metadata.uid, status come from `kubectl get`"
    )
    assert "`kubectl create` refuses metadata.resourceVersion" in warning
    assert "warning" not in plans["plain"].stderr


@pytest.mark.parametrize("command", ["plan", "render", "train", "demo", "plot", "presets"])
def test_help_shows_no_type_after_a_flag(command: str) -> None:
    result = runner.invoke(app, [command, "--help"], env={"COLUMNS": "120"})
    assert result.exit_code == 0, result.output
    assert "<bool>" not in result.stdout
    assert "--help" in result.stdout
