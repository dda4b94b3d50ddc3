"""The child watcher: a PyTorchJob/HyperPodPyTorchJob status change becomes the owner BTJ's phase."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from blackwell_operator.handlers import finalizer
from blackwell_operator.handlers.api import ApiError
from blackwell_operator.handlers.btjstatus import CHILD_DELETED, is_finished, write_status_logged
from blackwell_operator.handlers.context import OperatorContext
from blackwell_operator.handlers.events import post_event
from blackwell_operator.handlers.reconcile import drop_supporting, supporting_of
from blackwell_operator.lifecycle.conditions import find_condition, set_condition
from blackwell_operator.lifecycle.failures import stopping_child
from blackwell_operator.lifecycle.message import set_message
from blackwell_operator.lifecycle.phase import TERMINAL_PHASES, child_conditions, child_headline, child_phase
from blackwell_operator.lifecycle.progress import as_status, finished
from blackwell_operator.lifecycle.replan import replacing_child
from blackwell_operator.lifecycle.status_read import read_status
from blackwell_operator.lifecycle.writers import CHILD_WATCHER
from blackwell_operator.models.spec import KIND
from blackwell_operator.models.status import ChildReference, ConditionType, Phase, StatusChange
from blackwell_operator.render.kinds import job_kind
from blackwell_operator.timefmt import now_rfc3339

# Phases worth an Event on the BTJ when the child enters them.
_EVENT_PHASES = {
    Phase.QUEUED: "Queued",
    Phase.RUNNING: "Running",
    Phase.RESTARTING: "Restarting",
    Phase.SUCCEEDED: "Succeeded",
    Phase.FAILED: "Failed",
}


def owner_reference(child: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The controlling BlackwellTrainingJob owner reference of a child, if any."""
    for ref in child.get("metadata", {}).get("ownerReferences") or []:
        if ref.get("kind") == KIND and ref.get("controller", True):
            return dict(ref)
    return None


def _reference(child: Mapping[str, Any]) -> ChildReference:
    meta = child["metadata"]
    return ChildReference(
        api_version=str(child.get("apiVersion") or ""),
        kind=str(child.get("kind", "job")),
        name=str(meta["name"]),
        uid=meta.get("uid"),
    )


def deleted_child_changes(
    btj: Mapping[str, Any], child: Mapping[str, Any], *, generation: Any, now: str
) -> StatusChange:
    """The BTJ status keys that report its child's deletion (ChildCreated False, reason ChildDeleted).

    A child deleted right after it finished (ttlSecondsAfterFinished: 0, or a quick hand) may reach us
    only as its DELETED event, Kopf folding the final status update into it: the deleted object's own
    status then finishes the BTJ first, so that the job is not re-created and run again.
    """
    meta, kind = child["metadata"], child.get("kind", "job")
    status = dict(btj.get("status") or {})
    change = StatusChange()
    stored = read_status(status).status
    conds = stored.conditions
    being_deleted = bool(btj["metadata"].get("deletionTimestamp"))
    replaced = replacing_child(status)  # a re-plan deleted it: its own end is not the job's
    if (
        not being_deleted
        and not replaced
        and not is_finished(status)
        and child_phase(child.get("status")) in TERMINAL_PHASES
    ):
        phase, conds = child_conditions(
            conds,
            child.get("status"),
            generation=generation,
            now=now,
            queue_name=(btj.get("spec") or {}).get("queueName"),
            child_kind=kind,
        )
        change.phase, status["phase"] = phase, phase.value
    if being_deleted:
        what = f"{kind} {meta['name']} was deleted"
    elif is_finished(status):
        what = f"{kind} {meta['name']} was deleted; the job had finished, so it is not re-created"
    elif replaced:
        what = f"{kind} {meta['name']} was deleted after running out of GPU memory; re-creating it re-planned"
    else:
        what = f"{kind} {meta['name']} was deleted; re-creating it"
    change.conditions = set_condition(
        conds, ConditionType.CHILD_CREATED, "False", CHILD_DELETED, f"{what}.", generation=generation, now=now
    )
    set_message(change, what, status.get("phase"), stored.last_failure)
    if not (status.get("child") or {}).get("uid"):
        # Name the deleted child, so that a reconcile that created it and writes status only now sees it
        # is gone and keeps this report (reconcile._write) instead of claiming it exists.
        change.child = _reference(child)
    return change


# Posts an Event about an object: (obj, reason, message, warning=...). Kopf's queue in the handlers; the
# API for callers outside Kopf (`btj release-children`).
EventPoster = Callable[..., None]


def on_child_event(
    ctx: OperatorContext,
    event_type: str | None,
    child: Mapping[str, Any],
    logger: Any,
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
    namespace, child_uid, kind = meta.get("namespace"), meta.get("uid"), child.get("kind", "job")
    transition: dict[str, Any] = {}
    ended: dict[str, Any] = {}

    def update(btj: Mapping[str, Any]) -> StatusChange | None:
        if btj["metadata"].get("uid") != owner.get("uid"):
            return None  # a new BTJ with the old name: this child belongs to its deleted predecessor
        status = dict(btj.get("status") or {})
        recorded = (status.get("child") or {}).get("uid")
        if recorded and recorded != child_uid:
            return None
        # Before reconcile's first status write there is no observedGeneration yet: the child was made from
        # the current spec, so stamp that generation (else these conditions would keep none).
        generation = status.get("observedGeneration") or btj["metadata"].get("generation")
        now = now_rfc3339()
        if going:
            # Reported here; the BTJ's own event handler (recreate-child) brings the child back when
            # wants_child_back says so. It runs in the BTJ's Kopf worker, serialised with reconcile.
            deleted = deleted_child_changes(btj, child, generation=generation, now=now)
            ended.update(
                btj=btj, finished=is_finished({**status, "phase": deleted.phase or status.get("phase")})
            )
            return deleted
        if recorded == child_uid and stopping_child(status):
            # The worker watcher failed the BTJ, or re-planned it, and is deleting this child: its last
            # phases (Restarting, Failed while it goes) must not bring the job back to life or end it.
            return None
        spec = btj.get("spec") or {}
        stored = read_status(status).status
        phase, conds = child_conditions(
            stored.conditions,
            child.get("status"),
            generation=generation,
            now=now,
            queue_name=spec.get("queueName"),
            child_kind=kind,
        )
        transition.update(old=status.get("phase"), new=phase, btj=btj)
        headline = child_headline(phase, kind, meta["name"], child.get("status"))
        running = find_condition(conds, ConditionType.RUNNING)
        change = StatusChange(phase=phase, conditions=conds)
        # The worker watcher's lastFailure stays in the message while the job restarts or has failed.
        since = running.last_transition_time if running is not None else None
        set_message(change, headline, phase, stored.last_failure, since=since)
        steps = ((status.get("plan") or {}).get("steps")) or 0
        if phase == Phase.SUCCEEDED and steps and status.get("progress") != as_status(finished(int(steps))):
            # The last reading was up to a minute before the end: a finished job shows all its steps done.
            change.progress = finished(int(steps))
        if not recorded:
            # The child can report before the reconcile that created it has written status.child. Record
            # which child this phase came from, so that reconcile sees it as known and does not replace
            # this newer phase with the one derived from its creation-time copy of the child.
            change.child = _reference(child)
        return change

    done, written = write_status_logged(
        ctx, namespace, owner["name"], update, CHILD_WATCHER, logger, purpose="mirror its child's status"
    )
    if done and going and ended.get("finished"):
        # The job had finished, so nothing will mount its plan again: what it referenced goes with it.
        btj = ended["btj"]
        objects = supporting_of(namespace, owner["name"], kind)
        drop_supporting(ctx.api, namespace, objects, btj["metadata"]["uid"], logger)
    if done and going and event_type != "DELETED" and finalizer.holds(child):
        # Its end is on the BTJ now (or there is no BTJ to record it on): let it go.
        _release(ctx, child, logger)
    if written is not None and transition and transition["old"] != transition["new"].value:
        reason = _EVENT_PHASES.get(transition["new"])
        if reason:
            message = child_headline(transition["new"], kind, meta["name"], child.get("status"))
            warning = transition["new"] in (Phase.FAILED, Phase.RESTARTING)
            post(written, reason, message, warning=warning)
    return done


def _release(ctx: OperatorContext, child: Mapping[str, Any], logger: Any) -> None:
    kind = job_kind(child.get("kind"))
    if kind is None:
        return
    try:
        finalizer.release(ctx.api, child, kind.plural, logger)
    except ApiError as exc:  # the child's next event (or the next operator start) tries again
        ctx.metrics.record_error(exc.metric_reason)
        logger.error(f"Cannot release {kind.kind} {child['metadata']['name']}: {exc}")
