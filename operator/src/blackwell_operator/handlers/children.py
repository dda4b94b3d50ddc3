"""The child watcher: a job's status change becomes the owner BTJ's phase (lifecycle/child_mirror.py)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from blackwell_operator.handlers import finalizer
from blackwell_operator.handlers.api import ApiError
from blackwell_operator.handlers.btjstatus import write_status_logged
from blackwell_operator.handlers.child_calls import drop_supporting, supporting_of
from blackwell_operator.handlers.context import OperatorContext
from blackwell_operator.handlers.events import post_event
from blackwell_operator.handlers.logs import Logger
from blackwell_operator.lifecycle.child_mirror import Mirror, mirror, owner_reference, phase_event
from blackwell_operator.lifecycle.writers import CHILD_WATCHER
from blackwell_operator.models.status import StatusChange
from blackwell_operator.render.kinds import job_kind
from blackwell_operator.timefmt import now_rfc3339

# Posts an Event about an object: (obj, reason, message, warning=...). Kopf's queue in the handlers; the
# API for callers outside Kopf (`btj release-children`).
EventPoster = Callable[..., None]


def on_child_event(
    ctx: OperatorContext,
    event_type: str | None,
    child: Mapping[str, Any],
    logger: Logger,
    *,
    post: EventPoster = post_event,
) -> bool:
    """Mirror one child event onto its owner BTJ's status (a no-op when nothing changes).

    Returns whether that went through (or there was nothing to record, or nowhere to record it): False
    when the status write failed, and the child's end may not be on its BTJ yet.
    """
    owner = owner_reference(child)
    meta = child["metadata"]
    # Deleted, or being deleted and held by our finalizer until its end is recorded: a deletion either way.
    going = event_type == "DELETED" or bool(meta.get("deletionTimestamp"))
    if owner is None:
        if going and finalizer.holds(child):
            _release(ctx, child, logger)  # nothing to record it on: never keep it from going
        return True
    namespace, kind = str(meta.get("namespace")), str(child.get("kind", "job"))
    seen: list[Mirror] = []  # what the last write attempt computed

    def update(btj: Mapping[str, Any]) -> StatusChange | None:
        seen[:] = [mirror(btj, child, going=going, now=now_rfc3339())]
        return seen[0].change

    done, written = write_status_logged(
        ctx, namespace, owner["name"], update, CHILD_WATCHER, logger, purpose="mirror its child's status"
    )
    if done and going and seen and seen[0].finished:
        # The job had finished, so nothing will mount its plan again: what it referenced goes with it.
        objects = supporting_of(namespace, owner["name"], kind)
        drop_supporting(ctx.api, namespace, objects, str(owner.get("uid")), logger)
    if done and going and event_type != "DELETED" and finalizer.holds(child):
        # Its end is on the BTJ now (or there is no BTJ to record it on): let it go.
        _release(ctx, child, logger)
    notice = phase_event(seen[0], child) if written is not None and seen else None
    if notice is not None and written is not None:
        post(written, notice.reason, notice.message, warning=notice.warning)
    return done


def _release(ctx: OperatorContext, child: Mapping[str, Any], logger: Logger) -> None:
    kind = job_kind(child.get("kind"))
    if kind is None:
        return
    try:
        finalizer.release(ctx.api, child, kind.plural, logger)
    except ApiError as exc:  # the child's next event (or the next operator start) tries again
        ctx.metrics.record_error(exc.metric_reason)
        logger.error(f"Cannot release {kind.kind} {child['metadata']['name']}: {exc}")
