"""`btj train`: the trainer run here as the pods run it (issue 39): the operator's plan, the pods' env."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from blackwell_operator.cli import _register_commands, app
from blackwell_operator.cli.local_run import TERMINATION_LOG_ENV, local_run, trainer_container
from blackwell_operator.render import render_children
from tests.ports import free_port
from tests.support.plans import TINY_ARCHITECTURE, plan_for

_register_commands()
runner = CliRunner()
BTJ = Path(sys.executable).with_name("btj")
TIMEOUT_S = 300

# The trainer tests' tiny model (tests/trainer/conftest.py), planned as a BTJ for one node of two GPUs:
# two CPU processes under torch.distributed.run, gloo, three steps.
TINY = TINY_ARCHITECTURE


def tiny_job(tmp_path: Path, **training: Any) -> Path:
    manifest = {
        "apiVersion": "training.blackwell.dev/v1alpha1",
        "kind": "BlackwellTrainingJob",
        "metadata": {"name": "tiny-smoke", "namespace": "team-a"},
        "spec": {
            "model": {"architecture": TINY},
            "cluster": {"instanceType": "ml.p5en.48xlarge", "nodes": 1, "gpusPerNode": 2},
            "training": {"sequenceLength": 128, "steps": 3, "globalBatchTokens": 1024, **training},
            "tuning": {"precision": "bf16", "compile": False, "microBatchSize": 4},
            # Loopback only, as a pod's trainer can be told through spec.env.
            "env": [{"name": "BTJ_METRICS_ADDRESS", "value": "127.0.0.1"}],
            "volumes": [{"name": "fsx", "claimName": "fsx-claim", "mountPath": str(tmp_path)}],
        },
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest))
    return path


def btj_train(path: Path, workdir: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    command = [str(BTJ), "train", str(path), "--workdir", str(workdir), "--metrics-port", str(free_port())]
    return subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, env=env, check=False)


@pytest.mark.distributed
def test_a_tiny_job_trains_here_with_the_pods_plan(tmp_path: Path) -> None:
    path = tiny_job(tmp_path)
    done = btj_train(path, tmp_path / "run")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "step 3/3 loss" in done.stderr, done.stderr[-3000:]
    assert "-m torch.distributed.run --standalone --nproc-per-node=2 -m blackwell_trainer" in done.stderr
    assert "the trainer finished (exit 0)" in done.stderr
    # The plan it ran is the operator's (btj render's ConfigMap), but for the port given here.
    rendered = runner.invoke(app, ["render", str(path), "-o", "json"])
    (config_map,) = [o for o in json.loads(rendered.stdout)["items"] if o["kind"] == "ConfigMap"]
    ran = json.loads((tmp_path / "run" / "plan.json").read_text())
    pods = json.loads(config_map["data"]["plan.json"])
    assert {k: v for k, v in ran.items() if k != "metricsPort"} == {
        k: v for k, v in pods.items() if k != "metricsPort"
    }


@pytest.mark.distributed
def test_a_pods_failure_is_reproduced_with_its_termination_message(tmp_path: Path) -> None:
    # Data that is not there: the pod's trainer stops with a permanent error before any step.
    missing = tmp_path / "no-such-shards"
    path = tiny_job(tmp_path, dataset={"kind": "shards", "uri": str(missing), "tokenDtype": "uint16"})
    done = btj_train(path, tmp_path / "run")
    assert done.returncode != 0
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("error: the trainer exited with code")]
    assert "its termination message: permanent error: " in line and str(missing) in line, line


def test_every_variable_the_pod_gets_is_set_here(tmp_path: Path) -> None:
    from blackwell_operator.models.spec import BlackwellTrainingJobSpec

    for backend in ("PyTorchJob", "HyperPodPyTorchJob", "TrainJob"):
        spec = BlackwellTrainingJobSpec.model_validate(
            {
                "model": {"preset": "llama3.2-1b"},
                "cluster": {"instanceType": "ml.p5en.48xlarge", "nodes": 1},
                "training": {"sequenceLength": 4096, "checkpoint": {"path": "/local/ckpt"}},
                "backend": backend,
                "env": [{"name": "BTJ_METRICS_ADDRESS", "value": "127.0.0.1"}],
            }
        )
        plan = plan_for(spec, "job")
        objects = render_children("job", "ns", spec, plan)
        pod_env = {v["name"]: v["value"] for v in trainer_container(objects)["env"]}
        run = local_run(objects, plan, tmp_path)
        assert set(run.env) == {*pod_env, TERMINATION_LOG_ENV}, backend
        assert run.env["BTJ_METRICS_ADDRESS"] == "127.0.0.1"
        moved = {name for name in pod_env if run.env[name] != pod_env[name]}
        assert moved == {
            "BTJ_CACHE_DIR",
            "BTJ_PLAN_PATH",
            "GLOO_SOCKET_IFNAME",
            "NCCL_SOCKET_IFNAME",
            "TORCH_NCCL_DEBUG_INFO_TEMP_FILE",
        }, backend
        assert len(run.changes) == len(moved) + 1  # and the checkpoint under /local
        assert json.loads(run.plan_json)["checkpoint"]["path"] == str(tmp_path.resolve() / "local" / "ckpt")
        assert f"--nproc-per-node={plan.world_size}" in run.command


def test_without_the_trainer_extra_it_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a)
    )
    result = runner.invoke(app, ["train", "job.yaml"])
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        "error: btj train runs the trainer, which needs torch and the trainer extra: pip install "
        "'blackwell-training-operator[trainer]' (or bash scripts/bootstrap.sh --all)"
    )
