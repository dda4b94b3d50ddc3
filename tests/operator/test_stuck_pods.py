"""Trainer pods stuck Terminating on a lost node are force-deleted; nothing else is touched.

Pure tests of lifecycle.stuck_pods, then the real operator under KopfRunner against the emulator.
"""

from __future__ import annotations

import copy
import datetime
import json
import time
from typing import Any, cast

import pytest

from blackwell_operator.discovery.capacity import NodeCapacityReader
from blackwell_operator.handlers.api import KubeApi
from blackwell_operator.handlers.context import OperatorContext
from blackwell_operator.handlers.stuck import IGNORED_EVENT_INTERVAL_S, TIMEOUT_ENV, stuck_pod_timeout
from blackwell_operator.lifecycle.stuck_pods import node_ready_status, stuck_pods
from blackwell_operator.metrics import OperatorMetrics
from blackwell_operator.timefmt import rfc3339_seconds
from tests.operator.harness import (
    NAMESPACE,
    Cluster,
    btj,
    from_operator,
    node,
    running_operator,
    verb_of,
    wait_for,
)
from tests.support.pods import pod

NOW = datetime.datetime(2026, 11, 30, 12, 0, tzinfo=datetime.UTC).timestamp()


def _ago(seconds: float, now: float = NOW) -> str:
    return datetime.datetime.fromtimestamp(now - seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _on(
    name: str,
    node_name: str,
    deleting_since: float | None,
    now: float = NOW,
    owner: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A trainer pod on `node_name`, its deletion deadline `deleting_since` seconds ago (None: none),
    controlled by `owner` (None: by nothing)."""
    body = pod(name, owner=owner)
    body["spec"]["nodeName"] = node_name
    if deleting_since is not None:
        body["metadata"].update(deletionTimestamp=_ago(deleting_since, now), deletionGracePeriodSeconds=300)
    return body


def _node_lists(cluster: Cluster) -> int:
    """Node lists the operator sent: the sweep lists the nodes whenever it has an overdue candidate."""
    return sum(
        1
        for r in cluster.k.requests
        if from_operator(r)
        and verb_of(r) == "list"
        and r.resource is not None
        and r.resource.plural == "nodes"
    )


def _node(name: str, ready: str | None) -> dict[str, Any]:
    body = node(name)
    if ready is not None:
        body["status"] = {"conditions": [{"type": "Ready", "status": ready}]}
    return body


NODES = [_node("lost", "Unknown"), _node("down", "False"), _node("fine", "True")]


def test_only_overdue_pods_on_a_gone_or_unready_node_are_stuck() -> None:
    pods = [
        _on("on-lost", "lost", 400),  # stuck
        _on("on-down", "down", 301),  # stuck
        _on("on-gone", "vanished", 900),  # its node object is gone: stuck
        _on("on-fine", "fine", 900),  # a Ready node's kubelet finishes it
        _on("recent", "lost", 60),  # not overdue yet
        _on("running", "lost", None),  # not being deleted: the node controller's business
    ]
    stuck = stuck_pods(pods, NODES, NOW, 300)
    assert [(p.name, p.node_state, round(p.overdue_s)) for p in stuck] == [
        ("on-lost", "Unknown", 400),
        ("on-down", "False", 301),
        ("on-gone", "gone", 900),
    ]
    assert "force-deleted" in stuck[0].describe() and "not Ready (Unknown)" in stuck[0].describe()
    assert "node vanished is gone" in stuck[2].describe()


def test_a_node_without_a_ready_condition_counts_as_unknown() -> None:
    assert node_ready_status(_node("new", None)) == "Unknown"


def test_an_ignored_stuck_pod_is_reported_at_most_once_an_hour_per_btj() -> None:
    ctx = OperatorContext(
        api=cast(KubeApi, None), capacity=cast(NodeCapacityReader, None), metrics=OperatorMetrics()
    )
    hour = IGNORED_EVENT_INTERVAL_S
    assert ctx.may_report_ignored("u-w", NOW, hour)
    assert not ctx.may_report_ignored("u-w", NOW + hour - 1, hour)
    assert ctx.may_report_ignored("u-other", NOW + 1, hour)  # per BTJ
    assert ctx.may_report_ignored("u-w", NOW + hour, hour)
    ctx.remember_untraced("p-1")
    assert ctx.untraced("p-1") and not ctx.untraced("p-2")
    ctx.forget_pod("p-1")  # its deletion: a new pod may take the uid's place in the memory
    assert not ctx.untraced("p-1")


@pytest.mark.parametrize(("raw", "value"), [("", 300.0), ("45", 45.0), ("0", None)])
def test_the_timeout_comes_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, raw: str, value: float
) -> None:
    monkeypatch.setenv(TIMEOUT_ENV, raw)
    assert stuck_pod_timeout() == value


@pytest.mark.parametrize("raw", ["soon", "-1"])
def test_a_bad_timeout_names_the_variable_and_the_fix(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv(TIMEOUT_ENV, raw)
    with pytest.raises(ValueError, match=rf"{TIMEOUT_ENV}=.*Fix"):
        stuck_pod_timeout()


# ----- the running operator --------------------------------------------------------------------------------


def _force_deletes(cluster: Cluster) -> list[tuple[str, Any]]:
    """(pod name, gracePeriodSeconds) of every pod DELETE the operator sent."""
    return [
        (r.name, json.loads(r.body or b"{}").get("gracePeriodSeconds"))
        for r in cluster.k.requests
        if from_operator(r)
        and r.method.value == "DELETE"
        and r.resource is not None
        and r.resource.plural == "pods"
    ]


async def _nodes(cluster: Cluster) -> None:
    """The lost, down and fine nodes, their Ready conditions reported as the kubelet does."""
    for body in copy.deepcopy(NODES):
        status = body.pop("status")
        await cluster.add_node(body)
        await cluster.set_node_status(body["metadata"]["name"], status)


async def _two_sweeps_after_all_overdue(cluster: Cluster) -> None:
    """Every Terminating pod is overdue now or soon: wait for that, then for two sweeps that each list the
    nodes for the candidates they have (any pod a sweep would touch has been touched by then)."""
    overdue_at = 1.0 + max(
        rfc3339_seconds(p["metadata"]["deletionTimestamp"]) or 0.0
        for p in cluster.k.live_objects("v1/pods", NAMESPACE)
        if p["metadata"].get("deletionTimestamp")
    )
    await wait_for(lambda: time.time() > overdue_at, what="every Terminating pod overdue")
    listed = _node_lists(cluster)
    await wait_for(lambda: _node_lists(cluster) >= listed + 2, what="two sweeps of the overdue pods")


def _reported(cluster: Cluster, name: str, reason: str) -> list[dict[str, Any]]:
    return [e for e in cluster.events(name) if e.get("reason") == reason]


@pytest.mark.integration
async def test_a_pod_stuck_on_a_lost_node_is_force_deleted(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TIMEOUT_ENV, "1")  # overdue 1 s after its deadline; a sweep every 0.2 s
    await _nodes(cluster)
    async with running_operator(cluster):
        await cluster.apply(btj("w"))
        job = await wait_for(lambda: cluster.job("w"), what="the PyTorchJob")
        await cluster.terminating_pod(_on("w-worker-0", "lost", None, owner=job))
        await cluster.terminating_pod(_on("w-worker-1", "fine", None, owner=job))  # its kubelet finishes it
        await cluster.add_pod(_on("w-worker-2", "lost", None, owner=job))  # not being deleted
        stranger = _on("db-0", "lost", None)  # not a trainer pod: the watch never sees it
        del stranger["metadata"]["labels"]["app.kubernetes.io/managed-by"]
        await cluster.terminating_pod(stranger)

        await wait_for(lambda: _force_deletes(cluster), what="the force delete")
        (event,) = await wait_for(lambda: _reported(cluster, "w", "StuckPodReleased"), what="the Event")
        await _two_sweeps_after_all_overdue(cluster)
    # Once: a released pod is no longer a candidate (the emulator keeps it only for its finalizer).
    assert _force_deletes(cluster) == [("w-worker-0", 0)]
    assert event["type"] == "Warning" and "pod w-worker-0 was stuck Terminating" in event["message"]
    assert "node lost is not Ready (Unknown)" in event["message"]


def _operator_reads(cluster: Cluster, plural: str, name: str) -> int:
    return sum(
        1
        for r in cluster.k.requests
        if from_operator(r)
        and verb_of(r) == "get"
        and r.resource is not None
        and r.resource.plural == plural
        and r.name == name
    )


@pytest.mark.integration
async def test_a_forged_stuck_pod_is_neither_deleted_nor_reported_as_released(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Anyone who may create pods in the namespace can give one the trainer's labels and leave it stuck
    Terminating on a lost node: the sweep traces each stuck pod's owners, uid by uid, to the BTJ's own
    child, and force-deletes and reports only the child's."""
    monkeypatch.setenv(TIMEOUT_ENV, "1")
    await _nodes(cluster)
    async with running_operator(cluster):
        await cluster.apply(btj("w"))
        job = await wait_for(lambda: cluster.job("w"), what="the PyTorchJob")
        btj_uid = (cluster.btj("w") or {})["metadata"]["uid"]
        # A real worker on the Ready node: never released, but a candidate every sweep lists the nodes for.
        await cluster.terminating_pod(_on("w-worker-1", "fine", None, owner=job))
        # The trainer's labels, owned by nothing.
        await cluster.terminating_pod(_on("w-worker-7", "lost", None))
        # The child's kind and name in a controller reference, another live object's uid (the BTJ's).
        await cluster.terminating_pod(
            _on("w-worker-8", "lost", None, owner={**job, "metadata": {"name": "w", "uid": btj_uid}})
        )
        # A Job of one's own (controlled by nothing) as the controller: not how a PyTorchJob owns pods.
        decoy = await cluster._json(
            "POST",
            f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs",
            {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "w-decoy"}, "spec": {}},
        )
        await cluster.terminating_pod(_on("w-worker-9", "lost", None, owner=decoy))
        # The labels of a BTJ that does not exist: nothing to report on.
        ghost = _on("x-worker-0", "lost", None)
        ghost["metadata"]["labels"]["training.blackwell.dev/job-name"] = "x"
        await cluster.terminating_pod(ghost)

        ignored = await wait_for(lambda: _reported(cluster, "w", "StuckPodIgnored"), what="the warning")
        await _two_sweeps_after_all_overdue(cluster)
        assert not _force_deletes(cluster)
        assert not _reported(cluster, "w", "StuckPodReleased")
        # Traced once each, not on every sweep.
        assert _operator_reads(cluster, "jobs", "w-decoy") == 1

        # The child's own stuck worker is still released, and reported.
        await cluster.terminating_pod(_on("w-worker-0", "lost", None, owner=job))
        (released,) = await wait_for(
            lambda: _reported(cluster, "w", "StuckPodReleased"), what="the real pod released"
        )
        await _two_sweeps_after_all_overdue(cluster)
    assert _force_deletes(cluster) == [("w-worker-0", 0)]
    assert "pod w-worker-0 was stuck Terminating" in released["message"]
    live = {p["metadata"]["name"] for p in cluster.k.live_objects("v1/pods", NAMESPACE)}
    assert {"w-worker-7", "w-worker-8", "w-worker-9", "x-worker-0"} <= live
    # One warning for the three forged pods of w (at most one an hour per BTJ), naming one of them and the
    # way out; none for x, which does not exist.
    assert len(_reported(cluster, "w", "StuckPodIgnored")) == 1 and not cluster.events("x")
    (event,) = ignored
    assert event["type"] == "Warning" and "not force-deleted" in event["message"]
    assert any(f"pod w-worker-{n} carries this job's labels" in event["message"] for n in (7, 8, 9))
    assert "kubectl delete pod w-worker-" in event["message"]
