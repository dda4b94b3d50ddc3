"""`btj plan --backend` and `btj render --backend`: the job kind chosen offline, auto as documented."""

from __future__ import annotations

from pathlib import Path

import yaml
from typer.testing import CliRunner

from blackwell_operator.cli import _register_commands, app

_register_commands()
runner = CliRunner()


def manifest(tmp_path: Path, spec: str) -> str:
    path = tmp_path / "job.yaml"
    path.write_text(
        "apiVersion: training.blackwell.dev/v1alpha1\nkind: BlackwellTrainingJob\n"
        f"metadata: {{name: j}}\nspec: {{model: {{preset: llama3.2-1b}}{spec}}}\n"
    )
    return str(path)


def kinds(stdout: str) -> list[str]:
    return [document["kind"] for document in yaml.safe_load_all(stdout)]


def test_render_backend_overrides_the_manifest() -> None:
    result = runner.invoke(app, ["render", "--backend", "TrainJob"])
    assert result.exit_code == 0, result.output
    assert kinds(result.stdout) == ["ConfigMap", "TrainingRuntime", "TrainJob"]
    assert "backend: TrainJob" in result.stderr


def test_auto_offline_takes_the_first_of_its_order_and_says_so(tmp_path: Path) -> None:
    result = runner.invoke(app, ["render", manifest(tmp_path, ", backend: auto")])
    assert result.exit_code == 0, result.output
    assert kinds(result.stdout)[-1] == "TrainJob"
    assert "auto -> TrainJob offline" in result.stderr and "pass --backend" in result.stderr
    # HyperPod auto-resume needs a Kubeflow PyTorchJob: auto never picks TrainJob for it.
    resumed = runner.invoke(app, ["render", manifest(tmp_path, ", backend: auto, autoResume: true")])
    assert resumed.exit_code == 0, resumed.output
    assert kinds(resumed.stdout)[-1] == "PyTorchJob"


def test_plan_reports_the_backend(tmp_path: Path) -> None:
    result = runner.invoke(app, ["plan", manifest(tmp_path, ""), "--backend", "auto"])
    assert result.exit_code == 0, result.output
    assert "backend: auto -> TrainJob" in result.stderr
    assert "backend: PyTorchJob" in runner.invoke(app, ["plan", manifest(tmp_path, "")]).stderr


def test_an_unknown_backend_exits_2() -> None:
    result = runner.invoke(app, ["render", "--backend", "MPIJob"])
    assert result.exit_code == 2
    assert "--backend" in result.output


def test_a_backend_that_refuses_the_spec_exits_2_naming_the_field(tmp_path: Path) -> None:
    result = runner.invoke(app, ["render", manifest(tmp_path, ", autoResume: true"), "--backend", "TrainJob"])
    assert result.exit_code == 2
    assert "spec.autoResume" in result.output
