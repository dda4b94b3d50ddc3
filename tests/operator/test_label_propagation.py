"""A label-only edit of a BTJ reaches its children at once, whatever the job's phase: the real operator under
KopfRunner against KMock. A label added, changed or removed on the BTJ is on the job and its plan ConfigMap
within the wait, with no other pass; a label another controller put on the job stays; the job's spec and
render are untouched (no in-place update, no RunningJobImmutable or JobFinished); a finished job's child
takes them too, and a finished job whose child is gone is not made again for a label."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from blackwell_operator.render.labels import RENDER_HASH_ANNOTATION
from blackwell_operator.render.pod import plan_config_map_name
from tests.operator.harness import PYTORCHJOBS, Cluster, btj, running_operator, wait_for
from tests.support.pods import job_condition

pytestmark = pytest.mark.integration

RUNNING = {"conditions": [job_condition("Created"), job_condition("Running")]}
SUCCEEDED = {
    "conditions": [job_condition("Created"), job_condition("Running", "False"), job_condition("Succeeded")]
}
# The default manifest's labels are {team: a, app.kubernetes.io/instance: argo-app} (Argo CD's, not copied).
EDIT = {"team": "b", "cost-center": "ml-7"}  # one changed, one added
REMOVAL: dict[str, str | None] = {"team": None}


def labels_of(obj: Mapping[str, Any] | None) -> dict[str, str]:
    return dict(((obj or {}).get("metadata") or {}).get("labels") or {})


def carry(cluster: Cluster, name: str, wanted: Mapping[str, str], gone: tuple[str, ...] = ()) -> bool:
    """Whether the job and its plan ConfigMap both carry `wanted` and none of `gone`."""
    objects = (cluster.job(name), cluster.config_map(plan_config_map_name(name)))
    return all(
        obj is not None and labels_of(obj).items() >= wanted.items() and not set(gone) & set(labels_of(obj))
        for obj in objects
    )


def warnings(cluster: Cluster, name: str) -> list[str]:
    return [str(e.get("reason")) for e in cluster.events(name) if e.get("type") == "Warning"]


async def edited_in_phase(cluster: Cluster, name: str, status: Mapping[str, Any] | None) -> dict[str, Any]:
    """Apply BTJ `name`, report its job `status` (None: not started), then edit, then remove a label; the
    job as it was before the edits."""
    await cluster.apply(btj(name))
    await wait_for(lambda: cluster.condition(name, "ChildCreated"), what="ChildCreated")
    if status is not None:
        await cluster.set_child_status(name, status)
    await cluster.settle(name)
    before = cluster.job(name)
    assert before is not None and labels_of(before)["team"] == "a"
    assert "app.kubernetes.io/instance" not in labels_of(before)
    await cluster.patch_labels(name, EDIT)
    await wait_for(lambda: carry(cluster, name, EDIT), what="the edited labels on the job and the ConfigMap")
    await cluster.patch_labels(name, REMOVAL)
    await wait_for(
        lambda: carry(cluster, name, {"cost-center": "ml-7"}, gone=("team",)), what="the label removed"
    )
    await cluster.settle(name)
    return before


@pytest.mark.parametrize(
    ("phase", "status"), [("Pending", None), ("Running", RUNNING), ("Succeeded", SUCCEEDED)]
)
async def test_a_label_edit_reaches_the_job_in_every_phase_and_changes_nothing_else(
    cluster: Cluster, phase: str, status: Mapping[str, Any] | None
) -> None:
    async with running_operator(cluster):
        before = await edited_in_phase(cluster, "l", status)
    after = cluster.job("l")
    assert after is not None
    # Only metadata changed: the pods' template, the render hash and the job's status are as they were.
    assert after["spec"] == before["spec"]
    hashes = (before["metadata"]["annotations"], after["metadata"]["annotations"])
    assert hashes[0][RENDER_HASH_ANNOTATION] == hashes[1][RENDER_HASH_ANNOTATION]
    assert cluster.condition("l", "SpecApplied")["status"] == "True"  # type: ignore[index]
    assert cluster.status("l")["phase"] == phase
    assert warnings(cluster, "l") == []
    assert not [e for e in cluster.events("l") if e.get("reason") == "Updated"]
    assert cluster.creates("pytorchjobs") == 1


async def test_a_label_another_controller_added_stays_and_an_edit_while_down_arrives_at_start(
    cluster: Cluster,
) -> None:
    async with running_operator(cluster):
        await cluster.apply(btj("d"))
        await wait_for(lambda: cluster.condition("d", "ChildCreated"), what="ChildCreated")
        await cluster.set_child_status("d", RUNNING)
        await cluster.settle("d")
    # Another controller labels the job; the BTJ's labels change while the operator is down.
    await cluster._json(
        "PATCH", f"{PYTORCHJOBS}/d", {"metadata": {"labels": {"theirs": "x"}}}, "application/merge-patch+json"
    )
    await cluster.patch_labels("d", {"team": None, "cost-center": "ml-7"})
    async with running_operator(cluster):
        await wait_for(
            lambda: carry(cluster, "d", {"cost-center": "ml-7"}, gone=("team",)),
            what="the labels edited while the operator was down",
        )
    assert labels_of(cluster.job("d"))["theirs"] == "x"
    assert warnings(cluster, "d") == []


async def test_a_finished_job_whose_child_is_gone_is_not_made_again_for_a_label(cluster: Cluster) -> None:
    async with running_operator(cluster):
        await cluster.apply(btj("g"))
        await wait_for(lambda: cluster.job("g"), what="the PyTorchJob")
        await cluster.set_child_status("g", SUCCEEDED)
        await wait_for(lambda: cluster.status("g").get("phase") == "Succeeded", what="Succeeded")
        await cluster.delete_child("g")
        await wait_for(
            lambda: (cluster.condition("g", "ChildCreated") or {}).get("reason") == "ChildDeleted",
            what="the deletion recorded",
        )
        await wait_for(lambda: cluster.job("g") is None, what="the child gone")
        await cluster.patch_labels("g", EDIT)
        await cluster.settle("g")
    assert cluster.job("g") is None and cluster.creates("pytorchjobs") == 1
    assert cluster.config_map(plan_config_map_name("g")) is None
    assert cluster.status("g")["phase"] == "Succeeded"
