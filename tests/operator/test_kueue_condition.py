"""KueueManaged: a BTJ naming a queue on a backend current Kueue does not manage by default is told so."""

from __future__ import annotations

from typing import Any

import pytest

from blackwell_operator.lifecycle.conditions import find_condition
from blackwell_operator.lifecycle.kueue import kueue_condition
from blackwell_operator.lifecycle.phase import child_conditions
from blackwell_operator.testing.emulator import HYPERPOD_RESOURCE, TRAINJOB_RESOURCE
from tests.operator.harness import HYPERPODJOBS, TRAINJOBS, Cluster, btj, running_operator, wait_for

QUEUE = "hyperpod-ns-team-a-localqueue"


def cond(type_: str, status: str = "True") -> dict[str, str]:
    return {"type": type_, "status": status, "reason": type_, "message": ""}


@pytest.mark.parametrize(
    ("kind", "child_status", "expected"),
    [
        # Before the child shows anything: what current Kueue manages by default.
        ("PyTorchJob", None, ("Unknown", "IntegrationOffByDefault")),
        ("HyperPodPyTorchJob", None, ("Unknown", "IntegrationOffByDefault")),
        ("TrainJob", None, ("True", "ManagedByDefault")),
        # Kueue suspends what it manages: a Suspended condition, True or False (resumed), settles it.
        ("PyTorchJob", {"conditions": [cond("Suspended")]}, ("True", "SuspendedByKueue")),
        (
            "PyTorchJob",
            {"conditions": [cond("Suspended", "False"), cond("Running")]},
            ("True", "SuspendedByKueue"),
        ),
        ("TrainJob", {"conditions": [cond("Suspended", "False")]}, ("True", "SuspendedByKueue")),
        # Started without ever being suspended: not queued.
        ("PyTorchJob", {"conditions": [cond("Created"), cond("Running")]}, ("False", "NotQueued")),
        ("HyperPodPyTorchJob", {"conditions": [cond("Completed")]}, ("False", "NotQueued")),
        ("TrainJob", {"jobsStatus": [{"name": "node", "ready": 1}]}, ("False", "NotQueued")),
    ],
)
def test_the_condition_per_backend(
    kind: str, child_status: dict[str, Any] | None, expected: tuple[str, str]
) -> None:
    managed = kueue_condition(kind, QUEUE, child_status)
    status, reason, message = managed.status, managed.reason, managed.message
    assert (status, reason) == expected
    assert QUEUE in message
    if status != "True":
        assert "Fix:" in message and "TrainJob" in message


def test_the_pytorchjob_message_says_why_and_what_to_do() -> None:
    message = kueue_condition("PyTorchJob", QUEUE, None).message
    assert "Kueue v0.19 and later do not manage PyTorchJob" in message
    assert "kubernetes-sigs/kueue#12620" in message
    assert "spec.backend to TrainJob" in message and "kubeflow.org/pytorchjob" in message


def test_no_queue_no_condition_and_a_removed_queue_removes_it() -> None:
    _, conds = child_conditions([], None, generation=1, now="2026-12-01T00:00:00Z", child_kind="PyTorchJob")
    assert find_condition(conds, "KueueManaged") is None
    _, queued = child_conditions(
        [], None, generation=1, now="2026-12-01T00:00:00Z", queue_name=QUEUE, child_kind="PyTorchJob"
    )
    managed = find_condition(queued, "KueueManaged")
    assert managed is not None and managed.status == "Unknown"
    _, dropped = child_conditions(
        queued, None, generation=2, now="2026-12-01T00:00:00Z", child_kind="PyTorchJob"
    )
    assert find_condition(dropped, "KueueManaged") is None


@pytest.mark.integration
async def test_a_pytorchjob_kueue_does_not_queue_is_reported(cluster: Cluster) -> None:
    async with running_operator(cluster):
        await cluster.apply(btj("unqueued", queueName=QUEUE))
        await wait_for(lambda: cluster.condition("unqueued", "KueueManaged"), what="KueueManaged")
        assert cluster.condition("unqueued", "KueueManaged")["reason"] == "IntegrationOffByDefault"
        # The training operator starts it at once: no Kueue on this job.
        await cluster.set_child_status("unqueued", {"conditions": [cond("Created"), cond("Running")]})
        await wait_for(
            lambda: cluster.condition("unqueued", "KueueManaged")["status"] == "False", what="NotQueued"
        )
        await cluster.apply(btj("queued", queueName=QUEUE))
        await wait_for(lambda: cluster.job("queued"), what="the PyTorchJob")
        await cluster.set_child_status("queued", {"conditions": [cond("Suspended")]})
        await wait_for(
            lambda: cluster.condition("queued", "KueueManaged")["reason"] == "SuspendedByKueue", what="True"
        )
        await cluster.apply(btj("free"))
        await wait_for(lambda: cluster.condition("free", "ChildCreated"), what="ChildCreated")
        await cluster.settle("free")
    not_queued = cluster.condition("unqueued", "KueueManaged")
    assert (
        not_queued["reason"] == "NotQueued" and "Fix: set spec.backend to TrainJob" in not_queued["message"]
    )
    assert cluster.condition("free", "KueueManaged") is None


@pytest.mark.integration
@pytest.mark.parametrize(
    ("backend", "resource", "collection", "expected"),
    [
        ("TrainJob", TRAINJOB_RESOURCE, TRAINJOBS, ("True", "ManagedByDefault")),
        ("HyperPodPyTorchJob", HYPERPOD_RESOURCE, HYPERPODJOBS, ("Unknown", "IntegrationOffByDefault")),
    ],
)
async def test_the_other_backends_at_creation(
    cluster: Cluster, backend: str, resource: str, collection: str, expected: tuple[str, str]
) -> None:
    async with running_operator(cluster):
        await cluster.apply(btj("q", backend=backend, queueName=QUEUE))
        await wait_for(lambda: cluster.job("q", resource), what=f"the {backend}")
        await wait_for(lambda: cluster.condition("q", "KueueManaged"), what="KueueManaged")
        await cluster.settle("q")
    kueue = cluster.condition("q", "KueueManaged")
    assert (kueue["status"], kueue["reason"]) == expected
