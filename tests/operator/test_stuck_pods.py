"""Trainer pods stuck Terminating on a lost node are force-deleted; nothing else is touched.

Pure tests of lifecycle.stuck_pods, then the real operator under KopfRunner against the emulator.
"""

from __future__ import annotations

import copy
import datetime
import json
import time
from typing import Any

import pytest

from blackwell_operator.handlers.stuck import TIMEOUT_ENV, stuck_pod_timeout
from blackwell_operator.lifecycle.stuck_pods import node_ready_status, stuck_pods
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
from tests.operator.pods import pod

NOW = datetime.datetime(2026, 11, 30, 12, 0, tzinfo=datetime.UTC).timestamp()


def _ago(seconds: float, now: float = NOW) -> str:
    return datetime.datetime.fromtimestamp(now - seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _on(name: str, node_name: str, deleting_since: float | None, now: float = NOW) -> dict[str, Any]:
    """A trainer pod on `node_name`, its deletion deadline `deleting_since` seconds ago (None: none)."""
    body = pod(name)
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


@pytest.mark.integration
async def test_a_pod_stuck_on_a_lost_node_is_force_deleted(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(TIMEOUT_ENV, "1")  # overdue 1 s after its deadline; a sweep every 0.2 s
    for body in copy.deepcopy(NODES):
        status = body.pop("status")
        await cluster.add_node(body)
        await cluster.set_node_status(body["metadata"]["name"], status)  # as the kubelet reports it
    async with running_operator(cluster):
        await cluster.apply(btj("w"))
        await wait_for(lambda: cluster.job("w"), what="the PyTorchJob")
        await cluster.terminating_pod(_on("w-worker-0", "lost", None))
        await cluster.terminating_pod(_on("w-worker-1", "fine", None))  # its kubelet will finish it
        await cluster.add_pod(_on("w-worker-2", "lost", None))  # not being deleted
        other = _on("x-worker-0", "lost", None)  # a trainer pod of a BTJ that is gone: released too
        other["metadata"]["labels"]["training.blackwell.dev/job-name"] = "x"
        await cluster.terminating_pod(other)
        stranger = _on("db-0", "lost", None)  # not a trainer pod: the watch never sees it
        del stranger["metadata"]["labels"]["app.kubernetes.io/managed-by"]
        await cluster.terminating_pod(stranger)

        await wait_for(lambda: _force_deletes(cluster), what="the force delete")
        (event,) = await wait_for(
            lambda: [e for e in cluster.events("w") if e.get("reason") == "StuckPodReleased"],
            what="the Event",
        )
        # Every Terminating pod is overdue now or soon (w-worker-1 on the Ready node too): two sweeps after
        # that, each listing the nodes for the candidates it has, have touched none of the others.
        overdue_at = 1.0 + max(
            rfc3339_seconds(p["metadata"]["deletionTimestamp"]) or 0.0
            for p in cluster.k.live_objects("v1/pods", NAMESPACE)
            if p["metadata"].get("deletionTimestamp")
        )
        await wait_for(lambda: time.time() > overdue_at, what="every Terminating pod overdue")
        listed = _node_lists(cluster)
        await wait_for(lambda: _node_lists(cluster) >= listed + 2, what="two sweeps of the overdue pods")
    # Once each: a released pod is no longer a candidate (the emulator keeps it only for its finalizer).
    assert len(_force_deletes(cluster)) == 2
    assert set(_force_deletes(cluster)) == {("w-worker-0", 0), ("x-worker-0", 0)}
    assert event["type"] == "Warning" and "pod w-worker-0 was stuck Terminating" in event["message"]
    assert "node lost is not Ready (Unknown)" in event["message"]
