"""A child's status mirrored onto its BTJ: the phase, the child conditions, a deletion, the Event (pure).

handlers/children.py watches the jobs, writes what `mirror` returns and posts `phase_event`'s Event.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from blackwell_operator.lifecycle.child_apply import Notice
from blackwell_operator.lifecycle.child_record import CHILD_DELETED, deleted_child_uid, is_finished
from blackwell_operator.lifecycle.conditions import find_condition, remove_condition, set_condition
from blackwell_operator.lifecycle.failures import stopping_child
from blackwell_operator.lifecycle.message import set_message
from blackwell_operator.lifecycle.phase import TERMINAL_PHASES, child_conditions, child_headline, child_phase
from blackwell_operator.lifecycle.progress import as_status, finished
from blackwell_operator.lifecycle.replan import replacing_child
from blackwell_operator.lifecycle.status_read import read_status
from blackwell_operator.models.spec import KIND
from blackwell_operator.models.status import (
    BlackwellTrainingJobStatus,
    ChildReference,
    ConditionType,
    Phase,
    StatusChange,
)

# Phases worth an Event on the BTJ when the child enters them.
_EVENT_PHASES = {
    Phase.QUEUED: "Queued",
    Phase.RUNNING: "Running",
    Phase.RESTARTING: "Restarting",
    Phase.SUCCEEDED: "Succeeded",
    Phase.FAILED: "Failed",
}


@dataclass(frozen=True)
class Mirror:
    """What one child event does to its BTJ: the status change (None: nothing), the phase it moves from
    and to (a phase change is worth an Event), and whether the job had finished (a deletion)."""

    change: StatusChange | None
    before: Phase | None = None
    after: Phase | None = None
    finished: bool = False


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


def unrecorded(stored: BlackwellTrainingJobStatus, child_uid: str | None) -> bool:
    """Whether the status names no live child, so that this child (its BTJ's, by the owner reference) is
    one that reconcile made and has not written yet: none is recorded, or the recorded one was seen deleted
    and this is another, its replacement.

    Such a child can report before that write (its training operator is quick, the operator slow): its
    phase is recorded with its name, or reconcile would write the phase of its creation-time copy, and the
    phases that came before would never come again.
    """
    recorded = stored.child.uid if stored.child is not None else None
    return not recorded or (recorded != child_uid and deleted_child_uid(stored) == recorded)


def _replacement(stored: BlackwellTrainingJobStatus, child_uid: str | None) -> bool:
    """This child replaces the recorded one, which was seen deleted (`unrecorded`, with one on record)."""
    return stored.child is not None and bool(stored.child.uid) and unrecorded(stored, child_uid)


def _generation(btj: Mapping[str, Any], stored: BlackwellTrainingJobStatus) -> int | None:
    # Before reconcile's first status write there is no observedGeneration yet: the child was made from the
    # current spec, so stamp that generation (else these conditions would keep none).
    generation = stored.observed_generation or (btj.get("metadata") or {}).get("generation")
    return int(generation) if generation else None


def deleted_child_changes(
    btj: Mapping[str, Any], child: Mapping[str, Any], *, generation: int | None, now: str
) -> StatusChange:
    """The BTJ status keys that report its child's deletion (ChildCreated False, reason ChildDeleted).

    A child deleted right after it finished (ttlSecondsAfterFinished: 0, or a quick hand) may reach us
    only as its DELETED event, Kopf folding the final status update into it: the deleted object's own
    status then finishes the BTJ first, so that the job is not re-created and run again.
    """
    meta, kind = child["metadata"], child.get("kind", "job")
    stored = read_status(btj.get("status")).status
    change = StatusChange()
    conds, phase = stored.conditions, stored.phase
    being_deleted = bool(btj["metadata"].get("deletionTimestamp"))
    # The recorded child went before and this is its successor, deleted before reconcile recorded it.
    replacement = _replacement(stored, meta.get("uid"))
    # A re-plan deleted it: its own end is not the job's (a re-plan's record names the child it replaced).
    replaced = replacing_child(stored) and not replacement
    if (
        not being_deleted
        and not replaced
        and not is_finished(stored)
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
        change.phase = phase
    if being_deleted:
        what = f"{kind} {meta['name']} was deleted"
    elif phase in TERMINAL_PHASES:  # finished before, or by this deleted child's own final status
        what = f"{kind} {meta['name']} was deleted; the job had finished, so it is not re-created"
    elif replaced:
        what = f"{kind} {meta['name']} was deleted after running out of GPU memory; re-creating it re-planned"
    else:
        what = f"{kind} {meta['name']} was deleted; re-creating it"
    recorded = find_condition(conds, ConditionType.CHILD_CREATED)
    if (
        recorded is not None
        and recorded.reason == CHILD_DELETED
        and recorded.status == "False"
        and not replacement
    ):
        # Told again (the DELETED event after the one that marked it Terminating): the first record's
        # generation stands, so that an edit made in between reads as made after the deletion.
        generation = recorded.observed_generation or generation
    elif phase in TERMINAL_PHASES and not being_deleted:
        # The spec as it stands now (edits made while the operator was down included): only a later edit
        # runs the finished job again (child_record.runs_again).
        generation = int((btj.get("metadata") or {}).get("generation") or generation or 1)
    change.conditions = set_condition(
        conds, ConditionType.CHILD_CREATED, "False", CHILD_DELETED, f"{what}.", generation=generation, now=now
    )
    set_message(change, what, phase, stored.last_failure)
    if unrecorded(stored, meta.get("uid")):
        # Name the deleted child (a first one, or the replacement of one deleted before), so that a
        # reconcile that created it and writes status only now sees it is gone and keeps this report
        # (lifecycle/outcome.py) instead of claiming it exists.
        change.child = _reference(child)
    return change


def mirror(btj: Mapping[str, Any], child: Mapping[str, Any], *, going: bool, now: str) -> Mirror:
    """What a child's event (`going`: deleted, or being deleted) does to the status of `btj`, its owner."""
    owner = owner_reference(child) or {}
    if btj["metadata"].get("uid") != owner.get("uid"):
        return Mirror(None)  # a new BTJ with the old name: this child belongs to its deleted predecessor
    stored = read_status(btj.get("status")).status
    recorded, child_uid = (stored.child.uid if stored.child else None), child["metadata"].get("uid")
    if recorded and recorded != child_uid and not unrecorded(stored, child_uid):
        return Mirror(None)  # an earlier child's late event: the recorded one speaks for the BTJ
    generation = _generation(btj, stored)
    if going:
        # Reported here; the BTJ's own event handler (recreate-child) brings the child back when
        # wants_child_back says so. It runs in the BTJ's Kopf worker, serialised with reconcile.
        deleted = deleted_child_changes(btj, child, generation=generation, now=now)
        return Mirror(deleted, finished=(deleted.phase or stored.phase) in TERMINAL_PHASES)
    if recorded == child_uid and stopping_child(stored):
        # The worker watcher failed the BTJ, or re-planned it, and is deleting this child: its last phases
        # (Restarting, Failed while it goes) must not bring the job back to life or end it.
        return Mirror(None)
    return _phase_change(btj, child, stored, generation, now)


def _phase_change(
    btj: Mapping[str, Any],
    child: Mapping[str, Any],
    stored: BlackwellTrainingJobStatus,
    generation: int | None,
    now: str,
) -> Mirror:
    kind, name = str(child.get("kind", "job")), str(child["metadata"]["name"])
    phase, conds = child_conditions(
        stored.conditions,
        child.get("status"),
        generation=generation,
        now=now,
        queue_name=(btj.get("spec") or {}).get("queueName"),
        child_kind=kind,
    )
    child_uid = child["metadata"].get("uid")
    replacement = _replacement(stored, child_uid)
    if replacement:
        # The deleted child's report is over; ChildCreated is reconcile's to say of the new one (until it
        # has, the resync loop reconciles: lifecycle/convergence.py).
        conds = remove_condition(conds, ConditionType.CHILD_CREATED)
    running = find_condition(conds, ConditionType.RUNNING)
    change = StatusChange(phase=phase, conditions=conds)
    last_failure = stored.last_failure
    if replacement and last_failure is not None:
        # The deleted child's worker failure is not the new one's. This write names the new child, so
        # reconcile's write after it sees a known child and would not clear it (lifecycle/outcome.py).
        change.last_failure = last_failure = None
    # The worker watcher's lastFailure stays in the message while the job restarts or has failed.
    since = running.last_transition_time if running is not None else None
    set_message(
        change,
        child_headline(phase, kind, name, child.get("status")),
        phase,
        last_failure,
        since=since,
    )
    steps = stored.plan.steps if stored.plan is not None else 0
    done = finished(steps) if steps else None
    if (
        phase == Phase.SUCCEEDED
        and done is not None
        and (stored.progress is None or as_status(stored.progress) != as_status(done))
    ):
        # The last reading was up to a minute before the end: a finished job shows all its steps done.
        change.progress = done
    if unrecorded(stored, child_uid):
        # The child can report before the reconcile that created it has written status.child. Record which
        # child this phase came from, so that reconcile sees it as known and does not replace this newer
        # phase with the one derived from its creation-time copy of the child.
        change.child = _reference(child)
    return Mirror(change, before=stored.phase, after=phase)


def phase_event(result: Mirror, child: Mapping[str, Any]) -> Notice | None:
    """The Event of a phase change worth one (Queued, Running, Restarting, Succeeded, Failed), or None."""
    if result.after is None or result.before == result.after:
        return None
    reason = _EVENT_PHASES.get(result.after)
    if reason is None:
        return None
    kind, name = str(child.get("kind", "job")), str(child["metadata"]["name"])
    message = child_headline(result.after, kind, name, child.get("status"))
    return Notice(reason, message, warning=result.after in (Phase.FAILED, Phase.RESTARTING))
