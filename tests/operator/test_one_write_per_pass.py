"""A reconcile pass writes status once and posts each Event once (issue 23), against the emulated API server.

The real Reconciler, without Kopf: each pass is called directly (as the resync loop calls it), so that the
requests counted are this pass's alone (no watcher writes in between).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kmock

from blackwell_operator.handlers.reconcile import Reconciler
from blackwell_operator.handlers.runtime import build_context
from tests.operator.harness import Cluster, btj, from_operator

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
