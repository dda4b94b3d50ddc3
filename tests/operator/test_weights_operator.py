"""The real operator with initial weights and an export: the plan carries them; weights alone are Invalid."""

from __future__ import annotations

import json

import pytest

from blackwell_trainer.plan.config import Plan
from tests.operator.harness import Cluster, btj, running_operator, wait_for

pytestmark = pytest.mark.integration

TRAINING = {"sequenceLength": 8192, "steps": 1000, "output": {"uri": "s3://exports/ft"}}


async def test_weights_and_output_reach_the_trainers_plan(cluster: Cluster) -> None:
    model = {"preset": "llama3.1-8b", "weights": {"uri": "s3://models/llama-3.1-8b"}}
    async with running_operator(cluster) as runner:
        await cluster.apply(btj("ft", model=model, training=TRAINING))
        await wait_for(lambda: cluster.job("ft"), what="the PyTorchJob")
    assert runner.exception is None
    config_map = cluster.config_map("ft-plan")
    assert config_map is not None
    plan = Plan.model_validate_json(config_map["data"]["plan.json"])
    assert plan.weights is not None and plan.weights.uri == "s3://models/llama-3.1-8b"
    assert plan.weights.load is not None and plan.weights.load.load_seconds == pytest.approx(2.6, abs=0.05)
    assert plan.output is not None and plan.output.uri == "s3://exports/ft"
    status_plan = cluster.status("ft")["plan"]  # status leaves out the null fields
    assert status_plan["weights"]["load"] == json.loads(config_map["data"]["plan.json"])["weights"]["load"]
    assert status_plan["output"] == {"uri": "s3://exports/ft"}


async def test_weights_alone_are_invalid_in_the_cluster_with_the_fix(cluster: Cluster) -> None:
    # btj plan can read a folder's config.json; the operator reads no checkpoint.
    volumes = [{"name": "fsx", "claimName": "fsx-claim", "mountPath": "/fsx"}]
    async with running_operator(cluster):
        await cluster.apply(btj("bare", model={"weights": {"uri": "/fsx/models/llama"}}, volumes=volumes))
        await wait_for(lambda: cluster.status("bare").get("phase") == "Invalid", what="phase Invalid")
    message = cluster.status("bare")["message"]
    assert "spec.model: neither preset nor architecture is set" in message
    assert "set spec.model.preset or spec.model.architecture" in message
    assert cluster.job("bare") is None and cluster.config_map("bare-plan") is None
