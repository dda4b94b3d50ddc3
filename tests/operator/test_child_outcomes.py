"""Child decisions the real operator applies that other files leave out: a child found without the
final-status finalizer, and a spec change after the job finished (KopfRunner + KMock)."""

from __future__ import annotations

from typing import Any

import pytest

from blackwell_operator.handlers.finalizer import FINAL_STATUS_FINALIZER
from tests.operator.harness import PYTORCHJOBS, Cluster, btj, from_operator, running_operator, wait_for

pytestmark = pytest.mark.integration

SUCCEEDED = {
    "conditions": [
        {"type": "Succeeded", "status": "True", "reason": "PyTorchJobSucceeded", "message": "done"}
    ]
}


def held(cluster: Cluster, name: str) -> bool:
    return FINAL_STATUS_FINALIZER in ((cluster.job(name) or {}).get("metadata", {}).get("finalizers") or [])


def operator_patches(cluster: Cluster, plural: str) -> list[Any]:
    return [
        r
        for r in cluster.k.requests
        if r.method.value == "PATCH"
        and r.resource is not None
        and r.resource.plural == plural
        and from_operator(r)
    ]


async def test_a_child_without_the_final_status_finalizer_gets_it_and_nothing_else(cluster: Cluster) -> None:
    async with running_operator(cluster):
        await cluster.apply(btj("legacy"))
        await wait_for(lambda: cluster.condition("legacy", "SpecApplied"), what="SpecApplied")
    # As an operator version without the finalizer (or a hand) left it: the same render, no finalizer.
    await cluster._json(
        "PATCH", f"{PYTORCHJOBS}/legacy", {"metadata": {"finalizers": []}}, "application/merge-patch+json"
    )
    before = cluster.job("legacy")
    assert before is not None and not held(cluster, "legacy")
    patches = len(operator_patches(cluster, "pytorchjobs"))

    async with running_operator(cluster):  # the resumed reconcile finds it
        await wait_for(lambda: held(cluster, "legacy"), what="the finalizer added back")
        await cluster.settle("legacy")

    after = cluster.job("legacy")
    assert after is not None
    assert after["metadata"]["uid"] == before["metadata"]["uid"], "the same child, not a new one"
    assert after["metadata"]["finalizers"] == [FINAL_STATUS_FINALIZER]
    assert after["spec"] == before["spec"]
    assert len(operator_patches(cluster, "pytorchjobs")) == patches + 1, "one patch: the finalizer"
    assert cluster.creates("pytorchjobs") == 1
    assert cluster.condition("legacy", "ChildCreated")["reason"] == "Exists"  # type: ignore[index]
    assert cluster.condition("legacy", "SpecApplied")["reason"] == "Applied"  # type: ignore[index]


async def test_a_spec_change_after_the_job_finished_is_reported_not_applied(cluster: Cluster) -> None:
    async with running_operator(cluster):
        await cluster.apply(btj("finished"))
        await wait_for(lambda: cluster.condition("finished", "ChildCreated"), what="ChildCreated")
        await cluster.set_child_status("finished", SUCCEEDED)
        await wait_for(lambda: cluster.status("finished").get("phase") == "Succeeded", what="phase Succeeded")
        plan_before = cluster.status("finished")["plan"]
        job_before = cluster.job("finished")
        await cluster.patch_spec("finished", {"cluster": {"instanceType": "ml.p6-b200.48xlarge", "nodes": 4}})
        await wait_for(lambda: cluster.status("finished").get("observedGeneration") == 2, what="generation 2")
        await wait_for(
            lambda: any(e["reason"] == "JobFinished" for e in cluster.events("finished")),
            what="a JobFinished Event",
        )
        await cluster.settle("finished")

    applied = cluster.condition("finished", "SpecApplied")
    assert applied is not None and applied["status"] == "False" and applied["reason"] == "JobFinished"
    assert applied["message"].startswith(
        "PyTorchJob finished is Succeeded; its shape cannot change in place."
    )
    assert [e["type"] for e in cluster.events("finished") if e["reason"] == "JobFinished"] == ["Warning"]
    job = cluster.job("finished")
    assert job is not None and job_before is not None
    assert job["metadata"]["uid"] == job_before["metadata"]["uid"] and job["spec"] == job_before["spec"]
    assert cluster.status("finished")["plan"] == plan_before, "status.plan still describes what ran"
    assert cluster.status("finished")["phase"] == "Succeeded"
    assert cluster.creates("pytorchjobs") == 1
