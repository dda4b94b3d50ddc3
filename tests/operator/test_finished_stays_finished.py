"""A finished BTJ stays finished whatever was edited while its finished child existed, with the operator up
or down; an edit made after the finished child was recorded gone runs it again (child_record.runs_again).
The real operator under KopfRunner against KMock."""

from __future__ import annotations

from typing import Any

import pytest

from tests.operator.harness import Cluster, btj, running_operator, wait_for
from tests.operator.pods import job_condition

pytestmark = pytest.mark.integration

SUCCEEDED = {
    "conditions": [job_condition("Created"), job_condition("Running", "False"), job_condition("Succeeded")]
}
EDIT = {"training": {"sequenceLength": 8192, "steps": 1200}}


def _child_created(cluster: Cluster, name: str) -> dict[str, Any]:
    return cluster.condition(name, "ChildCreated") or {}


async def _succeeded(cluster: Cluster, name: str) -> str:
    """Apply BTJ `name`, report its child Succeeded, wait for the BTJ; the child's uid."""
    await cluster.apply(btj(name))
    job = await wait_for(lambda: cluster.job(name), what=f"{name}'s PyTorchJob")
    await cluster.set_child_status(name, SUCCEEDED)
    await wait_for(lambda: cluster.status(name).get("phase") == "Succeeded", what=f"{name} Succeeded")
    return str(job["metadata"]["uid"])


async def test_edited_while_down_then_the_finished_child_deleted_runs_nothing(cluster: Cluster) -> None:
    async with running_operator(cluster):
        uid = await _succeeded(cluster, "w")
    # The operator is down: the spec is edited, then the finished child deleted (by hand, or its TTL).
    await cluster.patch_spec("w", EDIT)
    await cluster.delete_child("w")
    assert (cluster.job("w") or {}).get("metadata", {}).get("deletionTimestamp"), "held by its finalizer"
    async with running_operator(cluster):
        await wait_for(lambda: cluster.job("w") is None, what="the finished child released")
        await wait_for(
            lambda: _child_created(cluster, "w").get("reason") == "ChildDeleted", what="ChildDeleted"
        )
        await cluster.settle("w")
    status = cluster.status("w")
    assert cluster.creates("pytorchjobs") == 1, "no new child"
    assert status["phase"] == "Succeeded" and status["child"]["uid"] == uid
    assert "not re-created" in _child_created(cluster, "w")["message"]


async def test_edited_while_up_then_the_finished_child_deleted_runs_nothing(cluster: Cluster) -> None:
    async with running_operator(cluster):
        await _succeeded(cluster, "w")
        await cluster.patch_spec("w", EDIT)
        await wait_for(
            lambda: (cluster.condition("w", "SpecApplied") or {}).get("reason") == "JobFinished",
            what="the edit refused for a finished job",
        )
        await cluster.delete_child("w")
        await wait_for(
            lambda: _child_created(cluster, "w").get("reason") == "ChildDeleted", what="ChildDeleted"
        )
        await cluster.settle("w")
    assert cluster.creates("pytorchjobs") == 1 and cluster.job("w") is None
    assert cluster.status("w")["phase"] == "Succeeded"


async def test_an_edit_after_the_finished_child_is_gone_runs_the_new_spec(cluster: Cluster) -> None:
    async with running_operator(cluster):
        await _succeeded(cluster, "w")
        await cluster.delete_child("w")
        await wait_for(
            lambda: _child_created(cluster, "w").get("reason") == "ChildDeleted", what="ChildDeleted"
        )
        await cluster.settle("w")
        assert cluster.creates("pytorchjobs") == 1
        await cluster.patch_spec("w", EDIT)  # asking for more steps of a finished job: a new run
        await wait_for(lambda: cluster.job("w"), what="a new PyTorchJob for the edited spec")
        await cluster.settle("w")
    assert cluster.creates("pytorchjobs") == 2
