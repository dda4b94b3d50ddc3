"""Unit tests (pure): the free GPUs of a node are its allocatable minus what unfinished pods bound there
request, a job's own pods apart; CapacityAvailable's wording for held nodes, unread pods and a Kueue queue;
the reader lists pods once per TTL and keeps nothing of them but their node, namespace, job and GPUs."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from blackwell_operator.discovery.capacity import (
    BoundPod,
    Capacity,
    NodeCapacityReader,
    NodeHold,
    Unreadable,
    bound_pods,
    count_capacity,
    holds,
    pod_gpus,
)
from blackwell_operator.lifecycle.capacity import capacity_condition
from blackwell_operator.testing.cluster import allocatable
from tests.operator.harness import node

B200 = "ml.p6-b200.48xlarge"
JOB = "training.blackwell.dev/job-name"


def pod(
    node_name: str | None,
    gpus: str | None = "8",
    *,
    phase: str = "Running",
    namespace: str = "team-a",
    job: str | None = None,
    limits_only: bool = False,
    init_gpus: str | None = None,
) -> dict[str, Any]:
    resources = {("limits" if limits_only else "requests"): {"nvidia.com/gpu": gpus}} if gpus else {}
    spec: dict[str, Any] = {"containers": [{"name": "c", "resources": resources}, {"name": "sidecar"}]}
    if node_name:
        spec["nodeName"] = node_name
    if init_gpus:
        spec["initContainers"] = [{"name": "i", "resources": {"requests": {"nvidia.com/gpu": init_gpus}}}]
    labels = {JOB: job} if job else {}
    return {
        "metadata": {"name": "p", "namespace": namespace, "labels": labels, "annotations": {"secret": "x"}},
        "spec": spec,
        "status": {"phase": phase},
    }


def with_gpus(name: str, gpus: str | None) -> dict[str, Any]:
    body = node(name)
    if gpus is not None:
        body["status"] = {"allocatable": {**allocatable(B200), "nvidia.com/gpu": gpus}}
    return body


def test_a_pods_gpus_are_its_containers_requests_or_limits_or_its_largest_init_container() -> None:
    assert pod_gpus(pod("n", "8")) == 8
    assert pod_gpus(pod("n", "4", limits_only=True)) == 4  # an extended resource's request is its limit
    assert pod_gpus(pod("n", None)) == 0
    assert pod_gpus(pod("n", "2", init_gpus="6")) == 6
    assert pod_gpus(pod("n", "odd-quantity")) == 0  # not held against the node (advisory)


def test_only_unfinished_pods_bound_to_a_node_hold_gpus_and_only_four_facts_are_kept() -> None:
    pods = [
        pod("a", job="mine"),
        pod("a", phase="Succeeded"),
        pod("b", phase="Failed"),
        pod(None, phase="Pending"),  # not scheduled yet: holds no node
        pod("c", None),  # no GPUs: nothing to keep
        pod("d", "4", phase="Pending", namespace="team-b"),  # bound, its containers starting
    ]
    assert bound_pods(pods, JOB) == [
        BoundPod("a", "team-a", "mine", Decimal(8)),
        BoundPod("d", "team-b", "", Decimal(4)),
    ]


def test_a_jobs_own_pods_never_count_as_held_by_others() -> None:
    kept = [
        BoundPod("a", "team-a", "mine", Decimal(8)),
        BoundPod("b", "team-a", "theirs", Decimal(8)),  # same namespace, another job
        BoundPod("c", "team-b", "mine", Decimal(4)),  # same job name, another namespace
        BoundPod("c", "team-b", "", Decimal(2)),
    ]
    assert holds(kept, ("team-a", "mine")) == {
        "a": NodeHold(own=Decimal(8)),
        "b": NodeHold(others=Decimal(8)),
        "c": NodeHold(others=Decimal(6)),
    }
    assert holds(kept, None)["a"] == NodeHold(others=Decimal(8))


def test_free_nodes_are_allocatable_minus_what_other_workloads_request() -> None:
    nodes = [with_gpus(n, "8") for n in "abcd"] + [with_gpus("e", None), with_gpus("f", "4")]
    held = {
        "a": NodeHold(own=Decimal(8)),  # its own worker: free for it
        "b": NodeHold(others=Decimal(8)),  # another team's: held
        "c": NodeHold(others=Decimal(4)),  # half taken: a pod of 4 GPUs fits, one of 8 does not
        "e": NodeHold(others=Decimal(1)),  # no GPU count published: taken to be one trainer pod's
    }
    eight = count_capacity(nodes, B200, held=held, gpus=8)
    # a and d free; b, c and e held; f too small for a pod of 8 whoever runs there: not held by others.
    assert (eight.schedulable, eight.free, eight.held, eight.own) == (6, 2, 3, 1)
    assert eight.describe() == (
        "6 of 6 ml.p6-b200.48xlarge nodes schedulable: 2 free (1 running its own pods), 3 held by other "
        "workloads"
    )
    four = count_capacity(nodes, B200, {"nvidia.com/gpu": 4}, held=held)
    assert (four.free, four.held) == (4, 2)  # a, c, d, f free, b and e held: the requests' GPUs win
    assert capacity_condition(four, 4).reason == "Sufficient" and eight.placeable() == 2
    assert capacity_condition(eight, 3).reason == "HeldByOtherWorkloads"
    # Pods not read: the schedulable nodes count, and the description says why.
    blind = count_capacity(nodes, B200, gpus=8, unread="pods could not be listed")
    assert blind.free is None and blind.placeable() == 6
    assert capacity_condition(blind, 6).reason == "SufficientAllocatable"
    assert blind.describe().endswith(
        "; free GPUs not read (pods could not be listed): other workloads' pods are not counted"
    )


def test_capacity_available_says_held_counts_unread_pods_and_leaves_admission_to_kueue() -> None:
    held = capacity_condition(Capacity(B200, 4, 4, None, "", free=1, held=3), 2)
    assert (held.status, held.reason) == ("False", "HeldByOtherWorkloads")
    assert held.message == (
        "4 of 4 ml.p6-b200.48xlarge nodes schedulable: 1 free, 3 held by other workloads; 2 needed. The job "
        "is created; its workers wait until other workloads free the nodes."
    )
    free = capacity_condition(Capacity(B200, 4, 4, None, "", free=4), 4)
    assert (free.status, free.reason) == ("True", "Sufficient")
    unread = capacity_condition(Capacity(B200, 4, 4, unread="HTTP 403"), 4)
    assert (unread.status, unread.reason) == ("True", "SufficientAllocatable")
    assert "free GPUs not read (HTTP 403)" in unread.message
    queued = capacity_condition(Capacity(B200, 4, 4, None, "", free=4), 4, queued=True)
    assert (queued.status, queued.reason) == ("Unknown", "KueueAdmits")
    assert "Kueue admits the job by its ClusterQueue's quota" in queued.message
    # Kueue or not, nodes that are not there are said.
    short = capacity_condition(Capacity(B200, 4, 4, None, "", free=1, held=3), 2, queued=True)
    assert short.status == "False"


def test_the_reader_lists_pods_once_per_ttl_and_says_why_when_it_cannot() -> None:
    now, calls = [0.0], {"pods": 0}
    answers: list[list[dict[str, Any]] | Exception] = [[pod("hyperpod-i-000", namespace="team-b")]]

    def pods() -> list[dict[str, Any]]:
        calls["pods"] += 1
        answer = answers[0]
        if isinstance(answer, Exception):
            raise answer
        return answer

    def nodes(_: str) -> list[dict[str, Any]]:
        return [node("hyperpod-i-000"), node("hyperpod-i-001")]

    reader = NodeCapacityReader(nodes, list_pods=pods, job_label=JOB, ttl=5.0, clock=lambda: now[0])
    first = reader.read(B200, owner=("team-a", "mine"), gpus=8)
    assert (first.free, first.held) == (1, 1)
    reader.read(B200, owner=("team-a", "mine"), gpus=8)
    assert calls["pods"] == 1
    answers[0] = Unreadable("pods could not be listed in every namespace: HTTP 403 Forbidden")
    now[0] = 6.0
    refused = reader.read(B200, gpus=8)
    assert refused.free is None and "HTTP 403 Forbidden" in refused.unread
    off = NodeCapacityReader(nodes, off="BTJ_FREE_CAPACITY is off").read(B200, gpus=8)
    assert off.free is None and off.unread == "BTJ_FREE_CAPACITY is off"
