"""`btj render` and the real operator on the same manifests: the same refusals, the same objects (issue 39).

A BTJ naming only a weights folder this machine can read used to render children offline while the
operator marked it Invalid; a readable folder also put its real size into render's plan, which the
operator, reading no checkpoint, estimates. Each case here is rendered and then applied to the emulated
cluster with the real operator running.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from blackwell_operator.admission.redact import redacted
from blackwell_operator.cli import _register_commands, app
from tests.operator.harness import Cluster, btj, running_operator, wait_for

pytestmark = pytest.mark.integration

_register_commands()
runner = CliRunner()

# Meta's Llama 3.1 8B config.json (the keys the trainer reads): the llama3.1-8b preset's model.
LLAMA_3_1_8B = {
    "model_type": "llama",
    "hidden_act": "silu",
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "vocab_size": 128256,
    "tie_word_embeddings": False,
    "rope_theta": 500000.0,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    "torch_dtype": "bfloat16",
}


@pytest.fixture
def fsx(tmp_path: Path) -> Path:
    """A mounted volume holding a Llama 3.1 8B checkpoint folder (its config.json and one small file)."""
    root = tmp_path / "fsx"
    (root / "llama").mkdir(parents=True)
    (root / "llama" / "config.json").write_text(json.dumps(LLAMA_3_1_8B))
    (root / "llama" / "model.safetensors").write_bytes(b"\0" * 4096)
    return root


def cases(fsx: Path) -> dict[str, dict[str, Any]]:
    volumes = [{"name": "fsx", "claimName": "fsx-claim", "mountPath": str(fsx)}]
    weights = {"uri": str(fsx / "llama")}
    return {
        "weights-alone-readable-here": btj("alone", model={"weights": weights}, volumes=volumes),
        "preset-and-weights-readable-here": btj(
            "named", model={"preset": "llama3.1-8b", "weights": weights}, volumes=volumes
        ),
        "preset-and-weights-on-s3": btj(
            "s3", model={"preset": "llama3.1-8b", "weights": {"uri": "s3://models/llama-3.1-8b"}}
        ),
        # Refusals past the CRD's schema, each the operator's (admission or the planner) and render's alike.
        "an-operator-variable-in-env": btj("env", env=[{"name": "PYTORCH_CUDA_ALLOC_CONF", "value": "x"}]),
        "a-metrics-address-the-trainer-refuses": btj(
            "metrics", env=[{"name": "BTJ_METRICS_ADDRESS", "value": "localhost"}]
        ),
        "elastic-without-a-checkpoint": btj(
            "elastic",
            cluster={
                "instanceType": "ml.p6-b200.48xlarge",
                "nodes": 2,
                "elastic": {"minNodes": 1, "maxNodes": 2},
            },
            training={"sequenceLength": 8192, "steps": 10, "globalBatchTokens": 2097152},
        ),
        "a-model-that-fits-no-plan": btj(
            "huge",
            model={"preset": "llama3.1-70b"},
            cluster={"instanceType": "ml.p5.48xlarge", "nodes": 1},
            training={"sequenceLength": 131072, "steps": 10},
        ),
        "an-unknown-preset": btj("unknown", model={"preset": "llama3.1-8b-nope"}),
    }


# The cases both refuse; the others both create.
REFUSED = {
    "weights-alone-readable-here",
    "an-operator-variable-in-env",
    "a-metrics-address-the-trainer-refuses",
    "elastic-without-a-checkpoint",
    "a-model-that-fits-no-plan",
    "an-unknown-preset",
}


def rendered(tmp_path: Path, manifest: dict[str, Any]) -> tuple[int, str, list[dict[str, Any]]]:
    """btj render's exit code, its first problem (if any) and its objects. An admission refusal is a line
    `error: FILE: invalid BlackwellTrainingJob` and then a line a problem; any other, one `error:` line."""
    path = tmp_path / f"{manifest['metadata']['name']}.yaml"
    path.write_text(yaml.safe_dump(manifest))
    result = runner.invoke(app, ["render", str(path), "-o", "json"])
    lines = result.stderr.splitlines()
    at = next((i for i, line in enumerate(lines) if line.startswith("error: ")), None)
    problem = ""
    if at is not None:
        first = lines[at].removeprefix("error: ")
        problem = lines[at + 1] if first.endswith(": invalid BlackwellTrainingJob") else first
    objects = json.loads(result.stdout)["items"] if result.exit_code == 0 else []
    return result.exit_code, problem, objects


def as_status_says(problem: str, manifest: dict[str, Any]) -> str:
    """Render's problem without its fix, its values as the operator writes them: on this machine render
    shows the user's own values; status and Events, readable by others, name only their type (the
    operator's own redaction, admission/redact.py)."""
    return re.sub(r"'[^']*'", "<string>", redacted(problem.split(". Fix: ")[0], manifest, strings_only=True))


@pytest.mark.parametrize(
    "case",
    [
        "weights-alone-readable-here",
        "preset-and-weights-readable-here",
        "preset-and-weights-on-s3",
        "an-operator-variable-in-env",
        "a-metrics-address-the-trainer-refuses",
        "elastic-without-a-checkpoint",
        "a-model-that-fits-no-plan",
        "an-unknown-preset",
    ],
)
async def test_render_refuses_and_creates_what_the_operator_does(
    cluster: Cluster, fsx: Path, tmp_path: Path, case: str
) -> None:
    manifest = cases(fsx)[case]
    name = manifest["metadata"]["name"]
    code, error, objects = rendered(tmp_path, manifest)
    assert bool(code) is (case in REFUSED), (case, code, error)
    async with running_operator(cluster):
        await cluster.apply(manifest)
        await wait_for(
            lambda: cluster.status(name).get("phase") == "Invalid" or cluster.job(name) is not None,
            what="the operator's verdict",
        )
    if code:
        assert cluster.status(name).get("phase") == "Invalid", (case, error)
        # The same problem, in the same words (render's fix may add the model its config.json names).
        assert error and cluster.status(name)["message"].startswith(as_status_says(error, manifest)), (
            error,
            cluster.status(name),
        )
        assert cluster.job(name) is None and cluster.config_map(f"{name}-plan") is None
        return
    assert cluster.status(name).get("phase") != "Invalid", (case, cluster.status(name))
    by_kind = {obj["kind"]: obj for obj in objects}
    config_map = cluster.config_map(f"{name}-plan")
    assert config_map is not None
    planned = json.loads(by_kind["ConfigMap"]["data"]["plan.json"])
    assert json.loads(config_map["data"]["plan.json"]) == planned
    job = cluster.job(name)
    assert job is not None and job["spec"] == by_kind["PyTorchJob"]["spec"]
