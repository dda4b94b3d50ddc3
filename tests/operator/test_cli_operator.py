"""`btj demo` (the real operator against the embedded emulator) and `btj run`'s interface."""

from __future__ import annotations

import logging
import threading
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


def demo(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["demo", "--pause", "0", *args])
    return result.exit_code, " ".join(result.output.split())


@pytest.mark.integration
def test_demo_runs_the_operator_through_a_whole_job() -> None:
    code, out = demo()
    assert code == 0, out
    assert "Created PyTorchJob llama3-8b-pretrain" in out
    for phase in ("Pending", "Running", "Succeeded"):
        assert f"BTJ phase {phase}" in out
    assert "condition Planned True Planned" in out
    assert "binds the workers to hyperpod-i-000, hyperpod-i-001" in out
    assert "ServiceAccount" not in out, "the example names none: the namespace's default"
    # The embedded example names no queue and asks for 1000 steps: no Kueue, and its own step count.
    assert "Kueue" not in out and "Queued" not in out
    assert "run 1000 steps (spec.training.steps" in out


@pytest.mark.integration
def test_demo_steps_follow_the_spec(tmp_path: Path) -> None:
    text = (ROOT / "operator/src/blackwell_operator/examples/default.yaml").read_text()
    short = tmp_path / "short.yaml"
    short.write_text(text.replace("steps: 1000", "steps: 42"))
    code, out = demo(str(short))
    assert code == 0, out
    assert "run 42 steps" in out and "1000" not in out


@pytest.mark.integration
def test_demo_of_a_job_the_cluster_cannot_hold_waits_and_does_not_succeed() -> None:
    code, out = demo("--nodes", "1")
    assert code == 1, out
    assert (
        "InsufficientNodes: 1 of 1 ml.p6-b200.48xlarge nodes schedulable: 1 free, 0 held by other workloads; "
        "2 needed"
    ) in out
    assert "places 1 of 2 worker(s)" in out and "didn't match pod anti-affinity rules" in out
    assert "BTJ phase Running" not in out and "BTJ phase Succeeded" not in out
    assert "Not run: BTJ phase Pending; the job waits for capacity" in out


@pytest.mark.integration
def test_demo_queues_only_a_job_that_names_a_queue_and_admits_it_when_it_fits() -> None:
    code, out = demo(str(ROOT / "examples" / "llama3.1-8b-kueue.yaml"))
    assert code == 0, out
    queued, admitted = out.index("BTJ phase Queued"), out.index("Kueue admits it: 2 node(s)")
    assert queued < admitted < out.index("BTJ phase Succeeded")
    assert "run 5000 steps" in out
    assert "ServiceAccount training-s3 created for the demo" in out, "the example names one"
    code, out = demo(str(ROOT / "examples" / "llama3.1-8b-kueue.yaml"), "--nodes", "1")
    assert code == 1, out
    assert "Not run: BTJ phase Queued; Kueue keeps it suspended" in out
    assert "BTJ phase Running" not in out and "BTJ phase Succeeded" not in out


@pytest.mark.integration
def test_demo_plays_kubeflow_trainer_for_a_trainjob(tmp_path: Path) -> None:
    text = (ROOT / "operator/src/blackwell_operator/examples/default.yaml").read_text()
    trainjob = tmp_path / "trainjob.yaml"
    trainjob.write_text(text.replace("steps: 1000", "steps: 77") + "  backend: TrainJob\n")
    code, out = demo(str(trainjob))
    assert code == 0, out
    assert "Created TrainJob llama3-8b-pretrain" in out
    assert "Kubeflow Trainer (its JobSet) takes the job" in out
    assert out.index("BTJ phase Running") < out.index("run 77 steps") < out.index("BTJ phase Succeeded")


@pytest.mark.integration
def test_demo_of_a_dry_run_creates_nothing() -> None:
    kopf_logger = logging.getLogger("kopf")
    before = kopf_logger.level
    result = CliRunner().invoke(app, ["demo", str(ROOT / "examples" / "dry-run.yaml")])
    assert result.exit_code == 0, result.output
    assert "nothing was created" in result.output
    # The operator had stopped when the demo returned: its last API calls were answered, not left waiting
    # on the embedded server (whose event loop the demo once blocked while joining it, for 30 s).
    assert not [t for t in threading.enumerate() if t.name == "btj-operator"]
    # The demo quiets Kopf for itself only: later operator runs in this process keep their warnings.
    assert kopf_logger.level == before


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
