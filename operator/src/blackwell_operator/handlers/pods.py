"""The worker watcher: a trainer pod's failed container becomes its BTJ's status.lastFailure and an Event;
its probe result becomes status.probe, a `Probed` Event, cluster-calibration samples and the plan's copy."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from blackwell_operator.calibration.cluster import ImplausibleSample, Sample
from blackwell_operator.calibration.learned_memory import MemoryReading
from blackwell_operator.handlers import cluster_calibration, retrying
from blackwell_operator.handlers.api import ApiError, resource_path
from blackwell_operator.handlers.btjstatus import CHILD_DELETED, btj_path, write_status_logged
from blackwell_operator.handlers.context import PODS, OperatorContext
from blackwell_operator.handlers.events import direct_events, post_event
from blackwell_operator.handlers.logs import Logger
from blackwell_operator.lifecycle.failures import (
    failure_changes,
    failure_key,
    is_permanent,
    stopped_on_permanent_error,
    stopping_child,
    worker_failure,
)
from blackwell_operator.lifecycle.memory_readings import oom_reading
from blackwell_operator.lifecycle.message import describe
from blackwell_operator.lifecycle.ownership import Lineage, lineage
from blackwell_operator.lifecycle.probe import config_map_copy, joined, probe_pass, probe_result_of
from blackwell_operator.lifecycle.replan import REPLANNED_REASON, oom_of, replacing_child
from blackwell_operator.lifecycle.writers import POD_WATCHER
from blackwell_operator.models.status import StatusChange
from blackwell_operator.render.kinds import ChildKind, job_kind
from blackwell_operator.render.pod import plan_config_map_name
from blackwell_operator.timefmt import now_rfc3339
from blackwell_trainer.plan.config import Plan, ProbeResult

WORKER_FAILED = "WorkerFailed"


def on_pod_event(
    ctx: OperatorContext, event_type: str | None, pod: Mapping[str, Any], logger: Logger
) -> None:
    """Record one pod's trainer failure and probe result on its BTJ (a no-op when there is none, it is
    not a worker of the BTJ's own child, or it is stored already)."""
    meta = pod.get("metadata") or {}
    uid = str(meta.get("uid") or "")
    if event_type == "DELETED":
        ctx.forget_pod(uid)
    else:
        ctx.note_pod(pod)  # for the stuck-pod sweep (being deleted) and the measure loop (running)
    failure, probe = worker_failure(pod), probe_result_of(pod)
    namespace = meta.get("namespace")
    if (failure is None and probe is None) or not namespace:
        return
    key = _seen_key(failure, probe)
    # Pods keep lastState.terminated in every later event: skip the BTJ read for a result already handled.
    if ctx.pod_failure_seen(uid, key):
        return
    try:
        found = pod_lineage(ctx, pod)
    except ApiError as exc:
        ctx.metrics.record_error(exc.metric_reason)
        logger.warning(f"Cannot check which job controls pod {namespace}/{meta.get('name')}: {exc}")
        ctx.note_unrecorded(PODS, uid, (event_type, pod))
        return  # the pod's next event, or the resync loop, tries again
    if found is None:
        # The trainer's labels, but no child of a BTJ controls it (made by hand, or forged), or it is not
        # what the child's controller makes (created before the child, or not from its template): its
        # termination message fails nothing, deletes nothing, re-plans nothing and teaches nothing.
        logger.warning(
            f"Pod {namespace}/{meta.get('name')} carries the trainer's labels but no BlackwellTrainingJob's "
            "job controls it, or it is not what that job's controller makes (created before the job, or not "
            "from its current pod template): its result is ignored"
        )
        ctx.remember_pod_failure(uid, key)
        ctx.note_unrecorded(PODS, uid, None)
        return
    # The probe's effects, then the one status write: a step that fails leaves the pod to be offered again
    # (its next event, or the resync loop: a completed pod sends none), and each step is idempotent. With
    # a probe result, under the BTJ's reconcile lock: a pass that read the status before the write would
    # render the plan ConfigMap without the result and undo its copy, with nothing left to redo it.
    with ctx.recreate_lock(found.btj_uid) if probe is not None else contextlib.nullcontext():
        done = (probe is None or apply_probe(ctx, namespace, found, pod, probe, logger)) and _record(
            ctx, namespace, found, pod, failure, probe, logger
        )
    if done:
        ctx.remember_pod_failure(uid, key)
    ctx.note_unrecorded(PODS, uid, None if done else (event_type, pod))


def _seen_key(failure: Mapping[str, Any] | None, probe: ProbeResult | None) -> tuple[str, str]:
    """What a pod's handled result is remembered by: its failure's identity and its probe line."""
    ended = "/".join(failure_key(failure) or ())
    return ended, probe.to_line() if probe is not None else ""


def _record(
    ctx: OperatorContext,
    namespace: str,
    found: Lineage,
    pod: Mapping[str, Any],
    failure: Mapping[str, Any] | None,
    probe: ProbeResult | None,
    logger: Logger,
) -> bool:
    """The pass's one status write (the failure and status.probe together), then the failure's Events
    and, for a permanent error, the child's deletion; False to try again on the pod's next event."""
    posted: dict[str, Any] = {}
    now = now_rfc3339()

    def update(btj: Mapping[str, Any]) -> StatusChange | None:
        changes, new = (None, False)
        if failure is not None:
            changes, new = failure_changes(btj, pod, failure, now=now, found=found)
        probed = probe_pass(btj, pod, probe, found=found, now=now) if probe is not None else None
        # Any attempt's: a write whose answer was lost has landed, and the next attempt finds it stored.
        posted.update(event=posted.get("event", False) or new, btj=btj)
        if new:  # the BTJ before the failure was stored: what its out-of-memory floor is taken against
            posted.setdefault("before", btj)
        return joined(changes, probed.change if probed is not None else None)

    done, written = write_status_logged(
        ctx, namespace, found.btj_name, update, POD_WATCHER, logger, purpose="record a worker's result"
    )
    if not done:
        return False  # logged; the pod's next event tries again
    if failure is None:
        return True
    btj = written or posted.get("btj")
    if btj is not None and posted.get("event"):  # written by this pass (its answer lost or not)
        _learn_oom(ctx, posted["before"], failure, now, logger)
        post_event(btj, WORKER_FAILED, describe(failure), warning=True)
        if replacing_child(btj.get("status") or {}):
            ctx.metrics.replans.inc()
            post_event(btj, REPLANNED_REASON, str(btj["status"].get("message", "")), warning=True)
    # Written, or nothing to write (stored already, older than the stored one, a predecessor's pod); a
    # child not deleted yet after a permanent error: the pod's next event tries again.
    return btj is None or not is_permanent(failure) or _stop_child(ctx, btj, logger)


def record_probe(
    ctx: OperatorContext,
    namespace: str,
    found: Lineage,
    pod: Mapping[str, Any],
    probe: ProbeResult,
    logger: Logger,
) -> bool:
    """A probe result a running pod serves (the measure loop reads it from the pod's metrics port while the
    first run goes on): taken exactly as one from a termination message, under the BTJ's reconcile lock,
    its Event written through the API (the loop runs outside Kopf's handlers); False to try again at the
    next reading."""
    with ctx.recreate_lock(found.btj_uid), direct_events(ctx.api):
        return apply_probe(ctx, namespace, found, pod, probe, logger) and _record(
            ctx, namespace, found, pod, None, probe, logger
        )


def apply_probe(
    ctx: OperatorContext,
    namespace: str,
    found: Lineage,
    pod: Mapping[str, Any],
    probe: ProbeResult,
    logger: Logger,
) -> bool:
    """A probe result new to the BTJ's status (lifecycle/probe.py decides): its calibration samples, the
    plan ConfigMap's copy and the `Probed` Event, before the status write that records it (so a status
    that says it means they were made). False when an API call failed: the pod's next event tries again."""
    try:
        btj = ctx.api.get(btj_path(namespace, found.btj_name))
    except ApiError as exc:
        ctx.metrics.record_error(exc.metric_reason)
        logger.warning(f"Cannot read BlackwellTrainingJob {namespace}/{found.btj_name}: {exc}")
        return False
    if btj is None:
        return True
    decided = probe_pass(btj, pod, probe, found=found, now=now_rfc3339())
    if decided.problem is not None:
        logger.warning(
            f"Not taking the probe result of pod {namespace}/{pod['metadata'].get('name')}: {decided.problem}"
        )
    if not decided.new:
        return True
    for line in decided.refused:
        ctx.metrics.record_error("ImplausibleSample")
        logger.warning(f"Not recording a probe reading in the cluster calibration: {line}")
    if not _teach(ctx, (*decided.samples, *decided.readings), logger):
        return False
    if decided.plan is not None and not _copy_plan(ctx, btj, decided.plan, logger):
        return False
    if decided.event is not None:
        if decided.warning:
            logger.warning(f"BlackwellTrainingJob {namespace}/{found.btj_name}: {decided.event[1]}")
        post_event(btj, *decided.event, warning=decided.warning)
    return True


def _teach(ctx: OperatorContext, samples: tuple[Sample | MemoryReading, ...], logger: Logger) -> bool:
    """Every probed family's sample and every memory reading into the cluster calibration, when one is
    kept."""
    where = cluster_calibration.calibration_namespace()
    if where is None:
        return True
    for sample in samples:
        try:
            cluster_calibration.record(ctx.api, where, sample, logger)
        except ImplausibleSample as exc:  # refused before; the store's own check, said once
            ctx.metrics.record_error("ImplausibleSample")
            logger.warning(f"Not recording a probe reading in the cluster calibration: {exc}")
        except cluster_calibration.UnreadableCalibration as exc:
            logger.warning(f"Not recording the probe of {sample.job}: {exc}")
            return True  # nothing to do until it is reset
        except ApiError as exc:
            ctx.metrics.record_error(exc.metric_reason)
            logger.warning(f"Cannot record the probe of {sample.job} in the cluster calibration: {exc}")
            return False
    return True


def _learn_oom(
    ctx: OperatorContext, btj: Mapping[str, Any], failure: Mapping[str, Any], now: str, logger: Logger
) -> None:
    """The lower bound a new out-of-memory failure sets on its GPU type's memory factor (from the BTJ as
    it was before the failure's status write), into the cluster calibration. Once, with the failure's
    Event; a write that fails is logged and not tried again (the job's own re-plan does not wait on it)."""
    result = oom_of(failure)
    reading = oom_reading(btj, result, now) if result is not None else None
    if reading is None or cluster_calibration.calibration_namespace() is None:
        return
    if not _teach(ctx, (reading,), logger):
        logger.warning(f"The out-of-memory bound of {reading.job} is not in the cluster calibration")


def _copy_plan(ctx: OperatorContext, btj: Mapping[str, Any], plan: Plan, logger: Logger) -> bool:
    """The plan ConfigMap with the probe's result (plan.probe.result), so a restart trains with it."""
    meta = btj["metadata"]
    path = resource_path("v1", "configmaps", meta["namespace"], plan_config_map_name(meta["name"]))

    def once() -> None:  # read and patch on what was read: a conflict, or a blip, reads again
        existing = ctx.api.get(path)
        if existing is None:
            return  # none yet: the reconciler renders it with the result from status.probe
        patch, problem = config_map_copy(existing, btj, plan)
        if problem is not None:
            logger.warning(problem)
        if patch is not None:
            ctx.api.patch(path, patch)

    try:
        retrying.call(f"the probe's copy in {path}", logger, once)
        return True
    except ApiError as exc:
        ctx.metrics.record_error(exc.metric_reason)
        logger.warning(f"Cannot copy the probe's choice into {path}: {exc}")
        return False


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


def _stop_child(ctx: OperatorContext, btj: Mapping[str, Any], logger: Logger) -> bool:
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
        # A warning: status holds the intent, and a later pass (this pod's next event, the resync loop, a
        # restarted operator) deletes the child (lifecycle/child_apply.StaleChild).
        logger.warning(f"Cannot delete {kind.kind} {child['name']} yet, a later pass does: {exc}")
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
