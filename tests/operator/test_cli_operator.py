"""`btj demo` (the real operator against the embedded emulator) and `btj run`'s interface."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from blackwell_operator.cli import _register_commands, app

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # The demo points KUBECONFIG at its embedded server; keep that out of other tests.
    monkeypatch.setenv("KUBECONFIG", "/nonexistent")
    monkeypatch.setenv("BTJ_METRICS_BIND", "off")
    _register_commands()


@pytest.mark.integration
def test_demo_runs_the_operator_through_a_whole_job() -> None:
    result = CliRunner().invoke(app, ["demo", "--pause", "0"])
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())
    assert "Created PyTorchJob llama3-8b-pretrain" in out
    for phase in ("Queued", "Running", "Succeeded"):
        assert f"BTJ phase {phase}" in out
    assert "condition Planned True Planned" in out


@pytest.mark.integration
def test_demo_of_a_dry_run_creates_nothing() -> None:
    result = CliRunner().invoke(app, ["demo", str(ROOT / "examples" / "dry-run.yaml")])
    assert result.exit_code == 0, result.output
    assert "nothing was created" in result.output


def test_demo_rejects_a_bad_manifest_in_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: training.blackwell.dev/v1alpha1\nkind: BlackwellTrainingJob\nspec: {model: {}}\n"
    )
    result = CliRunner().invoke(app, ["demo", str(bad)])
    assert result.exit_code == 2
    assert "Traceback" not in result.output and "spec.model" in result.output


def test_run_documents_its_options() -> None:
    result = CliRunner().invoke(app, ["run", "--help"])
    assert result.exit_code == 0
    assert "--namespace" in result.output and "--metrics-bind" in result.output
