"""`btj plan` with initial weights in a folder it can read: config.json's architecture and the real size."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from blackwell_operator.cli import _register_commands, app
from blackwell_trainer.plan.config import Plan
from tests.support.hf_models import architecture_of, save_hf_model

_register_commands()
runner = CliRunner()


def job(tmp_path: Path, model: dict[str, object], **training: object) -> Path:
    manifest = {
        "apiVersion": "training.blackwell.dev/v1alpha1",
        "kind": "BlackwellTrainingJob",
        "metadata": {"name": "ft"},
        "spec": {
            "model": model,
            "cluster": {"instanceType": "ml.p5en.48xlarge", "nodes": 1, "gpusPerNode": 2},
            "training": {"sequenceLength": 128, "steps": 10, **training},
            "volumes": [{"name": "fsx", "claimName": "fsx-claim", "mountPath": str(tmp_path)}],
        },
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest))
    return path


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("fsx") / "llama"
    save_hf_model("llama3.1", folder)
    return folder


def test_the_size_comes_from_the_folder_and_the_children_carry_the_operators_plan(checkpoint: Path) -> None:
    root = checkpoint.parent
    model = {"architecture": named(checkpoint), "weights": {"uri": str(checkpoint)}}
    manifest = job(root, model, output={"uri": str(root / "out")})
    result = runner.invoke(app, ["plan", str(manifest), "-o", "json"])
    assert result.exit_code == 0, result.output
    plan = Plan.model_validate_json(result.stdout)
    assert plan.architecture == architecture_of(checkpoint)
    assert plan.architecture.rope_scaling is not None and plan.architecture.rope_scaling.factor == 8.0
    size = os.path.getsize(checkpoint / "model.safetensors")
    assert plan.weights is not None and plan.weights.size_bytes == size
    assert plan.weights.load is not None and not plan.weights.load.checkpoint_bytes_estimated
    assert plan.output is not None and plan.output.uri == str(root / "out")

    tables = runner.invoke(app, ["plan", str(manifest)])
    assert tables.exit_code == 0, tables.output
    assert f"Initial weights: {checkpoint}" in tables.stdout and "predicted load time" in tables.stdout

    # The operator reads no checkpoint: the ConfigMap render prints holds its estimate, not the size here.
    rendered = runner.invoke(app, ["render", str(manifest), "-o", "json"])
    assert rendered.exit_code == 0, rendered.output
    (config_map,) = [o for o in json.loads(rendered.stdout)["items"] if o["kind"] == "ConfigMap"]
    child_plan = Plan.model_validate_json(config_map["data"]["plan.json"])
    assert child_plan.weights is not None and child_plan.weights.size_bytes is None
    assert child_plan.weights.load is not None and child_plan.weights.load.checkpoint_bytes_estimated


def test_weights_alone_readable_here_are_refused_with_the_model_to_name(checkpoint: Path) -> None:
    # Issue 39: these planned offline while the operator marked the same BTJ Invalid.
    root = checkpoint.parent
    manifest = job(root, {"weights": {"uri": str(checkpoint)}})
    lines = set()
    for command in ("plan", "render"):
        result = runner.invoke(app, [command, str(manifest), "-o", "json"])
        assert result.exit_code == 2, (command, result.output)
        lines.add(result.stderr.strip())
    (line,) = lines
    assert line.startswith("error: spec.model: neither preset nor architecture is set"), line
    fix = line.split("Fix: set spec.model.architecture: ", 1)[1].split(" (what ", 1)[0]
    assert json.loads(fix) == named(checkpoint)  # pasted, it is the checkpoint's model
    pasted = job(root, {"architecture": json.loads(fix), "weights": {"uri": str(checkpoint)}})
    assert runner.invoke(app, ["plan", str(pasted)]).exit_code == 0


# Meta's Llama 3.2 1B config.json, the keys the trainer reads.
LLAMA_3_2_1B = {
    "model_type": "llama",
    "hidden_act": "silu",
    "hidden_size": 2048,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 8192,
    "vocab_size": 128256,
    "tie_word_embeddings": True,
    "rope_theta": 500000.0,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 32.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    "torch_dtype": "bfloat16",
}


def test_weights_alone_of_a_preset_name_the_preset(tmp_path: Path) -> None:
    folder = tmp_path / "llama-1b"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA_3_2_1B))
    (folder / "model.safetensors").write_bytes(b"")
    result = runner.invoke(app, ["plan", str(job(tmp_path, {"weights": {"uri": str(folder)}}))])
    assert result.exit_code == 2
    assert f"Fix: set spec.model.preset: llama3.2-1b (what {folder}/config.json describes)" in result.stderr


def named(folder: Path) -> dict[str, object]:
    """The checkpoint's architecture as spec.model.architecture writes it."""
    return architecture_of(folder).model_dump(mode="json", by_alias=True, exclude_none=True)


def test_a_named_model_that_is_not_the_checkpoints_is_one_line(checkpoint: Path) -> None:
    manifest = job(checkpoint.parent, {"preset": "llama3.2-1b", "weights": {"uri": str(checkpoint)}})
    result = runner.invoke(app, ["plan", str(manifest)])
    assert result.exit_code == 2
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"error: spec.model.weights.uri: {checkpoint}: config.json hidden_size gives")
    assert "Fix: name the checkpoint's model" in line


def test_a_folder_that_is_no_checkpoint_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    result = runner.invoke(app, ["plan", str(job(tmp_path, {"weights": {"uri": str(tmp_path / "empty")}}))])
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        f"error: spec.model.weights.uri: {tmp_path / 'empty'} holds no config.json. Fix: point it at a "
        "Hugging Face checkpoint folder (config.json and *.safetensors)"
    )
    (tmp_path / "gpt2").mkdir()
    (tmp_path / "gpt2" / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    result = runner.invoke(app, ["plan", str(job(tmp_path, {"weights": {"uri": str(tmp_path / "gpt2")}}))])
    assert result.exit_code == 2 and "model_type 'gpt2' is not supported" in result.stderr


def test_weights_only_that_cannot_be_read_here_names_the_fix(tmp_path: Path) -> None:
    result = runner.invoke(app, ["plan", str(job(tmp_path, {"weights": {"uri": str(tmp_path / "absent")}}))])
    assert result.exit_code == 2
    assert "error: spec.model: neither preset nor architecture is set" in result.stderr
    assert "Fix: set spec.model.preset or spec.model.architecture" in result.stderr


def test_a_checkpoint_larger_than_the_pods_memory_is_refused_offline(
    checkpoint: Path, tmp_path: Path
) -> None:
    big = tmp_path / "big"
    big.mkdir()
    (big / "config.json").write_bytes((checkpoint / "config.json").read_bytes())
    for index in range(2):  # sparse: 2 x 900 GB on paper, nothing on the disk
        with open(big / f"model-0000{index + 1}-of-00002.safetensors", "wb") as handle:
            handle.truncate(900 * 10**9)
    model = {"architecture": named(checkpoint), "weights": {"uri": str(big)}}
    result = runner.invoke(app, ["plan", str(job(tmp_path, model))])
    assert result.exit_code == 2
    (line,) = result.stderr.strip().splitlines()
    # Two of the node's eight GPUs: the pod requests a quarter of 75% of 2 TiB.
    # Plus the export's buffer: one 2 GiB file (the tiny model's tensors are far smaller).
    assert "loading the checkpoint's 1,800.0 GB needs 1,802.1 GB of host memory per node" in line
    assert "more than the trainer pod's 412.3 GB. Fix: shard the model" in line


def test_the_checkpoints_dtype_is_the_one_the_export_budget_uses(checkpoint: Path, tmp_path: Path) -> None:
    from blackwell_operator.cli.checkpoint import read_checkpoint
    from blackwell_operator.models.spec import BlackwellTrainingJobSpec

    spec = BlackwellTrainingJobSpec.model_validate(
        yaml.safe_load(job(checkpoint.parent, {"weights": {"uri": str(checkpoint)}}).read_text())["spec"]
    )
    facts = read_checkpoint(spec)
    assert facts is not None and facts.export_dtype == "float32"  # saved by transformers in float32
    config = json.loads((checkpoint / "config.json").read_text())
    assert config.get("dtype", config.get("torch_dtype")) == "float32"
