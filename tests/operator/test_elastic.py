"""Elastic jobs on the emulated cluster with the real operator: a node lost past the grace period shrinks the
plan and re-creates the child with the same global batch; nodes back grow it (scaleUp); the cooldown holds
a flapping node to one resize; fewer than minNodes waits."""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from blackwell_operator.timefmt import format_rfc3339, now_rfc3339
from tests.operator.harness import (
    B200,
    Cluster,
    api_calls,
    btj,
    emulated_cluster,
    from_operator,
    node,
    running_operator,
    wait_for,
    write_kubeconfig,
)
from tests.ports import free_port

pytestmark = pytest.mark.integration

NODES = "/api/v1/nodes"
SEQUENCE = 8192
# 768 sequences divide over 16, 24 and 32 GPUs: every count of [2, 4] B200 nodes trains the same batch.
GLOBAL_BATCH = 768 * SEQUENCE
# The node reader caches a LIST for 5 s (discovery/capacity.py): a change shows within that, then the
# grace period runs. Safety nets only; every wait is on a condition.
TIMEOUT_S = 40.0


def elastic_btj(name: str, *, grace: int = 1, cooldown: int = 0, scale_up: bool = False) -> dict[str, Any]:
    return btj(
        name,
        cluster={
            "instanceType": B200,
            "nodes": 4,
            "elastic": {
                "minNodes": 2,
                "maxNodes": 4,
                "gracePeriodSeconds": grace,
                "cooldownSeconds": cooldown,
                "scaleUp": scale_up,
            },
        },
        volumes=[{"name": "fsx", "claimName": "fsx-claim", "mountPath": "/fsx"}],
        training={
            "sequenceLength": SEQUENCE,
            "globalBatchTokens": GLOBAL_BATCH,
            "steps": 1000,
            "checkpoint": {"path": f"/fsx/checkpoints/{name}"},
        },
    )


@pytest.fixture
async def four_nodes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Cluster]:
    """Four schedulable B200 nodes, the elastic loop checking every 0.2 s."""
    async with emulated_cluster(nodes=4) as emulated:
        monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kubeconfig", emulated.url)))
        monkeypatch.setenv("BTJ_METRICS_BIND", "off")
        monkeypatch.setenv("BTJ_ELASTIC_INTERVAL_S", "0.2")
        yield emulated
        from blackwell_operator.permissions import granted

        calls = api_calls(r for r in emulated.k.requests if from_operator(r))
        missing = sorted(call for call in calls if not granted(*call))
        assert not missing, f"the operator made calls PERMISSIONS does not grant: {missing}"


async def set_health(cluster: Cluster, index: int, health: str) -> None:
    """HyperPod's health label on node `index` (Unschedulable: lost to the job)."""
    patch = {"metadata": {"labels": {"sagemaker.amazonaws.com/node-health-status": health}}}
    await cluster._json("PATCH", f"{NODES}/hyperpod-i-{index:03d}", patch, "application/merge-patch+json")


def replicas(cluster: Cluster, name: str) -> int | None:
    job = cluster.job(name)
    if job is None or job["metadata"].get("deletionTimestamp"):
        return None
    return int(job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"])


def plan_nodes(cluster: Cluster, name: str) -> int | None:
    plan = cluster.status(name).get("plan") or {}
    return plan.get("nodes")


def resized_events(cluster: Cluster, name: str) -> list[str]:
    return [e["message"] for e in cluster.events(name) if e.get("reason") == "Resized"]


async def started(cluster: Cluster, name: str, nodes: int) -> dict[str, Any]:
    await wait_for(
        lambda: replicas(cluster, name) == nodes and cluster.status(name).get("nodes") == nodes,
        timeout=TIMEOUT_S,
        what=f"a child of {nodes} nodes in status",
    )
    return cluster.status(name)


async def test_a_node_lost_past_the_grace_period_shrinks_the_plan_and_keeps_the_global_batch(
    four_nodes: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = four_nodes
    port = free_port()
    monkeypatch.setenv("BTJ_METRICS_BIND", f"127.0.0.1:{port}")
    async with running_operator(cluster), aiohttp.ClientSession() as http:
        await cluster.apply(elastic_btj("shrink"))
        first = await started(cluster, "shrink", 4)
        assert first["plan"]["elastic"]["reason"].startswith("planned for 4 nodes")
        assert first["nodes"] == 4
        old_uid = cluster.job("shrink")["metadata"]["uid"]  # type: ignore[index]
        await set_health(cluster, 3, "Unschedulable")
        await wait_for(
            lambda: replicas(cluster, "shrink") == 3,
            timeout=TIMEOUT_S,
            what="the child re-created on 3 nodes",
        )
        status = cluster.status("shrink")
        assert cluster.job("shrink")["metadata"]["uid"] != old_uid  # type: ignore[index]
        assert status["plan"]["nodes"] == status["nodes"] == 3
        assert status["plan"]["globalBatchTokens"] == first["plan"]["globalBatchTokens"] == GLOBAL_BATCH
        chosen = status["plan"]["chosen"]
        assert chosen["microBatchSize"] * chosen["gradientAccumulationSteps"] * 24 == 768
        (entry,) = status["planHistory"]
        assert (entry["reason"], entry["nodesBefore"], entry["nodesAfter"]) == ("Resized", 4, 3)
        assert entry["failedChildUid"] == old_uid
        assert status["elastic"]["resizes"] == 1
        (message,) = resized_events(cluster, "shrink")
        assert (
            message.startswith("Resized from 4 to 3 nodes")
            and "is re-created from the last checkpoint" in message
        )
        # The ConfigMap the new child mounts holds the 3-node plan.
        config = cluster.config_map("shrink-plan") or {}
        assert '"nodes": 3' in next(iter((config.get("data") or {}).values()), "")
        async with http.get(f"http://127.0.0.1:{port}/metrics") as response:
            metrics = await response.text()
        assert 'btj_operator_resizes_total{direction="shrink"} 1.0' in metrics
        assert 'btj_operator_resizes_total{direction="grow"} 0.0' in metrics


async def test_nodes_back_grow_the_job_when_scale_up_allows(four_nodes: Cluster) -> None:
    cluster = four_nodes
    await set_health(cluster, 3, "Unschedulable")
    async with running_operator(cluster):
        await cluster.apply(elastic_btj("grow", scale_up=True))
        first = await started(cluster, "grow", 3)
        assert "3 nodes free for this job, fewer than maxNodes 4" in first["plan"]["elastic"]["reason"]
        await set_health(cluster, 3, "Schedulable")
        await wait_for(lambda: replicas(cluster, "grow") == 4, timeout=TIMEOUT_S, what="the child on 4 nodes")
        status = cluster.status("grow")
        assert status["plan"]["globalBatchTokens"] == GLOBAL_BATCH
        assert [(e["nodesBefore"], e["nodesAfter"]) for e in status["planHistory"]] == [(3, 4)]


async def test_without_scale_up_more_nodes_change_nothing(four_nodes: Cluster) -> None:
    cluster = four_nodes
    await set_health(cluster, 3, "Unschedulable")
    async with running_operator(cluster):
        await cluster.apply(elastic_btj("fixed"))
        await started(cluster, "fixed", 3)
        await set_health(cluster, 3, "Schedulable")
        await wait_for(
            lambda: (cluster.status("fixed").get("elastic") or {}).get("schedulable") == 4,
            timeout=TIMEOUT_S,
            what="the loop to see 4 nodes",
        )
        assert plan_nodes(cluster, "fixed") == 3 and replicas(cluster, "fixed") == 3
        assert resized_events(cluster, "fixed") == []


async def test_a_flapping_node_causes_no_more_resizes_than_the_cooldown_allows(four_nodes: Cluster) -> None:
    cluster = four_nodes
    async with running_operator(cluster):
        await cluster.apply(elastic_btj("flap", cooldown=3600, scale_up=True))
        await started(cluster, "flap", 4)
        await set_health(cluster, 3, "Unschedulable")
        await wait_for(lambda: replicas(cluster, "flap") == 3, timeout=TIMEOUT_S, what="the first resize")
        # Back, lost, back: the grace period passes each time, the hour's cooldown does not.
        for health in ("Schedulable", "Unschedulable", "Schedulable"):
            await set_health(cluster, 3, health)
            want = 4 if health == "Schedulable" else 3
            await wait_for(
                lambda want=want: (cluster.status("flap").get("elastic") or {}).get("schedulable") == want,
                timeout=TIMEOUT_S,
                what=f"the loop to see {want} nodes",
            )
        await wait_for(
            lambda: (
                "the cooldown is 3600 s" in (cluster.status("flap").get("elastic") or {}).get("waiting", "")
            ),
            timeout=TIMEOUT_S,
            what="the cooldown named in status.elastic.waiting",
        )
        assert len(resized_events(cluster, "flap")) == 1
        assert len(cluster.status("flap")["planHistory"]) == 1 and replicas(cluster, "flap") == 3


async def test_fewer_nodes_than_min_nodes_wait_and_say_so(four_nodes: Cluster) -> None:
    cluster = four_nodes
    async with running_operator(cluster):
        # A grace period well beyond the time the three label patches take: each node has its own clock,
        # and one lost before the next is even down would be a legitimate resize to 3.
        await cluster.apply(elastic_btj("wait", grace=3))
        await started(cluster, "wait", 4)
        for index in (1, 2, 3):
            await set_health(cluster, index, "Unschedulable")
        waiting = await wait_for(
            lambda: (cluster.status("wait").get("elastic") or {}).get("waiting"),
            timeout=TIMEOUT_S,
            what="status.elastic.waiting",
        )
        await wait_for(
            lambda: (
                "fewer than minNodes 2" in (cluster.status("wait").get("elastic") or {}).get("waiting", "")
            ),
            timeout=TIMEOUT_S,
            what="the wait for minNodes",
        )
        assert waiting
        assert plan_nodes(cluster, "wait") == 4 and replicas(cluster, "wait") == 4
        assert resized_events(cluster, "wait") == [] and not cluster.status("wait").get("planHistory")


async def test_a_malformed_btj_never_stops_the_others_from_resizing(four_nodes: Cluster) -> None:
    """Issue 36: a BTJ whose spec.cluster is not a mapping made every round raise; seen first, it kept every
    other elastic BTJ from resizing."""
    cluster = four_nodes
    async with running_operator(cluster) as runner:
        malformed = elastic_btj("malformed")
        malformed["spec"]["cluster"] = "four nodes, please"
        await cluster.apply(malformed)  # the first the watch shows, so the first each round reads
        await wait_for(lambda: cluster.status("malformed").get("phase") == "Invalid", what="phase Invalid")
        await cluster.apply(elastic_btj("shrink"))
        await started(cluster, "shrink", 4)
        await set_health(cluster, 3, "Unschedulable")
        await wait_for(
            lambda: replicas(cluster, "shrink") == 3, timeout=TIMEOUT_S, what="the other BTJ resized to 3"
        )
    assert runner.exception is None


# Issue 35: a node counts as lost only when it has been gone for the whole grace period. The flaps are
# stimuli (the node's down and up stretches), not timed assertions: each down stretch (about 1.5 s) is far
# shorter than the grace period (4 s), and every wait is on a condition.
FLAP_GRACE_S = 4
DOWN_S, UP_S = 1.5, 0.5
Change = Callable[[bool], Awaitable[None]]


async def flap_then_hold(cluster: Cluster, name: str, flaps: list[Change], hold: Change) -> None:
    """Each of `flaps` takes the node down for less than the grace period and back: 0 resizes, from a
    loop that saw it down; then `hold` keeps it down: exactly one resize, to 3 nodes."""
    seen: set[int] = set()

    async def record() -> None:  # the healthy-node counts the elastic loop wrote, read from the store
        while True:
            seen.add((cluster.status(name).get("elastic") or {}).get("schedulable"))
            await asyncio.sleep(0.02)

    recording = asyncio.create_task(record())
    try:
        for change in flaps:
            await change(False)
            await asyncio.sleep(DOWN_S)
            await change(True)
            await asyncio.sleep(UP_S)
    finally:
        recording.cancel()
    assert 3 in seen, f"the elastic loop never saw the node down: {seen}"
    await wait_for(
        lambda: (cluster.status(name).get("elastic") or {}).get("schedulable") == 4,
        timeout=TIMEOUT_S,
        what="the loop to see the node back",
    )
    assert resized_events(cluster, name) == [] and not cluster.status(name).get("planHistory")
    assert not cluster.status(name)["elastic"].get("resizes") and replicas(cluster, name) == 4
    await hold(False)  # now for longer than the grace period
    await wait_for(lambda: replicas(cluster, name) == 3, timeout=TIMEOUT_S, what="the child on 3 nodes")
    await wait_for(
        lambda: (cluster.status(name).get("elastic") or {}).get("waiting") == "",
        timeout=TIMEOUT_S,
        what="a check after the resize",
    )
    (message,) = resized_events(cluster, name)
    assert "3 nodes not lost (lost: gone for the whole grace period of 4 s)" in message
    assert cluster.status(name)["elastic"]["resizes"] == 1 and len(cluster.status(name)["planHistory"]) == 1


async def test_a_node_flapping_faster_than_the_grace_period_never_resizes_the_job(
    four_nodes: Cluster,
) -> None:
    """Issue 35: 2 resizes at grace 8 s with a node down 3 s / up 3 s, counts sampled through a 5 s cache.
    Down by HyperPod's health label three times, then deleted and back once, the node is never lost; kept
    down, it is lost once."""
    cluster = four_nodes

    async def health(healthy: bool) -> None:
        await set_health(cluster, 3, "Schedulable" if healthy else "Unschedulable")

    async def deleted(healthy: bool) -> None:
        if healthy:
            await cluster.add_node(node("hyperpod-i-003"))
        else:
            await cluster._json("DELETE", f"{NODES}/hyperpod-i-003")

    async with running_operator(cluster):
        await cluster.apply(elastic_btj("flapping", grace=FLAP_GRACE_S, scale_up=True))
        await started(cluster, "flapping", 4)
        await flap_then_hold(cluster, "flapping", [health, health, health, deleted], health)


async def test_a_ready_condition_flapping_counts_the_same_way(four_nodes: Cluster) -> None:
    """The kubelet's Ready condition flipping False and back: no resize; kept False: one."""
    cluster = four_nodes

    async def ready(healthy: bool) -> None:
        status = "True" if healthy else "False"
        condition = {"type": "Ready", "status": status, "lastTransitionTime": now_rfc3339()}
        await cluster.set_node_status("hyperpod-i-003", {"conditions": [condition]})

    async with running_operator(cluster):
        await ready(True)
        await cluster.apply(elastic_btj("notready", grace=FLAP_GRACE_S))
        await started(cluster, "notready", 4)
        await flap_then_hold(cluster, "notready", [ready, ready, ready], ready)


async def test_a_node_not_ready_for_longer_than_the_grace_period_is_lost_at_once_after_a_restart(
    four_nodes: Cluster,
) -> None:
    """The operator (re)started: Kubernetes' Ready lastTransitionTime, not the operator's memory, says how
    long the node has been gone; HyperPod's label has no time, so its grace period starts again."""
    cluster = four_nodes
    hour_ago = format_rfc3339(datetime.datetime.now(datetime.UTC) - datetime.timedelta(hours=1))
    not_ready = {"type": "Ready", "status": "False", "lastTransitionTime": hour_ago}
    await cluster.set_node_status("hyperpod-i-003", {"conditions": [not_ready]})
    async with running_operator(cluster):
        await cluster.apply(elastic_btj("restarted", grace=600))
        await wait_for(lambda: replicas(cluster, "restarted") == 3, timeout=TIMEOUT_S, what="the child on 3")
        (message,) = resized_events(cluster, "restarted")
        assert message.startswith("Resized from 4 to 3 nodes (3 nodes not lost")
