"""The stuck-pod sweep: trainer pods stuck Terminating on a lost node are force-deleted.

One loop for the operator (not a Kopf timer per BTJ: timers put Kopf's finalizer on every object they
match). Its candidates come from the pod watch (OperatorContext.note_pod); nodes are listed only when one
of them is overdue.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

from blackwell_operator.handlers.api import ApiError, resource_path
from blackwell_operator.handlers.btjstatus import btj_path
from blackwell_operator.handlers.context import OperatorContext
from blackwell_operator.handlers.events import create_event
from blackwell_operator.handlers.periodic import every
from blackwell_operator.lifecycle.stuck_pods import StuckPod, stuck_pods, terminating_overdue
from blackwell_operator.render.labels import JOB_NAME_LABEL
from blackwell_operator.settings import env_name, operator_environment

STUCK_POD_RELEASED = "StuckPodReleased"
TIMEOUT_ENV = env_name("stuck_pod_timeout_s")


def stuck_pod_timeout() -> float | None:
    """Seconds past a pod's deletion deadline before it is force-deleted (`BTJ_STUCK_POD_TIMEOUT_S`,
    default 300); None when set to 0 (off)."""
    return operator_environment().stuck_pod_timeout_s or None


def release_stuck_pods(ctx: OperatorContext, timeout_s: float, logger: Any, now: float | None = None) -> int:
    """Force-delete the trainer pods stuck Terminating on a gone or not-Ready node; how many."""
    now = time.time() if now is None else now
    candidates = terminating_overdue(ctx.terminating_pods(), now, timeout_s)
    if not candidates:
        return 0  # the usual case: nothing listed, nothing called
    try:
        nodes = ctx.api.list(resource_path("v1", "nodes", None))
    except ApiError as exc:
        ctx.metrics.record_error(exc.metric_reason)
        logger.warning(f"Cannot read the nodes of {len(candidates)} Terminating trainer pod(s): {exc}")
        return 0
    by_uid = {str((p.get("metadata") or {}).get("uid")): p for p in candidates}
    released = 0
    for stuck in stuck_pods(candidates, nodes, now, timeout_s):
        pod = by_uid[stuck.uid]
        namespace = str(pod["metadata"].get("namespace"))
        try:
            ctx.api.delete(
                resource_path("v1", "pods", namespace, stuck.name), uid=stuck.uid, grace_period_s=0
            )
        except ApiError as exc:
            ctx.metrics.record_error(exc.metric_reason)
            if exc.status == 409:  # a new pod of that name: ours is gone already
                ctx.forget_pod(stuck.uid)
            else:
                logger.warning(f"Cannot force-delete stuck pod {namespace}/{stuck.name}: {exc}")
            continue
        # Deleted now, or gone already (404): either way not a candidate any more.
        ctx.forget_pod(stuck.uid)
        released += 1
        logger.warning(f"{namespace}: {stuck.describe()}")
        _report(ctx, pod, stuck, logger)
    return released


def _report(ctx: OperatorContext, pod: Mapping[str, Any], stuck: StuckPod, logger: Any) -> None:
    """A Warning Event on the pod's BlackwellTrainingJob (best effort: the delete is what matters)."""
    meta = pod["metadata"]
    name = (meta.get("labels") or {}).get(JOB_NAME_LABEL)
    try:
        btj = ctx.api.get(btj_path(str(meta.get("namespace")), str(name))) if name else None
        if btj is not None:
            create_event(ctx.api, btj, STUCK_POD_RELEASED, stuck.describe(), warning=True)
    except ApiError as exc:
        ctx.metrics.record_error(exc.metric_reason)
        logger.warning(f"Cannot report the stuck pod {stuck.name} on BlackwellTrainingJob {name}: {exc}")


async def sweep_forever(ctx: OperatorContext, timeout_s: float, logger: Any) -> None:
    """Run the sweep a few times per timeout (a stuck pod is released within about 1.2 x the timeout)."""
    await every(
        min(60.0, timeout_s / 5),
        lambda: asyncio.to_thread(release_stuck_pods, ctx, timeout_s, logger),
        logger,
        "Stuck-pod sweep",
    )
