"""Issue 15 part 1 in the operator: status.plan, PlanVerified and an Event say what a plan rests on."""

from __future__ import annotations

import pytest

from blackwell_trainer.plan.config import Plan
from tests.operator.harness import Cluster, btj, running_operator, wait_for

pytestmark = pytest.mark.integration


def _events(cluster: Cluster, name: str, reason: str) -> list[dict[str, str]]:
    return [e for e in cluster.events(name) if e["reason"] == reason]


async def test_a_modelled_plan_says_so_in_status_a_condition_and_one_event(cluster: Cluster) -> None:
    async with running_operator(cluster) as runner:
        await cluster.apply(btj("modelled"))
        await wait_for(lambda: cluster.condition("modelled", "ChildCreated"), what="ChildCreated")
        await wait_for(lambda: _events(cluster, "modelled", "PlanModelled"), what="the PlanModelled Event")
        await cluster.settle("modelled")
        status = cluster.status("modelled")
        verified = cluster.condition("modelled", "PlanVerified")
        events = _events(cluster, "modelled", "PlanModelled")
    assert runner.exception is None
    plan = Plan.model_validate(status["plan"])
    by = {c.choice: c for c in plan.provenance}
    assert by["gpu"].value == "B200" and by["gpu"].basis.value == "modelled"
    assert by["precision"].basis.value == "modelled"
    assert "H200 (benchmarks/calibration/records/" in by["precision"].detail
    assert plan.chosen.precision.value != "nvfp4"
    assert verified is not None
    assert (verified["status"], verified["reason"]) == ("False", "Modelled")
    assert verified["message"].startswith("modelled, not measured: gpu B200, precision ")
    (event,) = events  # one per plan, not one per pass
    assert event["type"] == "Normal"
    assert event["message"] == f"Plan provenance: {verified['message']}"

    # Issue 39: the lines pasted into capacity requests carry the word beside the figures.
    planned = cluster.condition("modelled", "Planned")
    (created,) = _events(cluster, "modelled", "Created")
    predicted = (
        f"predicted (modelled, not measured) {plan.predicted.tokens_per_second_per_gpu:,.0f} tokens/s/GPU"
    )
    assert planned is not None and predicted in planned["message"], planned
    assert predicted in created["message"], created


async def test_a_pinned_unverified_recipe_is_obeyed_with_a_warning(cluster: Cluster) -> None:
    tuning = {"precision": "nvfp4"}
    async with running_operator(cluster) as runner:
        await cluster.apply(btj("fp4", tuning=tuning))
        await wait_for(lambda: cluster.job("fp4"), what="the PyTorchJob")
        await wait_for(lambda: _events(cluster, "fp4", "UnverifiedRecipe"), what="the UnverifiedRecipe Event")
        await cluster.settle("fp4")
        status = cluster.status("fp4")
        verified = cluster.condition("fp4", "PlanVerified")
        (event,) = _events(cluster, "fp4", "UnverifiedRecipe")
    assert runner.exception is None
    assert status["precision"] == "nvfp4"  # obeyed: the child runs the pinned recipe
    assert verified is not None
    assert (verified["status"], verified["reason"]) == ("False", "Unverified")
    assert event["type"] == "Warning"
    assert "precision nvfp4/nvfp4-block" in event["message"]
    assert event["message"].startswith("Plan rests on an unverified recipe: unverified (trainer path never ")
    planned = cluster.condition("fp4", "Planned")
    assert planned is not None and "predicted (modelled, trainer path unverified) " in planned["message"]


async def test_an_invalid_spec_has_no_plan_to_verify(cluster: Cluster) -> None:
    async with running_operator(cluster):
        await cluster.apply(btj("gone-bad", dryRun=True))
        await wait_for(lambda: cluster.condition("gone-bad", "PlanVerified"), what="PlanVerified")
        # An impossible pin on a job without a child: Invalid, and the earlier verdict goes with its plan.
        await cluster.patch_spec("gone-bad", {"tuning": {"microBatchSize": 1024}})
        await wait_for(lambda: cluster.status("gone-bad").get("phase") == "Invalid", what="phase Invalid")
        await wait_for(lambda: cluster.condition("gone-bad", "PlanVerified") is None, what="no PlanVerified")
