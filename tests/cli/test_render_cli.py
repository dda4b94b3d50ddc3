"""`btj render` and `btj crd` from the command line: offline, parseable output, exit 2 on bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from blackwell_operator.cli import _register_commands, app

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "crds" / "training.blackwell.dev_blackwelltrainingjobs.yaml"

_register_commands()
runner = CliRunner()


def test_crd_prints_the_committed_file() -> None:
    result = runner.invoke(app, ["crd"])
    assert result.exit_code == 0
    assert result.stdout == CRD_FILE.read_text()


def test_render_embedded_example_offline() -> None:
    result = runner.invoke(app, ["render"])
    assert result.exit_code == 0, result.output
    documents = list(yaml.safe_load_all(result.stdout))
    assert [doc["kind"] for doc in documents] == ["ConfigMap", "PyTorchJob"]
    assert documents[0]["metadata"]["name"] == "llama3-8b-pretrain-plan"
    assert json.loads(documents[0]["data"]["plan.json"])["jobName"] == "llama3-8b-pretrain"
    assert documents[1]["metadata"]["namespace"] == "hyperpod-ns-team-a"
    assert "predicted" in result.stderr and "llama3.1-8b" in result.stderr
    # A B200 plan is modelled, and the first thing a user reads says so.
    assert "rests on: modelled, not measured: gpu B200" in result.stderr


def test_render_json_is_a_kubernetes_list() -> None:
    result = runner.invoke(app, ["render", "-o", "json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["kind"] == "List"
    assert [item["kind"] for item in document["items"]] == ["ConfigMap", "PyTorchJob"]


def test_render_is_deterministic_across_runs() -> None:
    assert runner.invoke(app, ["render"]).stdout == runner.invoke(app, ["render"]).stdout


def test_render_hyperpod_backend(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(
        "apiVersion: training.blackwell.dev/v1alpha1\nkind: BlackwellTrainingJob\n"
        "metadata: {name: hp, labels: {app.kubernetes.io/instance: argo-app, team: a}}\n"
        "spec: {model: {preset: llama3.2-1b}, backend: HyperPodPyTorchJob}\n"
    )
    result = runner.invoke(app, ["render", str(path)])
    assert result.exit_code == 0, result.output
    _, job = yaml.safe_load_all(result.stdout)
    assert job["kind"] == "HyperPodPyTorchJob"
    assert job["metadata"]["namespace"] == "default"
    assert job["metadata"]["labels"]["team"] == "a"
    assert "app.kubernetes.io/instance" not in job["metadata"]["labels"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ("spec: {model: {preset: llama3.1-8b}, tuning: {precision: fp16}}", "spec.tuning.precision"),
        ("spec: {model: {preset: llama3.1-8b}, cluster: {nodes: 0}}", "spec.cluster.nodes"),
        ("spec: {model: {}}", "model.preset or model.architecture"),
    ],
)
def test_bad_manifest_exits_2_naming_the_field(tmp_path: Path, body: str, field: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        "apiVersion: training.blackwell.dev/v1alpha1\nkind: BlackwellTrainingJob\n"
        f"metadata: {{name: x}}\n{body}\n"
    )
    result = runner.invoke(app, ["render", str(path)])
    assert result.exit_code == 2
    assert field in result.stderr
    assert "Traceback" not in result.output


def test_missing_file_exits_2(tmp_path: Path) -> None:
    result = runner.invoke(app, ["render", str(tmp_path / "nope.yaml")])
    assert result.exit_code == 2
    assert "cannot read" in result.stderr


def test_planning_error_exits_2_naming_the_field(tmp_path: Path) -> None:
    path = tmp_path / "h100-mxfp8.yaml"
    path.write_text(
        "apiVersion: training.blackwell.dev/v1alpha1\nkind: BlackwellTrainingJob\nmetadata: {name: x}\n"
        "spec: {model: {preset: llama3.1-8b}, cluster: {instanceType: ml.p5.48xlarge},"
        " tuning: {precision: mxfp8}}\n"
    )
    result = runner.invoke(app, ["render", str(path)])
    assert result.exit_code == 2, result.output
    assert "spec.tuning.precision" in result.stderr
    assert "Traceback" not in result.output


def test_a_name_the_api_server_would_reject_exits_2(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(
        "apiVersion: training.blackwell.dev/v1alpha1\nkind: BlackwellTrainingJob\n"
        "metadata: {name: 8b-pretrain}\nspec: {model: {preset: llama3.1-8b}}\n"
    )
    result = runner.invoke(app, ["render", str(path)])
    assert result.exit_code == 2
    assert "metadata.name: must be a DNS-1035 label" in result.stderr


def test_render_on_a_terminal_shows_the_plan_and_names_not_the_yaml(monkeypatch: pytest.MonkeyPatch) -> None:
    import blackwell_operator.cli.render as render_cli

    monkeypatch.setattr(render_cli, "_stdout_is_terminal", lambda: True)
    result = runner.invoke(app, ["render"])
    assert result.exit_code == 0, result.output
    assert "predicted" in result.stderr, "the plan first"
    assert result.stdout.splitlines()[:3] == [
        "objects the operator would create:",
        "  ConfigMap hyperpod-ns-team-a/llama3-8b-pretrain-plan",
        "  PyTorchJob hyperpod-ns-team-a/llama3-8b-pretrain",
    ]
    assert "apiVersion" not in result.stdout and "`btj render -o yaml` prints them (" in result.stdout
    for asked in (["-o", "yaml"], ["-o", "json"]):
        asked_for = runner.invoke(app, ["render", *asked])
        assert asked_for.exit_code == 0 and "apiVersion" in asked_for.stdout, "an explicit -o is obeyed"


def test_render_is_a_preview_that_says_to_apply_the_btj(monkeypatch: pytest.MonkeyPatch) -> None:
    # Issue 39: children applied by hand have no owner, status, re-plan or finalizer.
    import blackwell_operator.cli.render as render_cli

    for terminal in (True, False):
        monkeypatch.setattr(render_cli, "_stdout_is_terminal", lambda terminal=terminal: terminal)
        result = runner.invoke(app, ["render"])
        assert result.exit_code == 0, result.output
        assert "apply the BlackwellTrainingJob itself (kubectl apply -f job.yaml)" in result.output
        assert "kubectl apply -f -" not in result.output
    help_text = runner.invoke(app, ["render", "--help"]).stdout
    assert "Preview" in help_text and "kubectl apply -f -" not in help_text
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    assert "render | kubectl" not in readme and "render |kubectl" not in readme
