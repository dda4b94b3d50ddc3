"""The running operator's /metrics and /healthz over real HTTP, and its API calls against PERMISSIONS."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from blackwell_operator.handlers.stuck import TIMEOUT_ENV
from blackwell_operator.permissions import ADMISSION_ONLY, PERMISSIONS
from blackwell_operator.testing.emulator import HYPERPOD_RESOURCE, TRAINJOB_RESOURCE
from tests.operator.harness import (
    NAMESPACE,
    Cluster,
    api_calls,
    btj,
    from_operator,
    node,
    running_operator,
    wait_for,
)
from tests.operator.test_trainjob_lifecycle import node_job, trainer_pod
from tests.ports import free_port
from tests.support.pods import PERMANENT_TRAINER_ERROR, T2, container, pod, pod_status, terminated

pytestmark = pytest.mark.integration
T = TypeVar("T")


async def test_metrics_and_health_are_served(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port()
    monkeypatch.setenv("BTJ_METRICS_BIND", f"127.0.0.1:{port}")
    async with running_operator(cluster), aiohttp.ClientSession() as http:
        await cluster.apply(btj("ok"))
        await cluster.apply(btj("broken", model={"preset": "gpt-7"}))
        await wait_for(lambda: cluster.status("ok").get("phase") == "Pending", what="phase Pending")
        await wait_for(lambda: cluster.status("broken").get("phase") == "Invalid", what="phase Invalid")

        async def scrape() -> dict[str, dict[str, float]]:
            async with http.get(f"http://127.0.0.1:{port}/metrics") as response:
                assert response.status == 200
                text = await response.text()
            out: dict[str, dict[str, float]] = {}
            for family in text_string_to_metric_families(text):
                for sample in family.samples:
                    key = sample.labels.get("phase") or sample.labels.get("reason") or ""
                    out.setdefault(sample.name, {})[key] = sample.value
            return out

        # The phase gauge follows the BTJ watch, and a reconcile is timed after its status write: wait for
        # every figure asserted below, since each lands a moment after the status the test waited on.
        samples = await wait_for_async(
            scrape,
            lambda s: (
                s["btj_operator_jobs"].get("Invalid") == 1
                and s["btj_operator_jobs"].get("Pending") == 1
                and s.get("btj_operator_reconcile_duration_seconds_count", {}).get("", 0) >= 2
            ),
        )
        async with http.get(f"http://127.0.0.1:{port}/healthz") as response:
            assert response.status == 200 and (await response.json()) == {"status": "ok"}
    assert samples["btj_operator_jobs"]["Pending"] == 1
    assert samples["btj_operator_reconcile_errors_total"]["InvalidSpec"] == 1
    assert samples["btj_operator_reconcile_duration_seconds_count"][""] >= 2
    assert samples["btj_operator_build_info"][""] == 1


async def wait_for_async(
    fetch: Callable[[], Awaitable[T]], accept: Callable[[T], bool], attempts: int = 100
) -> T:
    """Fetch until `accept(value)`; fail after `attempts` tries 50 ms apart."""
    value = await fetch()
    for _ in range(attempts):
        value = await fetch()
        if accept(value):
            return value
        await asyncio.sleep(0.05)
        value = await fetch()
    raise AssertionError(f"never accepted: {value}")


async def test_every_call_is_granted_and_every_grant_is_used(
    cluster: Cluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Namespaced mode (-n) adds Kopf's namespace watch; the scenario walks every code path that calls the API.
    monkeypatch.setenv(TIMEOUT_ENV, "1")
    await cluster.add_node(node("lost"))  # no Ready condition: a node that stopped reporting
    async with running_operator(cluster, namespace=NAMESPACE):
        await cluster.apply(btj("a"))
        await cluster.apply(btj("hp", backend="HyperPodPyTorchJob"))
        await cluster.apply(btj("tj", backend="TrainJob"))
        await cluster.apply(btj("bad", model={"preset": "gpt-7"}))
        # Its pods' ServiceAccount is missing: read (get), so the create waits.
        await cluster.apply(btj("sa", serviceAccountName="not-yet"))
        await wait_for(lambda: cluster.status("a").get("observedGeneration") == 1, what="a reconciled")
        await wait_for(lambda: cluster.condition("sa", "ChildCreated"), what="sa's ServiceAccount checked")
        await cluster.patch_spec("a", {"training": {"sequenceLength": 4096, "steps": 10}})
        await wait_for(lambda: cluster.status("a").get("observedGeneration") == 2, what="a re-planned")
        await cluster.set_child_status(
            "a",
            {
                "conditions": [
                    {"type": "Running", "status": "True", "reason": "PyTorchJobRunning", "message": ""}
                ]
            },
        )
        await wait_for(lambda: cluster.status("a").get("phase") == "Running", what="phase Running")
        await wait_for(lambda: cluster.condition("hp", "ChildCreated"), what="hp ChildCreated")
        await cluster.patch_spec("hp", {"training": {"sequenceLength": 4096, "steps": 10}})
        await wait_for(lambda: cluster.status("hp").get("observedGeneration") == 2, what="hp re-planned")
        # Not started yet: the TrainJob's runtime is patched (create, conflict, get, patch).
        await wait_for(lambda: cluster.condition("tj", "ChildCreated"), what="tj ChildCreated")
        await cluster.patch_spec("tj", {"image": "registry.example/trainer:2"})
        await wait_for(lambda: cluster.status("tj").get("observedGeneration") == 2, what="tj re-planned")
        await wait_for(lambda: cluster.status("bad").get("phase") == "Invalid", what="phase Invalid")
        # A worker of a's child stuck Terminating on that node is force-deleted (its owners traced, and its
        # BTJ gets an Event).
        stuck = pod("a-worker-1", job="a", owner=cluster.job("a"))
        stuck["spec"]["nodeName"] = "lost"
        await cluster.terminating_pod(stuck)
        await wait_for(
            lambda: any(e.get("reason") == "StuckPodReleased" for e in cluster.events("a")),
            what="the stuck pod released",
        )
        # A worker of each backend ends on a permanent error: every child is deleted.
        permanent = pod_status(
            container(state={"terminated": terminated(1, "Error", T2, PERMANENT_TRAINER_ERROR)})
        )
        for name, resource in (("a", None), ("hp", HYPERPOD_RESOURCE), ("tj", TRAINJOB_RESOURCE)):
            job = cluster.job(name, resource) if resource else cluster.job(name)
            if resource == TRAINJOB_RESOURCE:  # its pods are a JobSet's Job's (the operator reads both)
                worker = trainer_pod("tj-node-0-0-abcde", name, name, await node_job(cluster, name))
            else:
                worker = pod(f"{name}-worker-0", job=name, owner=job)
            await cluster.add_pod(worker, permanent)
            await wait_for(
                lambda n=name, r=resource: (cluster.job(n, r) if r else cluster.job(n)) is None,
                what=f"{name}'s child deleted",
            )
    calls = api_calls(r for r in cluster.k.requests if from_operator(r))
    grants = {(p.api_group, p.resource, verb) for p in PERMISSIONS for verb in p.verbs}
    assert calls <= grants, f"not granted: {sorted(calls - grants)}"
    assert grants - ADMISSION_ONLY <= calls, (
        f"granted but never used: {sorted(grants - ADMISSION_ONLY - calls)}"
    )
