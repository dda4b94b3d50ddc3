"""The worker watcher: a trainer pod's failed container becomes its BTJ's status.lastFailure and an Event."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from blackwell_operator.handlers.api import ApiError, resource_path
from blackwell_operator.handlers.btjstatus import CHILD_DELETED, write_status_logged
from blackwell_operator.handlers.context import OperatorContext
from blackwell_operator.handlers.events import post_event
from blackwell_operator.lifecycle.failures import (
    failure_changes,
    failure_key,
    is_permanent,
    stopped_on_permanent_error,
    stopping_child,
    worker_failure,
)
from blackwell_operator.lifecycle.message import describe
from blackwell_operator.lifecycle.ownership import Lineage, lineage
from blackwell_operator.lifecycle.replan import REPLANNED_REASON, replacing_child
from blackwell_operator.lifecycle.writers import POD_WATCHER
from blackwell_operator.models.status import StatusChange
from blackwell_operator.render.kinds import ChildKind, job_kind
from blackwell_operator.timefmt import now_rfc3339

WORKER_FAILED = "WorkerFailed"


def on_pod_event(ctx: OperatorContext, event_type: str | None, pod: Mapping[str, Any], logger: Any) -> None:
    """Record one pod's trainer failure on its BTJ (a no-op when there is none or it is stored already)."""
    meta = pod.get("metadata") or {}
    uid = str(meta.get("uid") or "")
    if event_type == "DELETED":
        ctx.forget_pod(uid)
    else:
        ctx.note_pod(pod)  # for the stuck-pod sweep (being deleted) and the measure loop (running)
    failure = worker_failure(pod)
    namespace = meta.get("namespace")
    if failure is None or not namespace:
        return
    key = failure_key(failure)
    # Pods keep lastState.terminated in every later event: skip the BTJ read for a failure already handled.
    if ctx.pod_failure_seen(uid, key):
        return
    try:
        found = pod_lineage(ctx, pod)
    except ApiError as exc:
        ctx.metrics.record_error(exc.metric_reason)
        logger.warning(f"Cannot check which job controls pod {namespace}/{meta.get('name')}: {exc}")
        return  # the pod's next event tries again
    if found is None:
        # The trainer's labels, but no child of a BTJ controls it (made by hand, or forged): its
        # termination message fails nothing, deletes nothing and re-plans nothing.
        logger.warning(
            f"Pod {namespace}/{meta.get('name')} carries the trainer's labels but no BlackwellTrainingJob's "
            "job controls it: its result is ignored"
        )
        ctx.remember_pod_failure(uid, key)
        return
    name = found.btj_name
    posted: dict[str, Any] = {}

    def update(btj: Mapping[str, Any]) -> StatusChange | None:
        changes, new = failure_changes(btj, pod, failure, now=now_rfc3339(), found=found)
        posted.update(event=new, btj=btj)
        return changes

    done, written = write_status_logged(
        ctx, namespace, name, update, POD_WATCHER, logger, purpose="record a worker failure"
    )
    if not done:
        return  # logged; the pod's next event tries again
    if written is not None and posted.get("event"):
        post_event(written, WORKER_FAILED, describe(failure), warning=True)
        if replacing_child(written.get("status") or {}):
            ctx.metrics.replans.inc()
            post_event(written, REPLANNED_REASON, str(written["status"].get("message", "")), warning=True)
    btj = written or posted.get("btj")
    if btj is not None and is_permanent(failure) and not _stop_child(ctx, btj, logger):
        return  # the child is not deleted yet: the pod's next event tries again
    # Written, or nothing to write (stored already, older than the stored one, a predecessor's pod).
    ctx.remember_pod_failure(uid, key)


def pod_lineage(ctx: OperatorContext, pod: Mapping[str, Any]) -> Lineage | None:
    """The pod's verified owner chain (lifecycle/ownership.py), read through the API once per pod; raises
    ApiError when a read fails (nothing is concluded then)."""
    uid = str((pod.get("metadata") or {}).get("uid") or "")
    known = ctx.lineage_of(uid) if uid else None
    if known is not None:
        return known

    def read(kind: ChildKind, namespace: str, name: str) -> Mapping[str, Any] | None:
        return ctx.api.get(resource_path(kind.api_version, kind.plural, namespace, name))

    found = lineage(pod, read)
    if found is not None and uid:
        ctx.remember_lineage(uid, found)
    return found


def _stop_child(ctx: OperatorContext, btj: Mapping[str, Any], logger: Any) -> bool:
    """Delete the child of a BTJ stopped on a permanent error (its GPUs are freed), or one a re-plan
    replaces; False to try again.

    The status is written first, so the child's deletion reads as the end of a failed job: neither the
    child watcher nor recreate-child brings it back, and only a spec change starts a new one. After a
    re-plan it reads as a child to re-create: recreate-child makes the new one from status.plan's plan.
    """
    status = btj.get("status") or {}
    child = status.get("child") or {}
    kind = job_kind(child.get("kind"))
    if not stopping_child(status) or kind is None or not child.get("name"):
        return True
    path = resource_path(kind.api_version, kind.plural, btj["metadata"]["namespace"], child["name"])
    try:
        deleted = ctx.api.delete(path, uid=child.get("uid"))
    except ApiError as exc:
        ctx.metrics.record_error(exc.metric_reason)
        if exc.status == 409:
            return True  # a newer child of that name (a spec change re-created it): not ours to stop
        logger.error(f"Cannot delete {kind.kind} {child['name']} after a permanent error: {exc}")
        return False
    if deleted and not stopped_on_permanent_error(status):
        post_event(
            btj,
            CHILD_DELETED,
            f"Deleted {kind.kind} {child['name']}: it ran out of GPU memory; it is re-created with the new "
            "plan",
        )
    elif deleted:
        post_event(
            btj,
            CHILD_DELETED,  # the Event says the same as the ChildCreated condition's reason
            f"Deleted {kind.kind} {child['name']}: a worker ended on a permanent error, which no restart "
            "can fix; fix the spec and apply it again",
            warning=True,
        )
    return True
