"""Capacity as the tenants see it (issue 36), on the emulated cluster with the real operator: a node whose
GPUs another workload's pods request is held, not free. Two elastic jobs on four nodes plan what is free
and say so in CapacityAvailable; a scale-up never deletes the running child for nodes another workload
holds, and grows once they are free (its own pods never count against it); with pods unreadable (the
chart's namespaced RBAC without operator.freeCapacity) the condition says so and counts allocatable."""

from __future__ import annotations

from typing import Any

import pytest

from blackwell_operator.applabels import MANAGED_BY_LABEL, MANAGER
from blackwell_operator.render.labels import JOB_NAME_LABEL
from tests.operator.harness import NAMESPACE, Cluster, running_operator, wait_for
from tests.operator.test_elastic import (
    TIMEOUT_S,
    elastic_btj,
    four_nodes,
    replicas,
    resized_events,
    set_health,
    started,
)

pytestmark = pytest.mark.integration
__all__ = ["four_nodes"]  # the fixture, shared with test_elastic.py

OTHER_TEAM = "hyperpod-ns-team-b"


def gpu_pod(name: str, node: int, *, namespace: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    """A pod the scheduler bound to node `node`, asking all 8 GPUs of a B200 node."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": {
            "nodeName": f"hyperpod-i-{node:03d}",
            "containers": [
                {"name": "main", "image": "busybox", "resources": {"requests": {"nvidia.com/gpu": "8"}}}
            ],
        },
    }


async def bind(cluster: Cluster, pod: dict[str, Any]) -> str:
    """Create the pod in its namespace and report it Running (the scheduler's and the kubelet's part)."""
    namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
    await cluster._json("POST", f"/api/v1/namespaces/{namespace}/pods", pod)
    await cluster._json(
        "PATCH",
        f"/api/v1/namespaces/{namespace}/pods/{name}/status",
        {"status": {"phase": "Running"}},
        "application/merge-patch+json",
    )
    return name


async def bind_workers(cluster: Cluster, btj: str, nodes: range) -> None:
    """The BTJ's child's workers on `nodes`, as the training operator and the scheduler place them."""
    job = cluster.job(btj) or {}
    owner = {
        "apiVersion": job["apiVersion"],
        "kind": job["kind"],
        "name": job["metadata"]["name"],
        "uid": job["metadata"]["uid"],
        "controller": True,
    }
    for index, node in enumerate(nodes):
        pod = gpu_pod(
            f"{btj}-worker-{index}",
            node,
            namespace=NAMESPACE,
            labels={JOB_NAME_LABEL: btj, MANAGED_BY_LABEL: MANAGER},
        )
        pod["metadata"]["ownerReferences"] = [owner]
        await bind(cluster, pod)


def capacity(cluster: Cluster, name: str) -> dict[str, Any]:
    return cluster.condition(name, "CapacityAvailable") or {}


async def test_two_elastic_jobs_on_four_nodes_plan_what_is_free_and_say_so(
    four_nodes: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: the second job also planned all 4 nodes (8 node requests for 4 nodes) and said
    CapacityAvailable=True, Sufficient, while its workers waited Pending."""
    monkeypatch.setenv("BTJ_CAPACITY_CACHE_S", "0")  # every pass reads the pods as they are now
    cluster = four_nodes
    async with running_operator(cluster):
        await cluster.apply(elastic_btj("first"))
        await started(cluster, "first", 4)
        first = capacity(cluster, "first")
        assert (first["status"], first["reason"]) == ("True", "Sufficient")
        await bind_workers(cluster, "first", range(4))

        await cluster.apply(elastic_btj("second"))
        await wait_for(lambda: capacity(cluster, "second"), timeout=TIMEOUT_S, what="CapacityAvailable")
        second = capacity(cluster, "second")
        assert (second["status"], second["reason"]) == ("False", "HeldByOtherWorkloads"), second
        assert second["message"].startswith(
            "4 of 4 ml.p6-b200.48xlarge nodes schedulable: 0 free, 4 held by other workloads; 2 needed. "
            "The job is created; its workers wait until other workloads free the nodes."
        )
        # Planned for the free nodes, at least minNodes: 2, never the 4 the first job holds.
        status = cluster.status("second")
        assert status["plan"]["nodes"] == 2
        assert "only 0 nodes free for this job, fewer than minNodes 2" in status["plan"]["elastic"]["reason"]
        await wait_for(lambda: replicas(cluster, "second") == 2, timeout=TIMEOUT_S, what="its child")
        assert replicas(cluster, "first") == 4  # 6 node requests for 4 nodes, the second one's said waiting
        # Nothing of the first job (its name, its pods) is named in the second one's status.
        assert "first" not in second["message"] and "-worker-" not in second["message"]
        assert first["message"] == (
            "4 of 4 ml.p6-b200.48xlarge nodes schedulable: 4 free, 0 held by other workloads; 4 needed."
        )


async def test_a_scale_up_never_deletes_the_running_child_for_nodes_another_workload_holds(
    four_nodes: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: the fourth node back in HyperPod's Schedulable state grew the job to 4 (its child deleted
    and re-created) although another team's pod held that node's GPUs: the new child waited Pending."""
    monkeypatch.setenv("BTJ_CAPACITY_CACHE_S", "0")
    cluster = four_nodes
    await set_health(cluster, 3, "Unschedulable")
    async with running_operator(cluster):
        await cluster.apply(elastic_btj("grow", scale_up=True))
        await started(cluster, "grow", 3)
        child_uid = (cluster.job("grow") or {})["metadata"]["uid"]
        await bind_workers(cluster, "grow", range(3))
        other = await bind(cluster, gpu_pod("their-job", 3, namespace=OTHER_TEAM))
        await set_health(cluster, 3, "Schedulable")

        def waiting() -> str:
            return str((cluster.status("grow").get("elastic") or {}).get("waiting") or "")

        await wait_for(
            lambda: "held by other workloads" in waiting() or replicas(cluster, "grow") != 3,
            timeout=TIMEOUT_S,
            what="the growth held, or the child deleted",
        )
        assert resized_events(cluster, "grow") == [] and not cluster.status("grow").get("planHistory")
        assert (cluster.job("grow") or {})["metadata"]["uid"] == child_uid and replicas(cluster, "grow") == 3
        assert waiting() == (
            "4 nodes schedulable for the whole grace period of 1 s, 3 of them free (1 held by other "
            "workloads): the job grows when other workloads free nodes"
        )
        assert OTHER_TEAM not in waiting() and "their-job" not in waiting()

        # The other team's pod finishes: the node is free, and the job's own three pods never counted
        # against it, so it grows to 4.
        await cluster._json(
            "PATCH",
            f"/api/v1/namespaces/{OTHER_TEAM}/pods/{other}/status",
            {"status": {"phase": "Succeeded"}},
            "application/merge-patch+json",
        )
        await wait_for(lambda: replicas(cluster, "grow") == 4, timeout=TIMEOUT_S, what="the child on 4 nodes")
        history = cluster.status("grow")["planHistory"]
        assert [(e["nodesBefore"], e["nodesAfter"]) for e in history] == [(3, 4)]


async def test_pods_unreadable_say_so_and_hold_a_scale_up(
    four_nodes: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chart's namespaced RBAC without operator.freeCapacity: listing pods in every namespace is
    refused. CapacityAvailable counts allocatable and says why, naming the chart value; a scale-up waits
    rather than delete the child for nodes it cannot see are free."""
    monkeypatch.setenv("BTJ_CAPACITY_CACHE_S", "0")
    cluster = four_nodes
    # The operator's list of every namespace's pods on nodes (the harness runs Kopf with --all-namespaces,
    # whose own pod watch is not the call namespaced RBAC would refuse here).
    cluster.k.inject_fault(
        "GET",
        "pods",
        403,
        times=10**6,
        watch=False,
        when=lambda request: request.namespace is None and "fieldSelector" in request.params,
    )
    await set_health(cluster, 3, "Unschedulable")
    async with running_operator(cluster):
        await cluster.apply(elastic_btj("blind", scale_up=True))
        await started(cluster, "blind", 3)
        condition = capacity(cluster, "blind")
        assert (condition["status"], condition["reason"]) == ("True", "SufficientAllocatable"), condition
        assert condition["message"] == (
            "3 of 4 ml.p6-b200.48xlarge nodes schedulable; free GPUs not read (pods could not be listed in "
            "every namespace: HTTP 403 Forbidden; the chart's operator.freeCapacity=true grants it): "
            "other workloads' pods are not counted; 3 needed."
        )
        await set_health(cluster, 3, "Schedulable")
        await wait_for(
            lambda: "not grown: free GPUs not read" in str(cluster.status("blind").get("elastic") or {}),
            timeout=TIMEOUT_S,
            what="the growth held",
        )
        assert replicas(cluster, "blind") == 3 and resized_events(cluster, "blind") == []


async def test_a_queued_elastic_job_leaves_admission_to_kueue_and_is_never_grown(
    four_nodes: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """spec.queueName: Kueue admits by its ClusterQueue's quota, which free nodes do not show. Enough free
    nodes are not claimed as the job's, and the loop never deletes the admitted child to grow it (the larger
    one would wait for admission with nothing running). Before: True, Sufficient, and grown to 4."""
    monkeypatch.setenv("BTJ_CAPACITY_CACHE_S", "0")
    cluster = four_nodes
    await set_health(cluster, 3, "Unschedulable")
    async with running_operator(cluster):
        body = elastic_btj("queued", scale_up=True)
        body["spec"]["queueName"] = "team-a-queue"
        await cluster.apply(body)
        await started(cluster, "queued", 3)
        condition = capacity(cluster, "queued")
        assert (condition["status"], condition["reason"]) == ("Unknown", "KueueAdmits"), condition
        assert "team-a-queue" not in condition["message"]  # the field is named, not its value
        await set_health(cluster, 3, "Schedulable")
        await wait_for(
            lambda: (
                "not grown: spec.queueName is set" in str(cluster.status("queued").get("elastic") or {})
                or replicas(cluster, "queued") != 3
            ),
            timeout=TIMEOUT_S,
            what="the growth held, or the child deleted",
        )
        assert replicas(cluster, "queued") == 3 and resized_events(cluster, "queued") == []
