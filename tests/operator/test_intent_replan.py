"""An out-of-memory re-plan and a lost child's re-create are intents every later pass finishes: a 500 or a
lost answer on each of their requests, or the operator stopped before or after each write, ends on the
intended child within two resync intervals: one child, the planned one, no duplicate, no orphan (issue 35).

The re-plan: the pod watcher's status write (the new plan and its planHistory entry), the DELETE of the
child that ran out of memory, the release of its finalizer, the plan ConfigMap's new plan, the create of
the re-planned child, the write that records it. The re-create: the child watcher's write that records the
deletion (ChildDeleted), the release of the child's finalizer, the create, the write that records it.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, cast

import pytest

from blackwell_operator.discovery.capacity import NodeCapacityReader
from blackwell_operator.handlers.api import KubeApi, load_api_client
from blackwell_operator.handlers.context import OperatorContext
from blackwell_operator.handlers.pods import WORKER_FAILED
from blackwell_operator.handlers.reconcile import Reconciler
from blackwell_operator.lifecycle import outcome as outcomes
from blackwell_operator.lifecycle.replan import REPLANNED_REASON
from blackwell_operator.lifecycle.status_read import read_btj
from blackwell_operator.metrics import OperatorMetrics
from blackwell_operator.testing.emulator import Fault
from blackwell_trainer.plan.config import Plan
from tests.operator.harness import (
    Cluster,
    btj,
    emulated_cluster,
    running_operator,
    wait_for,
    write_kubeconfig,
)
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
    replicas,
    status_write_of,
)
from tests.support.oom import oom_message
from tests.support.pods import T1, container, pod, pod_status, terminated

pytestmark = pytest.mark.integration

RESYNC_S = 3.0  # BTJ_CHILD_RETRY_INTERVAL_S here
BOUND_S = 2 * RESYNC_S
SETUP_S = 30.0  # a safety net for what comes before the fault
DONE = "none"  # the stop point after the intent's last write: no request left to stop before

Step = tuple[str, str, str | None]
Steps = dict[str, tuple[Step, Callable[[Request], bool]]]


def replan_steps(name: str, old_uid: str) -> Steps:
    return {
        "status-write": (STATUS_WRITE, status_write_of(name, "planHistory", "OutOfMemory")),
        "delete": (DELETE, named(name)),
        "release": (RELEASE, releasing(name)),
        "plan-copy": (PLAN_COPY, plan_copy_of(name)),
        "create": (CREATE, named(name)),
        "record": (STATUS_WRITE, recording_child_other_than(name, old_uid)),
    }


def recreate_steps(name: str, old_uid: str) -> Steps:
    """The plan is unchanged: its ConfigMap is kept (the BTJ owns it), so the re-create writes none."""
    return {
        "status-write": (STATUS_WRITE, status_write_of(name, "ChildDeleted")),
        "release": (RELEASE, releasing(name)),
        "create": (CREATE, named(name)),
        "record": (STATUS_WRITE, recording_child_other_than(name, old_uid)),
    }


async def out_of_memory(cluster: Cluster, name: str) -> None:
    """A worker of BTJ `name`'s child whose trainer ran out of GPU memory (its OOM result line)."""
    plan = Plan.model_validate(cluster.status(name)["plan"])
    ended = container(state={"terminated": terminated(1, "Error", T1, oom_message(plan))})
    await cluster.add_pod(pod(f"{name}-worker-0", name, owner=cluster.job(name)), pod_status(ended))


def events_of(cluster: Cluster, name: str, reason: str) -> list[dict[str, Any]]:
    return [e for e in cluster.events(name) if e.get("reason") == reason]


async def lost(cluster: Cluster, name: str) -> None:
    """The child deleted by hand (or by anything else) before the job finished."""
    await cluster.delete_child(name)


INTENTS: dict[str, tuple[Callable[[str, str], Steps], Callable[[Cluster, str], Any]]] = {
    "oom-replan": (replan_steps, out_of_memory),
    "lost-child": (recreate_steps, lost),
}


@pytest.fixture
async def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Cluster]:
    async with emulated_cluster(nodes=2) as emulated:
        monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kubeconfig", emulated.url)))
        monkeypatch.setenv("BTJ_METRICS_BIND", "off")
        monkeypatch.setenv("BTJ_CHILD_RETRY_INTERVAL_S", str(RESYNC_S))
        yield emulated


async def with_children(cluster: Cluster, names: list[str]) -> dict[str, tuple[str, int]]:
    """A BTJ per name, each with its child; name -> (the child's uid, its node count)."""
    for name in names:
        await cluster.apply(btj(name))
    for name in names:
        await wait_for(
            lambda name=name: cluster.job(name) and cluster.status(name).get("child"),
            timeout=SETUP_S,
            what=f"{name}'s child",
        )
    return {n: (cluster.job(n)["metadata"]["uid"], replicas(cluster.job(n))) for n in names}  # type: ignore[index]


async def started_after(faults: list[Fault]) -> float:
    """When every fault has been met (the intent has reached its step)."""
    await wait_for(lambda: all(f.hits for f in faults), timeout=SETUP_S, what="every fault met")
    return time.monotonic()


@pytest.mark.parametrize("intent", list(INTENTS))
@pytest.mark.parametrize(("status", "commit"), [(500, False), (504, True)], ids=["http-500", "answer-lost"])
async def test_a_failed_request_at_any_step_ends_on_the_intended_child(
    cluster: Cluster, intent: str, status: int, commit: bool
) -> None:
    steps_of, trigger = INTENTS[intent]
    kinds = list(steps_of("x", "x"))
    names = [f"{intent[:4]}-{kind}" for kind in kinds]
    async with running_operator(cluster) as runner:
        old = await with_children(cluster, names)
        faults = []
        for name, (uid, _) in old.items():
            step, when = steps_of(name, uid)[name.removeprefix(f"{intent[:4]}-")]
            faults.append(aim(cluster, step, when, status, commit=commit))
        for name in names:
            await trigger(cluster, name)
        await converge(cluster, old, await started_after(faults), BOUND_S)
        assert all(f.hits == 1 for f in faults), [(f.method, f.hits) for f in faults]
        if intent == "oom-replan":  # its Events, though the answer to the write that made them was lost
            for name, reason in itertools.product(names, (WORKER_FAILED, REPLANNED_REASON)):
                await wait_for(
                    lambda n=name, r=reason: events_of(cluster, n, r), what=f"{name}'s {reason} Event"
                )
    assert runner.exception is None


@pytest.mark.parametrize("intent", list(INTENTS))
async def test_the_operator_stopped_at_any_step_ends_on_the_intended_child(
    cluster: Cluster, intent: str
) -> None:
    """Stopped just before each of the intent's requests (so just after the one before it), and just after
    the last: a request that never comes is one that fails on every try until the operator is gone."""
    steps_of, trigger = INTENTS[intent]
    kinds = [*steps_of("x", "x"), DONE]
    names = [f"{intent[:4]}-stop-before-{kind}" for kind in kinds]
    async with running_operator(cluster):
        old = await with_children(cluster, names)
        faults = []
        for name, (uid, _) in old.items():
            kind = name.removeprefix(f"{intent[:4]}-stop-before-")
            if kind == DONE:
                continue  # stopped once it is all done: the restart must not make another child
            step, when = steps_of(name, uid)[kind]
            if kind == "record":  # the create lands; then nothing records it
                aim(cluster, CREATE, named(name), 504, commit=True)
            faults.append(aim(cluster, step, when, 500, times=10**6))
        for name in names:
            await trigger(cluster, name)
        await started_after(faults)
        done = f"{intent[:4]}-stop-before-{DONE}"
        await wait_for(lambda: on_intended_child(cluster, done, *old[done]), timeout=SETUP_S, what=done)
    await after_its_last_try(cluster)
    async with running_operator(cluster) as runner:
        await converge(cluster, old, time.monotonic(), BOUND_S)
        if intent == "oom-replan":  # the DELETE the restarted operator made says why, as one on time does
            name = f"{intent[:4]}-stop-before-delete"
            await wait_for(lambda: deleted_because(cluster, name, "it ran out of GPU memory"), what=name)
    assert runner.exception is None


async def test_a_pass_whose_write_meets_a_re_plan_does_not_put_its_older_plan_back(cluster: Cluster) -> None:
    """A reconcile pass read the status; an out-of-memory re-plan (or a resize) landed before its status
    write, which meets a conflict and is computed again on the BTJ as it is now. The plan it made from its
    read is the one that ran out of memory: written back, the re-created child would run it again (a resize
    reverted this way was made a second time, a third child). It writes nothing instead."""
    async with running_operator(cluster):
        await with_children(cluster, ["stale"])
        await cluster.settle("stale")
    read = read_btj(cluster.btj("stale") or {})
    assert read.status.plan is not None
    older = read.status.plan
    smaller = older.chosen.model_copy(update={"micro_batch_size": max(1, older.chosen.micro_batch_size // 2)})
    replanned = older.model_copy(update={"chosen": smaller})
    await cluster.set_btj_status("stale", {"plan": replanned.model_dump(mode="json", by_alias=True)})
    ctx = OperatorContext(
        api=KubeApi(load_api_client()), capacity=cast(NodeCapacityReader, None), metrics=OperatorMetrics()
    )
    passed = outcomes.planned(
        older, read.generation, replanned=False, nodes=None, aws=None, needed=older.nodes, queue_name=None
    )
    await asyncio.to_thread(Reconciler(ctx, direct_events=True)._apply_outcome, read, passed)
    assert Plan.model_validate(cluster.status("stale")["plan"]).chosen == smaller
