"""A resize is an intent every later pass finishes: a 500 or a lost answer on its status write, its DELETE
of the old child, the release of that child's finalizer, the plan ConfigMap's new plan, the create of the
new child or the write that records it, or the operator stopped just before or just after any of them,
ends on the re-planned child within two resync intervals: one child, mounting the new plan, never the old
one left running, no duplicate, no orphan (issue 35)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.operator.harness import Cluster, emulated_cluster, running_operator, wait_for, write_kubeconfig
from tests.operator.intents import (
    CREATE,
    DELETE,
    PLAN_COPY,
    RELEASE,
    STATUS_WRITE,
    Request,
    after_its_last_try,
    aim,
    converge,
    deleted_because,
    named,
    on_intended_child,
    plan_copy_of,
    recording_child_other_than,
    releasing,
    status_write_of,
)
from tests.operator.test_elastic import elastic_btj, replicas, set_health

pytestmark = pytest.mark.integration

# The resync loop's longest backoff in these tests (BTJ_CHILD_RETRY_INTERVAL_S); each case must end on the
# intended child within two of them once its fault has been met.
RESYNC_S = 3.0
BOUND_S = 2 * RESYNC_S
# Safety net for what comes before a fault is met (the node reader caches its LIST for 5 s).
SETUP_S = 40.0

Step = tuple[str, str, str | None]


def steps(name: str, old_uid: str) -> dict[str, tuple[Step, Callable[[Request], bool]]]:
    """Each request of one BTJ's resize: (method, plural, subresource) and which of them it is."""
    return {
        "status-write": (STATUS_WRITE, status_write_of(name, "planHistory", "Resized")),
        "delete": (DELETE, named(name)),
        "release": (RELEASE, releasing(name)),
        "plan-copy": (PLAN_COPY, plan_copy_of(name)),
        "create": (CREATE, named(name)),
        "record": (STATUS_WRITE, recording_child_other_than(name, old_uid)),
    }


@pytest.fixture
async def four_nodes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Cluster]:
    async with emulated_cluster(nodes=4) as emulated:
        monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kubeconfig", emulated.url)))
        monkeypatch.setenv("BTJ_METRICS_BIND", "off")
        monkeypatch.setenv("BTJ_ELASTIC_INTERVAL_S", "0.2")
        monkeypatch.setenv("BTJ_CHILD_RETRY_INTERVAL_S", str(RESYNC_S))
        yield emulated


async def running_on_four(cluster: Cluster, names: list[str]) -> dict[str, tuple[str, int]]:
    """Apply an elastic BTJ per name (grace 0: a lost node resizes at once) and wait for each 4-node child;
    their uids, and the 3 nodes each is to be resized to."""
    for name in names:
        await cluster.apply(elastic_btj(name, grace=0))
    for name in names:
        await wait_for(
            lambda name=name: replicas(cluster, name) == 4 and cluster.status(name).get("child"),
            timeout=SETUP_S,
            what=f"{name}'s 4-node child",
        )
    return {name: (cluster.job(name)["metadata"]["uid"], 3) for name in names}  # type: ignore[index]


async def recorded(cluster: Cluster, names: list[str]) -> float:
    """When every BTJ's resize is in its status (the intent recorded)."""
    await wait_for(
        lambda: all(cluster.status(n).get("nodes") == 3 for n in names),
        timeout=SETUP_S,
        what="every resize recorded",
    )
    return time.monotonic()


@pytest.mark.parametrize(("status", "commit"), [(500, False), (504, True)], ids=["http-500", "answer-lost"])
async def test_a_failed_request_at_any_step_of_a_resize_ends_on_the_new_child(
    four_nodes: Cluster, status: int, commit: bool
) -> None:
    cluster = four_nodes
    names = [f"r-{step}" for step in steps("x", "x")]
    async with running_operator(cluster) as runner:
        old = await running_on_four(cluster, names)
        for name, (uid, _) in old.items():
            step, when = steps(name, uid)[name.removeprefix("r-")]
            aim(cluster, step, when, status, commit=commit)
        await set_health(cluster, 3, "Unschedulable")
        started = await recorded(cluster, names)
        await converge(cluster, old, started, BOUND_S)
        assert all(f.hits == 1 for f in cluster.k.faults), [(f.method, f.hits) for f in cluster.k.faults]
    assert runner.exception is None


async def test_the_operator_stopped_at_any_step_of_a_resize_ends_on_the_new_child(
    four_nodes: Cluster,
) -> None:
    """Stopped just before the status write, just after it (before the DELETE), after the DELETE (before
    the finalizer's release), after the release (before the plan's copy), after the copy (before the
    create), after the create (before the write that records it) and after that last write: a request that
    never comes is a fault on every try until the operator is gone."""
    cluster = four_nodes
    points = {
        "before-write": "status-write",
        "after-write": "delete",
        "after-delete": "release",
        "after-release": "plan-copy",
        "after-copy": "create",
        "after-create": "record",
        "after-record": None,
    }
    names = [f"k-{point}" for point in points]
    faults: list[Any] = []
    async with running_operator(cluster):
        old = await running_on_four(cluster, names)
        for name, (uid, _) in old.items():
            kind = points[name.removeprefix("k-")]
            if kind is None:
                continue  # stopped once it is all done: the restart must not make another child
            step, when = steps(name, uid)[kind]
            if kind == "record":  # the create lands; then nothing records it
                aim(cluster, CREATE, named(name), 504, commit=True)
            faults.append(aim(cluster, step, when, 500, times=10**6))
        await set_health(cluster, 3, "Unschedulable")
        await wait_for(lambda: all(f.hits for f in faults), timeout=SETUP_S, what="every stop point reached")
        await wait_for(
            lambda: on_intended_child(cluster, "k-after-record", *old["k-after-record"]),
            timeout=SETUP_S,
            what="k-after-record done before the stop",
        )
    await after_its_last_try(cluster)
    async with running_operator(cluster) as runner:
        await converge(cluster, old, time.monotonic(), BOUND_S)
        # The DELETE the restarted operator made says why, as the one made on time does.
        await wait_for(
            lambda: deleted_because(cluster, "k-after-write", "the job is resized"),
            what="its ChildDeleted Event",
        )
    assert runner.exception is None
