"""The worker watcher: a trainer pod's failed container becomes its BTJ's status.lastFailure and an Event."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from blackwell_operator.failures import describe, failure_changes, failure_key, worker_failure
from blackwell_operator.handlers.api import ApiError
from blackwell_operator.handlers.btjstatus import StatusUpdate, write_status
from blackwell_operator.handlers.context import OperatorContext
from blackwell_operator.handlers.events import post_event
from blackwell_operator.render.labels import JOB_NAME_LABEL

WORKER_FAILED = "WorkerFailed"


def on_pod_event(ctx: OperatorContext, event_type: str | None, pod: Mapping[str, Any], logger: Any) -> None:
    """Record one pod's trainer failure on its BTJ (a no-op when there is none or it is stored already)."""
    meta = pod.get("metadata") or {}
    uid = str(meta.get("uid") or "")
    if event_type == "DELETED":
        ctx.forget_pod(uid)
    failure = worker_failure(pod)
    name = (meta.get("labels") or {}).get(JOB_NAME_LABEL)
    namespace = meta.get("namespace")
    if failure is None or not name or not namespace:
        return
    key = failure_key(failure)
    # Pods keep lastState.terminated in every later event: skip the BTJ read for a failure already handled.
    if ctx.pod_failure_seen(uid, key):
        return
    posted: dict[str, Any] = {}

    def update(btj: Mapping[str, Any]) -> dict[str, Any] | None:
        changes, new = failure_changes(btj, pod, failure)
        posted["event"] = new
        return changes

    done, written = _write(ctx, namespace, name, update, logger)
    if not done:
        return  # logged; the pod's next event tries again
    # Written, or nothing to write (stored already, older than the stored one, a predecessor's pod).
    ctx.remember_pod_failure(uid, key)
    if written is not None and posted.get("event"):
        post_event(written, WORKER_FAILED, describe(failure), warning=True)


def _write(
    ctx: OperatorContext, namespace: str, name: str, update: StatusUpdate, logger: Any, attempts: int = 6
) -> tuple[bool, dict[str, Any] | None]:
    """(whether the write went through or had nothing to do, the BTJ written); event handlers get no
    retries from Kopf, so transient API errors are retried here, with backoff."""
    for attempt in range(attempts):
        try:
            return True, write_status(ctx.api, namespace, name, update)
        except ApiError as exc:
            ctx.metrics.record_error(exc.metric_reason)
            if not exc.retryable or attempt == attempts - 1:
                logger.error(
                    f"Cannot record a worker failure on BlackwellTrainingJob {namespace}/{name}: {exc}"
                )
                return False, None
            time.sleep(min(0.1 * 2**attempt, 5.0))
    return False, None
