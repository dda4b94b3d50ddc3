"""A reconcile pass writes status once and posts each Event once (issue 23), and a pass the resync loop has
done is not done again by Kopf (issue 24), against the emulated API server.

The real Reconciler, without Kopf: each pass is called directly (as the resync loop calls it), so that the
requests counted are this pass's alone (no watcher writes in between).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kmock

from blackwell_operator.handlers.reconcile import Reconciler
from blackwell_operator.handlers.resync import Resync
from blackwell_operator.handlers.runtime import build_context
from tests.operator.harness import Cluster, btj, from_operator, verb_of

LOG = logging.getLogger("test-one-write-per-pass")


def _operator_requests(cluster: Cluster, since: int) -> list[Any]:
    return [r for r in list(cluster.k.requests)[since:] if from_operator(r)]


def _status_writes(requests: list[Any]) -> int:
    return sum(1 for r in requests if r.method == kmock.method.PATCH and r.subresource == "status")


def _events(requests: list[Any]) -> list[str]:
    return [
        str((r.data or {}).get("reason"))
        for r in requests
        if r.method == kmock.method.POST and r.resource is not None and r.resource.plural == "events"
    ]


async def _one_pass(cluster: Cluster, reconciler: Reconciler, name: str) -> list[Any]:
    since = len(list(cluster.k.requests))
    body = cluster.btj(name)
    assert body is not None
    assert await asyncio.to_thread(reconciler.reconcile_now, body, logger=LOG)
    return _operator_requests(cluster, since)


async def test_a_pass_writes_status_once_and_each_event_once(cluster: Cluster) -> None:
    await cluster.apply(btj("once"))
    ctx = build_context()
    try:
        reconciler = Reconciler(ctx, direct_events=True)
        first = await _one_pass(cluster, reconciler, "once")
        assert _status_writes(first) == 1, "the pass that creates the child writes status once"
        events = _events(first)
        assert len(_plan_events(first)) == 1 and sorted(events) == sorted(["Created", *_plan_events(first)])
        assert cluster.status("once")["phase"] == "Pending"
        # The next pass finds the child (ChildCreated says Exists now): one write, no Event; then nothing
        # changes: no write, and no Event of a cause the status already says.
        found = await _one_pass(cluster, reconciler, "once")
        assert _status_writes(found) == 1 and _events(found) == []
        assert (cluster.condition("once", "ChildCreated") or {}).get("reason") == "Exists"
        again = await _one_pass(cluster, reconciler, "once")
        assert _status_writes(again) == 0 and _events(again) == []
    finally:
        ctx.api.close()


def _plan_events(requests: list[Any]) -> list[str]:
    """The plan's provenance Event (PlanMeasured, PlanModelled, ...): one per plan."""
    return [reason for reason in _events(requests) if reason.startswith("Plan")]


async def test_a_refused_spec_says_so_once(cluster: Cluster) -> None:
    await cluster.apply(btj("bad", model={"preset": "gpt-7"}))
    ctx = build_context()
    try:
        reconciler = Reconciler(ctx, direct_events=True)
        first = await _one_pass(cluster, reconciler, "bad")
        assert _status_writes(first) == 1 and _events(first) == ["InvalidSpec"]
        assert cluster.status("bad")["phase"] == "Invalid"
        again = await _one_pass(cluster, reconciler, "bad")
        assert _status_writes(again) == 0 and _events(again) == []
    finally:
        ctx.api.close()


def _calls(requests: list[Any]) -> list[tuple[str | None, str]]:
    return [(verb_of(r), r.resource.plural if r.resource is not None else "") for r in requests]


async def test_a_pass_the_resync_loop_has_done_is_not_done_again(cluster: Cluster) -> None:
    # In a burst Kopf reaches a BTJ's create event late, after the resync loop has reconciled it, or runs
    # the create handler twice (its own patch seen late): the same pass would plan, render and read the
    # child again for nothing.
    await cluster.apply(btj("burst"))
    ctx, other_process = build_context(), build_context()
    try:
        await asyncio.to_thread(Resync(ctx, 60.0, LOG).pass_for, cluster.btj("burst") or {})
        uid = (cluster.btj("burst") or {})["metadata"]["uid"]
        assert cluster.job("burst") is not None and ctx.reconciled_at(uid) == 1

        def kopf_pass(context: Any, *, skip_done: bool) -> list[Any]:
            since = len(list(cluster.k.requests))
            body = cluster.btj("burst") or {}
            reconciler = Reconciler(context, direct_events=True)
            reconciler.reconcile(body, retry=0, logger=LOG, skip_done=skip_done)
            return _operator_requests(cluster, since)

        skipped = await asyncio.to_thread(kopf_pass, ctx, skip_done=True)
        assert _calls(skipped) == [("get", "blackwelltrainingjobs")]  # the fresh read, nothing else
        # A resume (after a restart) always runs the whole pass; so does another process's create pass.
        for context, skip_done in ((ctx, False), (other_process, True)):
            full = await asyncio.to_thread(kopf_pass, context, skip_done=skip_done)
            assert ("get", "pytorchjobs") in _calls(full)
        # Kopf running the create handler again in that other process (its own patch seen late): skipped.
        assert _calls(await asyncio.to_thread(kopf_pass, other_process, skip_done=True)) == [
            ("get", "blackwelltrainingjobs")
        ]
        # A spec the loop has not reconciled yet (generation 2) is reconciled by the create/update pass.
        await cluster.patch_spec("burst", {"training": {"sequenceLength": 4096, "steps": 10}})
        await asyncio.to_thread(kopf_pass, ctx, skip_done=True)
        assert cluster.status("burst")["observedGeneration"] == 2
    finally:
        ctx.api.close()
        other_process.api.close()
