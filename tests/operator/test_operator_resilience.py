"""The operator under bad input, API faults, restarts and scarce capacity (KopfRunner + hardened KMock)."""

from __future__ import annotations

import pytest

from blackwell_operator.testing.emulator import PYTORCHJOB_RESOURCE
from tests.operator.harness import (
    NAMESPACE,
    PYTORCHJOBS,
    Cluster,
    btj,
    emulated_cluster,
    from_operator,
    node,
    running_operator,
    wait_for,
    write_kubeconfig,
)

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    ("spec", "reason", "field"),
    [
        ({"model": {"preset": "gpt-7"}}, "InvalidSpec", "spec.model.preset"),
        (
            {"cluster": {"instanceType": "ml.p6-b200.48xlarge", "nodes": 0}},
            "InvalidSpec",
            "spec.cluster.nodes",
        ),
        (
            {"cluster": {"instanceType": "ml.p5.48xlarge", "nodes": 1}, "tuning": {"precision": "mxfp8"}},
            "NoFeasiblePlan",
            "spec.tuning.precision",
        ),
    ],
    ids=["unknown-preset", "schema-violation", "impossible-pin"],
)
async def test_invalid_spec_is_reported_and_others_are_still_served(
    cluster: Cluster, spec: dict[str, object], reason: str, field: str
) -> None:
    async with running_operator(cluster) as runner:
        await cluster.apply(btj("bad", **spec))
        await cluster.apply(btj("good"))
        await wait_for(lambda: cluster.status("bad").get("phase") == "Invalid", what="phase Invalid")
        await wait_for(lambda: cluster.job("good"), what="the good BTJ's child")
        await wait_for(
            lambda: any(e["reason"] == reason for e in cluster.events("bad")), what="a Warning Event"
        )
    assert runner.exception is None
    planned = cluster.condition("bad", "Planned")
    assert planned["status"] == "False" and planned["reason"] == reason
    assert planned["message"].startswith(field) and "Fix:" in planned["message"]
    assert cluster.status("bad")["observedGeneration"] == 1
    (event,) = [e for e in cluster.events("bad") if e["reason"] == reason]
    assert event["type"] == "Warning" and event["message"] == planned["message"]
    assert cluster.job("bad") is None and cluster.config_map("bad-plan") is None, "no half-made child"


async def test_a_dry_run_turned_invalid_drops_its_plan(cluster: Cluster) -> None:
    async with running_operator(cluster):
        await cluster.apply(btj("flip", dryRun=True))
        await wait_for(lambda: cluster.status("flip").get("phase") == "Planned", what="phase Planned")
        await cluster.patch_spec(
            "flip",
            {"tuning": {"precision": "mxfp8"}, "cluster": {"instanceType": "ml.p5.48xlarge", "nodes": 1}},
        )
        await wait_for(lambda: cluster.status("flip").get("phase") == "Invalid", what="phase Invalid")
    status = cluster.status("flip")
    assert "plan" not in status and "precision" not in status and status["observedGeneration"] == 2


async def test_fixing_an_invalid_spec_creates_the_child(cluster: Cluster) -> None:
    async with running_operator(cluster):
        await cluster.apply(btj("fixme", model={"preset": "gpt-7"}))
        await wait_for(lambda: cluster.status("fixme").get("phase") == "Invalid", what="phase Invalid")
        await cluster.patch_spec("fixme", {"model": {"preset": "llama3.2-1b"}})
        await wait_for(lambda: cluster.status("fixme").get("phase") == "Pending", what="phase Pending")
    assert cluster.condition("fixme", "Planned")["status"] == "True"
    assert cluster.job("fixme") is not None


async def test_transient_api_errors_are_retried_without_duplicates(cluster: Cluster) -> None:
    # The job create fails after the ConfigMap exists (a half-made child the retry completes), then a
    # create "times out" after the server applied it (the retry finds its own job: 409 -> get -> adopt).
    cluster.k.inject_fault("post", "pytorchjobs", 500)
    cluster.k.inject_fault("post", "pytorchjobs", 504, commit=True)
    cluster.k.inject_fault("patch", "blackwelltrainingjobs", 409, subresource="status")
    async with running_operator(cluster) as runner:
        await cluster.apply(btj("flaky"))
        await wait_for(
            lambda: cluster.condition("flaky", "ChildCreated"),
            what="ChildCreated",
            timeout=20,
        )
    assert runner.exception is None
    assert all(f.times == 0 for f in cluster.k.faults), "every fault was hit"
    # Two POSTs: the failed one, and the applied one whose answer was lost; the third pass GETs its job.
    assert cluster.creates("pytorchjobs") == 2
    assert len(cluster.k.live_objects(PYTORCHJOB_RESOURCE, NAMESPACE)) == 1
    assert cluster.status("flaky")["child"]["uid"] == cluster.job("flaky")["metadata"]["uid"]
    assert cluster.condition("flaky", "ChildCreated")["reason"] == "Exists"


async def test_restart_finds_the_existing_child_and_creates_no_duplicate(cluster: Cluster) -> None:
    async with running_operator(cluster):
        await cluster.apply(btj("survivor"))
        await wait_for(lambda: cluster.status("survivor").get("phase") == "Pending", what="phase Pending")
    async with running_operator(cluster):  # a new operator process resumes every BTJ
        await cluster.set_child_status(
            "survivor",
            {
                "conditions": [
                    {"type": "Running", "status": "True", "reason": "PyTorchJobRunning", "message": "running"}
                ]
            },
        )
        await wait_for(lambda: cluster.status("survivor").get("phase") == "Running", what="phase Running")
    assert cluster.creates("pytorchjobs") == 1 and cluster.creates("configmaps") == 1
    # Deterministic rendering: resuming re-renders byte-identical children, so nothing is patched.
    assert not [
        r
        for r in cluster.k.requests
        if r.method.value == "PATCH"
        and r.resource is not None
        and r.resource.plural in ("pytorchjobs", "configmaps")
        and from_operator(r)
    ]


async def test_child_status_survives_api_errors_while_mirroring(cluster: Cluster) -> None:
    async with running_operator(cluster):
        await cluster.apply(btj("bumpy"))
        await wait_for(lambda: cluster.status("bumpy").get("phase") == "Pending", what="phase Pending")
        cluster.k.inject_fault("patch", "blackwelltrainingjobs", 503, times=2, subresource="status")
        await cluster.set_child_status(
            "bumpy",
            {
                "conditions": [
                    {"type": "Running", "status": "True", "reason": "PyTorchJobRunning", "message": "running"}
                ]
            },
        )
        await wait_for(lambda: cluster.status("bumpy").get("phase") == "Running", what="phase Running")
    assert all(f.times == 0 for f in cluster.k.faults)


async def test_child_made_before_a_crash_is_adopted_not_duplicated(cluster: Cluster) -> None:
    # An operator created the child, then died before recording anything: the BTJ has no status.
    created = await cluster.apply(btj("orphan"))
    owner = {
        "apiVersion": "training.blackwell.dev/v1alpha1",
        "kind": "BlackwellTrainingJob",
        "name": "orphan",
        "uid": created["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
    await cluster._json(
        "POST",
        PYTORCHJOBS,
        {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "metadata": {
                "name": "orphan",
                "labels": {"app.kubernetes.io/managed-by": "blackwell-operator"},
                "ownerReferences": [owner],
            },
            "spec": {},
        },
    )
    async with running_operator(cluster):
        await wait_for(lambda: cluster.condition("orphan", "ChildCreated"), what="ChildCreated")
    assert cluster.creates("pytorchjobs") == 1, "only the test's own create"
    assert cluster.condition("orphan", "ChildCreated")["reason"] == "Exists"


async def test_a_foreign_object_with_the_child_name_is_not_taken_over(cluster: Cluster) -> None:
    await cluster._json(
        "POST",
        PYTORCHJOBS,
        {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "taken"}, "spec": {}},
    )
    async with running_operator(cluster):
        await cluster.apply(btj("taken"))
        await wait_for(lambda: cluster.condition("taken", "ChildCreated"), what="ChildCreated")
    condition = cluster.condition("taken", "ChildCreated")
    assert condition["status"] == "False" and condition["reason"] == "ChildNameConflict"
    assert "Fix:" in condition["message"]
    assert cluster.job("taken")["spec"] == {}, "the foreign job is untouched"


async def test_scarce_capacity_is_reported_and_the_job_still_queues(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with emulated_cluster(nodes=8, unhealthy=6) as cluster:
        await cluster.add_node(node("p5-node", instance_type="ml.p5.48xlarge"))
        monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kubeconfig", cluster.url)))  # type: ignore[operator]
        monkeypatch.setenv("BTJ_METRICS_BIND", "off")
        async with running_operator(cluster):
            await cluster.apply(btj("big", cluster={"instanceType": "ml.p6-b200.48xlarge", "nodes": 4}))
            await wait_for(lambda: cluster.condition("big", "ChildCreated"), what="ChildCreated")
        capacity = cluster.condition("big", "CapacityAvailable")
        assert capacity["status"] == "False" and capacity["reason"] == "InsufficientNodes"
        assert capacity["message"].startswith(
            "2 of 8 ml.p6-b200.48xlarge nodes schedulable: 2 free, 0 held by other workloads; 4 needed"
        )
        assert cluster.job("big") is not None, "the job is created and waits in the queue"


async def test_nodes_without_room_for_a_trainer_pod_are_reported(cluster: Cluster) -> None:
    # The cluster's two nodes and two more, one of which publishes no EFA devices (its device plugin is not
    # running): the fourth worker would stay Pending with no other sign, so the BTJ says why up front.
    for name, efa in (("ok", "32"), ("no-efa", "0")):
        await cluster.add_node(node(name))
        allocatable = {
            "nvidia.com/gpu": "8",
            "vpc.amazonaws.com/efa": efa,
            "hugepages-2Mi": "5120Mi",
            "ephemeral-storage": "27000Gi",  # every kubelet publishes its disk; room for the pod's /local
        }
        await cluster.set_node_status(name, {"allocatable": {**allocatable, "memory": "2000Gi"}})
    async with running_operator(cluster):
        await cluster.apply(btj("pair", cluster={"instanceType": "ml.p6-b200.48xlarge", "nodes": 4}))
        await wait_for(lambda: cluster.condition("pair", "ChildCreated"), what="ChildCreated")
    capacity = cluster.condition("pair", "CapacityAvailable")
    assert capacity["status"] == "False" and capacity["reason"] == "InsufficientAllocatable", capacity
    message = capacity["message"]
    assert "3 of them with room for a trainer pod" in message
    assert "vpc.amazonaws.com/efa: 0 allocatable" in message
    assert cluster.job("pair") is not None, "advisory: the job is still created"
