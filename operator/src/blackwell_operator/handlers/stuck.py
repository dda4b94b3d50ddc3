"""The stuck-pod sweep: trainer pods stuck Terminating on a lost node are force-deleted.

One loop for the operator (not a Kopf timer per BTJ: timers put Kopf's finalizer on every object they
match). Its candidates come from the pod watch (OperatorContext.note_pod); nodes are listed only when one
of them is overdue. A stuck pod is force-deleted, and reported on its BTJ, only when its owner chain leads,
uid by uid, to that BTJ's own child, the check a pod's result passes (handlers/pods.py): one that merely
carries the trainer's labels is left alone, logged once, and named in at most one StuckPodIgnored Event per
BTJ an hour.
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
from blackwell_operator.handlers.logs import Logger
from blackwell_operator.handlers.periodic import every
from blackwell_operator.handlers.pods import pod_lineage
from blackwell_operator.lifecycle.failures import belongs_to
from blackwell_operator.lifecycle.stuck_pods import StuckPod, stuck_pods, terminating_overdue
from blackwell_operator.render.labels import JOB_NAME_LABEL
from blackwell_operator.settings import env_name, operator_environment

STUCK_POD_RELEASED = "StuckPodReleased"
STUCK_POD_IGNORED = "StuckPodIgnored"
# At most one StuckPodIgnored Event per BTJ in this many seconds: whoever may create pods in the namespace
# could otherwise flood the BTJ's Events with pods of its labels.
IGNORED_EVENT_INTERVAL_S = 3600.0
TIMEOUT_ENV = env_name("stuck_pod_timeout_s")


def stuck_pod_timeout() -> float | None:
    """Seconds past a pod's deletion deadline before it is force-deleted (`BTJ_STUCK_POD_TIMEOUT_S`,
    default 300); None when set to 0 (off)."""
    return operator_environment().stuck_pod_timeout_s or None


def release_stuck_pods(
    ctx: OperatorContext, timeout_s: float, logger: Logger, now: float | None = None
) -> int:
    """Force-delete the trainer pods stuck Terminating on a gone or not-Ready node; how many."""
    now = time.time() if now is None else now
    overdue = terminating_overdue(ctx.terminating_pods(), now, timeout_s)
    candidates = [p for p in overdue if not ctx.untraced(str((p.get("metadata") or {}).get("uid")))]
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
            btj = _owning_btj(ctx, pod)
        except ApiError as exc:
            ctx.metrics.record_error(exc.metric_reason)
            logger.warning(f"Cannot check which job controls stuck pod {namespace}/{stuck.name}: {exc}")
            continue  # the next sweep tries again
        if btj is None:
            _ignore(ctx, pod, stuck, logger, now)
            continue
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
        _report(ctx, btj, stuck, STUCK_POD_RELEASED, stuck.describe(), logger)
    return released


def _owning_btj(ctx: OperatorContext, pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The BTJ whose own child controls `pod` (its verified owner chain, lifecycle/ownership.py); None for
    a pod no child of a BTJ controls. Raises ApiError when a read fails (nothing is concluded then)."""
    found = pod_lineage(ctx, pod)
    if found is None:
        return None
    btj = ctx.api.get(btj_path(str(pod["metadata"].get("namespace")), found.btj_name))
    return btj if btj is not None and belongs_to(pod, btj, found) else None


def _ignore(
    ctx: OperatorContext, pod: Mapping[str, Any], stuck: StuckPod, logger: Logger, now: float
) -> None:
    """A stuck pod with the trainer's labels that no child of a BTJ controls: left alone, said once."""
    ctx.remember_untraced(stuck.uid)
    meta = pod["metadata"]
    namespace, name = str(meta.get("namespace")), (meta.get("labels") or {}).get(JOB_NAME_LABEL)
    logger.warning(
        f"Pod {namespace}/{stuck.name} carries the trainer's labels and is stuck Terminating, but no "
        "BlackwellTrainingJob's job controls it: not force-deleted"
    )
    try:
        btj = ctx.api.get(btj_path(namespace, str(name))) if name else None
    except ApiError as exc:
        ctx.metrics.record_error(exc.metric_reason)
        return  # the log says it; the Event is a courtesy
    uid = str(((btj or {}).get("metadata") or {}).get("uid") or "")
    if btj is not None and uid and ctx.may_report_ignored(uid, now, IGNORED_EVENT_INTERVAL_S):
        _report(ctx, btj, stuck, STUCK_POD_IGNORED, stuck.describe_ignored(namespace), logger)


def _report(
    ctx: OperatorContext, btj: Mapping[str, Any], stuck: StuckPod, reason: str, message: str, logger: Logger
) -> None:
    """A Warning Event on the BlackwellTrainingJob (best effort: the delete is what matters)."""
    try:
        create_event(ctx.api, btj, reason, message, warning=True)
    except ApiError as exc:
        ctx.metrics.record_error(exc.metric_reason)
        name = (btj.get("metadata") or {}).get("name")
        logger.warning(f"Cannot report the stuck pod {stuck.name} on BlackwellTrainingJob {name}: {exc}")


async def sweep_forever(ctx: OperatorContext, timeout_s: float, logger: Logger) -> None:
    """Run the sweep a few times per timeout (a stuck pod is released within about 1.2 x the timeout)."""
    await every(
        min(60.0, timeout_s / 5),
        lambda: asyncio.to_thread(release_stuck_pods, ctx, timeout_s, logger),
        logger,
        "Stuck-pod sweep",
    )
