"""Helpers of the intent fault tests: faults aimed at one BTJ's one request, and what "converged" means.

An intent (a resize, an out-of-memory re-plan, a lost child's re-create) is a few requests in order: the
status write that records it, the DELETE of the stale child, the release of its final-status finalizer
once its end is recorded, the plan ConfigMap's new plan, the create of the planned child, the status write
that records the new child. Each fault here hits one of those requests of one BTJ only, so several
BTJs share one operator run, each with its own fault.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import kmock

from blackwell_operator.lifecycle.replan import replacing_child
from blackwell_operator.render.environment import PLAN_FILE
from blackwell_operator.render.pod import plan_config_map_name
from blackwell_operator.testing.emulator import BTJ_RESOURCE, PYTORCHJOB_RESOURCE, Fault
from blackwell_trainer.plan.config import Plan
from tests.operator.harness import NAMESPACE, Cluster, wait_for

Request = Any  # kmock's rendering.Request


def body_of(request: Request) -> str:
    """The request body as text ("" without one)."""
    data = request.data
    return json.dumps(data) if isinstance(data, dict) else ""


def named(name: str) -> Callable[[Request], bool]:
    """Requests on the object `name` (by path, or by the body's metadata.name for a create)."""

    def match(request: Request) -> bool:
        if request.name is not None:
            return bool(request.name == name)
        data = request.data if isinstance(request.data, dict) else {}
        return bool((data.get("metadata") or {}).get("name") == name)

    return match


def status_write_of(name: str, *needles: str) -> Callable[[Request], bool]:
    """BTJ `name`'s status writes whose body holds every one of `needles`."""
    on = named(name)
    return lambda request: on(request) and all(n in body_of(request) for n in needles)


def recording_child_other_than(name: str, old_uid: str) -> Callable[[Request], bool]:
    """BTJ `name`'s status writes that record a child other than `old_uid` (the replacement's record)."""
    on = named(name)

    def match(request: Request) -> bool:
        data = request.data if isinstance(request.data, dict) else {}
        child = ((data.get("status") or {}).get("child")) or {}
        return on(request) and bool(child.get("uid")) and child.get("uid") != old_uid

    return match


def releasing(name: str) -> Callable[[Request], bool]:
    """The patch that takes the final-status finalizer off child `name` (its end is on the BTJ)."""
    on = named(name)
    return lambda request: on(request) and "finalizers" in body_of(request)


def plan_copy_of(name: str) -> Callable[[Request], bool]:
    """Writes of BTJ `name`'s plan ConfigMap (the plan its next child mounts)."""
    return named(plan_config_map_name(name))


# The steps of an intent, as (method, plural, subresource) of its request.
STATUS_WRITE = ("patch", "blackwelltrainingjobs", "status")
DELETE = ("delete", "pytorchjobs", None)
RELEASE = ("patch", "pytorchjobs", None)
PLAN_COPY = ("patch", "configmaps", None)
CREATE = ("post", "pytorchjobs", None)


def aim(
    cluster: Cluster,
    step: tuple[str, str, str | None],
    when: Callable[[Request], bool],
    status: int,
    *,
    times: int = 1,
    commit: bool = False,
) -> Fault:
    """A fault on the next `times` requests of `step` that `when` says yes to."""
    method, plural, subresource = step
    return cluster.k.inject_fault(
        method, plural, status, times=times, commit=commit, subresource=subresource, when=when
    )


def children_made(cluster: Cluster, name: str) -> set[str]:
    """Every uid a PyTorchJob named `name` has had (its ADDED watch events)."""
    history = cluster.k._buses[kmock.resource(PYTORCHJOB_RESOURCE)].history
    return {
        e["object"]["metadata"]["uid"]
        for e in history
        if e.get("type") == "ADDED" and e["object"]["metadata"]["name"] == name
    }


def replicas(job: dict[str, Any]) -> int:
    return int(job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"])


def mounts_the_plan(cluster: Cluster, name: str) -> bool:
    """The plan ConfigMap holds the plan in status (the child mounts it: a stale one trains the old plan)."""
    found, planned = cluster.config_map(plan_config_map_name(name)), cluster.status(name).get("plan")
    if found is None or not planned:
        return False
    copy, plan = Plan.model_validate_json(found["data"][PLAN_FILE]), Plan.model_validate(planned)
    return (copy.nodes, copy.chosen, copy.global_batch_tokens) == (
        plan.nodes,
        plan.chosen,
        plan.global_batch_tokens,
    )


def on_intended_child(cluster: Cluster, name: str, stale_uid: str, nodes: int) -> bool:
    """The intent is done: one live child, not the stale one, of the planned node count, recorded in
    status, mounting the planned plan, and nothing left to replace."""
    job = cluster.job(name)
    status = cluster.status(name)
    return bool(
        job is not None
        and not job["metadata"].get("deletionTimestamp")
        and job["metadata"]["uid"] != stale_uid
        and replicas(job) == nodes
        and (status.get("child") or {}).get("uid") == job["metadata"]["uid"]
        and status.get("nodes") == nodes
        and not replacing_child(status)
        and mounts_the_plan(cluster, name)
    )


def deleted_because(cluster: Cluster, name: str, why: str) -> bool:
    """BTJ `name` has a ChildDeleted Event that says `why`."""
    return any(
        e.get("reason") == "ChildDeleted" and why in e.get("message", "") for e in cluster.events(name)
    )


def orphans(cluster: Cluster) -> dict[str, list[str]]:
    """Plan ConfigMaps without their job, children without their BTJ, children held Terminating."""
    jobs = cluster.k.live_objects(PYTORCHJOB_RESOURCE, NAMESPACE)
    names = {j["metadata"]["name"] for j in jobs}
    btj_uids = {b["metadata"]["uid"] for b in cluster.k.live_objects(BTJ_RESOURCE, NAMESPACE)}
    plans = [c["metadata"]["name"] for c in cluster.k.live_objects("v1/configmaps", NAMESPACE)]
    return {
        "config_maps_without_job": sorted(p for p in plans if p.removesuffix("-plan") not in names),
        "children_without_btj": sorted(
            j["metadata"]["name"]
            for j in jobs
            if not {r.get("uid") for r in j["metadata"].get("ownerReferences") or []} & btj_uids
        ),
        "children_held_terminating": sorted(
            j["metadata"]["name"] for j in jobs if j["metadata"].get("deletionTimestamp")
        ),
    }


async def after_its_last_try(cluster: Cluster, quiet_s: float = 2.5, timeout: float = 30.0) -> None:
    """Wait until no fault has been hit for `quiet_s`, then lift every fault: the stopped operator's calls
    still in flight have given up. Under KopfRunner its worker threads outlive it (a retry loop goes on),
    and one that met a lifted fault would race the next operator as a killed process never does."""
    started, last, seen = time.monotonic(), time.monotonic(), -1
    while time.monotonic() - last < quiet_s:
        hits = sum(f.hits for f in cluster.k.faults)
        if hits != seen:
            last, seen = time.monotonic(), hits
        assert time.monotonic() - started < timeout, "the stopped operator's calls never stopped"
        await asyncio.sleep(0.1)
    for fault in cluster.k.faults:
        fault.times = 0


async def converge(cluster: Cluster, old: dict[str, tuple[str, int]], started: float, bound_s: float) -> None:
    """Every BTJ (name -> (stale uid, planned nodes)) on its intended child within `bound_s` of `started`,
    made once (the first child and one replacement each), and no orphan anywhere."""
    for name, (uid, nodes) in old.items():
        left = max(0.1, bound_s - (time.monotonic() - started))
        await wait_for(
            lambda name=name, uid=uid, nodes=nodes: on_intended_child(cluster, name, uid, nodes),
            timeout=left,
            what=f"{name} on its intended child within {bound_s} s: {cluster.status(name).get('message')}",
        )
    for name, (uid, _) in old.items():
        made = children_made(cluster, name)
        assert uid in made and len(made) == 2, (name, made)
    assert orphans(cluster) == {
        "config_maps_without_job": [],
        "children_without_btj": [],
        "children_held_terminating": [],
    }
