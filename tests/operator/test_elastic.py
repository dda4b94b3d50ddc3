"""Elastic jobs on the emulated cluster with the real operator: a node lost past the grace period shrinks the
plan and re-creates the child with the same global batch; nodes back grow it (scaleUp); the cooldown holds
a flapping node to one resize; fewer than minNodes waits."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.operator.harness import (
    B200,
    Cluster,
    api_calls,
    btj,
    emulated_cluster,
    from_operator,
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
        assert "3 schedulable nodes, fewer than maxNodes 4" in first["plan"]["elastic"]["reason"]
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
        await cluster.apply(elastic_btj("wait"))
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
