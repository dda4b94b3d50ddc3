"""The watchers' events that did not go through, offered again by the resync loop, the object read afresh.

A watcher's status write can fail past the retry policy (an outage, the API server refusing for a while).
Kopf offers an event once; the object's next event would try again, but some never come: a completed
trainer pod whose termination message holds a probe result or an out-of-memory result, a child held
Terminating by the final-status finalizer until its end is recorded. The watchers keep such an event
(OperatorContext.note_unrecorded) and this offers it again, read afresh, until it goes through: the
watcher's step is an intent like a re-plan's, finished by a later pass, not lost with the request.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from blackwell_operator.handlers.api import ApiError, resource_path
from blackwell_operator.handlers.children import on_child_event
from blackwell_operator.handlers.context import CHILDREN, PODS, OperatorContext
from blackwell_operator.handlers.events import direct_events
from blackwell_operator.handlers.logs import Logger
from blackwell_operator.handlers.pods import on_pod_event
from blackwell_operator.render.kinds import job_kind


def _path(watcher: str, obj: Mapping[str, Any]) -> str | None:
    meta = obj.get("metadata") or {}
    if watcher == PODS:
        return resource_path("v1", "pods", meta.get("namespace"), str(meta.get("name")))
    kind = job_kind(obj.get("kind"))
    if kind is None:
        return None
    return resource_path(kind.api_version, kind.plural, meta.get("namespace"), str(meta.get("name")))


Event = tuple[str | None, Mapping[str, Any]]  # (Kopf's event type, the object)


def _now(ctx: OperatorContext, watcher: str, event: Event) -> Event | None:
    """The event as it would be now: the object read again (a newer copy of the same uid), or its
    deletion when it is gone; None when the read fails (the next round tries again)."""
    event_type, obj = event
    path = _path(watcher, obj)
    if path is None:
        return None
    fresh = ctx.api.get(path)
    uid = (obj.get("metadata") or {}).get("uid")
    if fresh is None or (fresh.get("metadata") or {}).get("uid") != uid:
        return "DELETED", obj
    return event_type if event_type != "DELETED" else None, fresh


def offer_again(ctx: OperatorContext, logger: Logger) -> int:
    """Each kept event once more (in a worker thread, its Events through the API); how many were
    offered."""
    with direct_events(ctx.api):
        return _offer(ctx, logger)


def _offer(ctx: OperatorContext, logger: Logger) -> int:
    offered = 0
    for watcher in (CHILDREN, PODS):
        for event in ctx.unrecorded(watcher):
            try:
                now = _now(ctx, watcher, event)
            except ApiError as exc:
                ctx.metrics.record_error(exc.metric_reason)
                continue
            if now is None:
                continue
            event_type, obj = now
            uid = str((obj.get("metadata") or {}).get("uid") or "")
            offered += 1
            if watcher == PODS:
                on_pod_event(ctx, event_type, obj, logger)  # keeps or forgets it itself
            else:
                done = on_child_event(ctx, event_type, obj, logger)
                ctx.note_unrecorded(CHILDREN, uid, None if done else (event_type, obj))
    return offered
