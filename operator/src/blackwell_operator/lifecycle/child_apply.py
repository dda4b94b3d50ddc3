"""Create, patch or leave a BTJ's child: one outcome from what a pass read, with the conditions and Events it
implies (pure; handlers/reconcile.py makes the calls)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any

from blackwell_operator.lifecycle.child_record import (
    CHILD_DELETED,
    deleted_child_uid,
    holds,
    is_finished,
    owned_by,
    render_hash,
    runs_again,
)
from blackwell_operator.lifecycle.conditions import ConditionChange
from blackwell_operator.lifecycle.phase import TERMINAL_PHASES, can_patch_in_place, child_phase
from blackwell_operator.lifecycle.replan import replaced_child_uid, replacing_child, resized_child
from blackwell_operator.lifecycle.status_read import StatusLike, typed
from blackwell_operator.models.status import ConditionType
from blackwell_operator.render import trainjob
from blackwell_operator.render.kinds import ChildKind
from blackwell_operator.render.labels import PROPAGATED_ANNOTATION, RENDER_HASH_ANNOTATION, recorded_keys

APPLIED = ConditionChange(ConditionType.SPEC_APPLIED, "True", "Applied", "The child matches the spec.")
# ChildCreated / SpecApplied reasons when the API server refuses a create or a patch of a child.
CREATE_REFUSED = "CreateRefused"
PATCH_REFUSED = "PatchRefused"
# How often the resync loop tries a refused child again (handlers/resync.py), as a refusal's message says.
RETRY_INTERVAL_HINT = "BTJ_CHILD_RETRY_INTERVAL_S, 60 s by default"


@dataclass(frozen=True)
class Notice:
    """An Event an outcome posts on the BTJ.

    `once`: the condition that says the same cause; the Event is posted only when the stored condition
    does not already carry this reason and message (one Event per cause, not one per pass). None: posted
    each time the outcome's calls succeed (an action: a create, a patch).
    """

    reason: str
    message: str
    warning: bool = False
    once: str | None = None


@dataclass(frozen=True)
class Effects:
    """What an outcome records once its calls have gone through."""

    conditions: tuple[ConditionChange, ...] = ()
    events: tuple[Notice, ...] = ()
    write_plan: bool = True  # False: status.plan keeps describing what actually runs
    recreated: bool = False  # a recorded child came back (the children_recreated counter)


@dataclass(frozen=True)
class Wanted:
    """What this pass rendered, and for whom."""

    kind: ChildKind
    job: Mapping[str, Any]  # the rendered job, its finalizer added
    config_map: str  # the plan ConfigMap's name
    owner_uid: str  # the BTJ's uid
    generation: int  # the BTJ's metadata.generation
    plan_summary: str  # one line: the plan's choices and prediction
    resume_note: str  # where a re-created job's training continues from
    # The hash an operator version before the shape hash stamped on this render (it counted the BTJ's
    # labels): a child made then holds this render too (render.children.labelled_hash).
    earlier_hash: str | None = None

    @property
    def name(self) -> str:
        return str(self.job["metadata"]["name"])

    @property
    def what(self) -> str:
        """ChildCreated's message: the job and its ConfigMap."""
        return f"{self.kind.kind} {self.name} and ConfigMap {self.config_map}"


class Creation(Enum):
    """Why a child is created: the first one, or one that replaces a recorded child that is gone."""

    FIRST = "first"
    AFTER_DELETION = "the previous one was deleted before the job finished"
    AFTER_OUT_OF_MEMORY = "the previous one ran out of GPU memory; re-planned"
    AFTER_RESIZE = "the healthy nodes changed; re-planned for another node count"


@dataclass(frozen=True)
class NameConflict:
    """An object with the child's name exists and is not this BTJ's: the BTJ fails, nothing is touched."""

    message: str


@dataclass(frozen=True)
class PreviousDeleting:
    """The previous child is still Terminating: its final status is being recorded (handlers/children.py)
    and a new child can take the name only once it is gone; the pass ends in a conflict and is retried.

    `release`: the BTJ already records the deletion (or its end), so the watcher's release went missing:
    the pass removes the finalizer itself.
    """

    release: bool
    message: str


@dataclass(frozen=True)
class StaleChild:
    """The child found is the one a re-plan replaces (its record in status.planHistory, lifecycle/replan.py):
    delete it, by its uid; once it is gone a pass creates the planned one. The pass ends in a conflict after
    the DELETE and is retried, as after PreviousDeleting."""

    uid: str
    message: str
    resized: bool = False  # the re-plan is a resize (else an out-of-memory one)

    def event(self, kind: str, name: str) -> str:
        """The ChildDeleted Event's message once the stale child is deleted: why, as the DELETE made on
        time says it (handlers/elastic.py, handlers/pods.py), so that a late one reads the same."""
        why = "the job is resized" if self.resized else "it ran out of GPU memory"
        return f"Deleted {kind} {name}: {why}; it is re-created with the new plan (status.planHistory)"


@dataclass(frozen=True)
class FinishedChildGone:
    """The finished job's child is gone (deleted by hand, or by a TTL) and the spec is unchanged: running it
    again would repeat finished training. Nothing is created; the supporting objects are dropped (a crash
    between a create and the next pass can have left them)."""

    effects: Effects


@dataclass(frozen=True)
class Create:
    """No child exists: create the supporting objects and the job together.

    `previous_uid`: the recorded child (gone), whose place the new one takes; `why` says why it went.
    The create may find the job made already (a lost answer, a restart): `made` gives the effects either way.
    """

    wanted: Wanted
    previous_uid: str | None
    why: Creation

    def made(self, created: bool, child_uid: str | None) -> Effects:
        """The effects once the job exists; `created`: this pass made it (else it found it, on a 409)."""
        reason = "Created" if created else "Exists"
        conditions: tuple[ConditionChange, ...] = (
            ConditionChange(ConditionType.CHILD_CREATED, "True", reason, self.wanted.what),
            APPLIED,
        )
        wanted = self.wanted
        if created and self.previous_uid and self.previous_uid != child_uid:
            # A re-creation, from the current spec: the trainer resumes from the checkpoint folder.
            why = self.why.value
            if self.why in (Creation.AFTER_OUT_OF_MEMORY, Creation.AFTER_RESIZE):
                why += f": {wanted.plan_summary}"
            message = (
                f"Re-created {wanted.kind.kind} {wanted.name} ({why}) from the current spec, generation "
                f"{wanted.generation}; {wanted.resume_note}"
            )
            return Effects(conditions, (Notice("ChildRecreated", message),), recreated=True)
        if created:
            message = f"Created {wanted.kind.kind} {wanted.name}: {wanted.plan_summary}"
            return Effects(conditions, (Notice("Created", message),))
        return Effects(conditions)


@dataclass(frozen=True)
class Found:
    """The child exists and is ours. `found` is recorded before any call; `hold`: add the final-status
    finalizer first (a child made by an operator version without it, or by hand). `relabel`: the merge
    patch that brings its labels to the BTJ's (label_patch), whatever its phase; None when they match."""

    hold: bool
    found: ConditionChange
    relabel: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class UpToDate(Found):
    """The child holds this render: make sure its supporting objects do too (after a crash or a hand
    deletion the job may be there without them)."""

    effects: Effects = Effects((APPLIED,))


@dataclass(frozen=True, kw_only=True)
class PatchInPlace(Found):
    """The child has not started: patch it to this render (after its supporting objects). `patch` is a
    merge patch: labels, annotations and the spec; only the metadata for a TrainJob, whose spec is immutable
    (its TrainingRuntime, a supporting object, carries the change)."""

    patch: Mapping[str, Any]
    effects: Effects


@dataclass(frozen=True, kw_only=True)
class CannotChange(Found):
    """The render differs and the child cannot take it in place; the running job is left alone.

    `reason`: JobFinished, TrainJobImmutable (not started, but its node or process count changed) or
    RunningJobImmutable.
    """

    reason: str
    message: str
    effects: Effects


Outcome = (
    NameConflict
    | PreviousDeleting
    | StaleChild
    | FinishedChildGone
    | Create
    | UpToDate
    | PatchInPlace
    | CannotChange
)


def conflict_message(kind: str, name: str) -> str:
    """Why an object of the child's (or a supporting object's) name that is not ours stops the BTJ."""
    return (
        f"a {kind} named {name} exists and is not owned by this BlackwellTrainingJob. "
        "Fix: delete it, or rename the BlackwellTrainingJob"
    )


def still_deleting(kind: str, name: str) -> str:
    """The conflict's text while the previous child is Terminating."""
    return f"the previous {kind} {name} is still being deleted"


def refusal(what: str, creating: bool, error: str) -> ConditionChange:
    """The condition that says the API server refused `what` (a call of this pass) with `error`: ChildCreated
    for a create, SpecApplied for a patch of what exists."""
    message = (
        f"the API server refused {what}: {error}. Fix the cause (an admission webhook, RBAC, a quota) "
        f"or the spec; the operator tries again with backoff (at most every {RETRY_INTERVAL_HINT})"
    )
    if creating:
        return ConditionChange(ConditionType.CHILD_CREATED, "False", CREATE_REFUSED, message)
    return ConditionChange(ConditionType.SPEC_APPLIED, "False", PATCH_REFUSED, message)


def immutable_change(kind: ChildKind, existing: Mapping[str, Any], job: Mapping[str, Any]) -> bool:
    """Whether the new render changes a field of the child the API server never lets change (a TrainJob's
    runtimeRef and trainer: node and process counts)."""
    if kind.kind != trainjob.KIND:
        return False
    old, new = existing.get("spec") or {}, job.get("spec") or {}
    return any(old.get(key) != new.get(key) for key in ("runtimeRef", "trainer"))


def resume_note(checkpoint_path: str | None) -> str:
    """Where the re-created job's training continues from."""
    if checkpoint_path:
        return f"training resumes from its last checkpoint in {checkpoint_path}"
    return "spec.training.checkpoint.path is not set, so training starts again from step 0"


def in_place_patch(kind: ChildKind, job: Mapping[str, Any]) -> dict[str, Any]:
    """The merge patch that brings a child that has not started to the render `job`."""
    patch: dict[str, Any] = {
        "metadata": {
            "labels": job["metadata"].get("labels"),
            "annotations": job["metadata"].get("annotations"),
        },
    }
    if kind.kind != trainjob.KIND:  # a TrainJob's spec is immutable; its runtime was patched
        patch["spec"] = job["spec"]
    return patch


def label_patch(existing: Mapping[str, Any], obj: Mapping[str, Any]) -> dict[str, Any] | None:
    """The merge patch that brings an existing child's (or supporting object's) labels to the render `obj`:
    each wanted label set, each key the BTJ gave it before (PROPAGATED_ANNOTATION) and no longer does
    removed, that record renewed; None when nothing differs. Labels are metadata: they change nothing a
    job runs, so a running or finished job takes them too. A label another controller added stays."""
    found = existing.get("metadata", {})
    have, want = found.get("labels") or {}, obj["metadata"].get("labels") or {}
    had_record = (found.get("annotations") or {}).get(PROPAGATED_ANNOTATION)
    record = (obj["metadata"].get("annotations") or {}).get(PROPAGATED_ANNOTATION)
    dropped = recorded_keys(found.get("annotations")) - set(want)
    labels: dict[str, str | None] = {k: v for k, v in want.items() if have.get(k) != v}
    labels |= {k: None for k in sorted(dropped) if k in have}
    if not labels and had_record == record:
        return None
    metadata: dict[str, Any] = {"annotations": {PROPAGATED_ANNOTATION: record}}
    if labels:
        metadata["labels"] = labels
    return {"metadata": metadata}


def supporting_patch(existing: Mapping[str, Any], obj: Mapping[str, Any]) -> dict[str, Any] | None:
    """The merge patch that brings an existing supporting object (ours) to the render `obj`, or None when
    it holds this render and its labels already."""
    relabel = label_patch(existing, obj)
    if render_hash(existing) == render_hash(obj):
        return relabel
    meta = obj["metadata"]
    fields = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
    metadata = {"labels": dict(meta.get("labels") or {}), "annotations": dict(meta.get("annotations") or {})}
    for key, values in ((relabel or {}).get("metadata") or {}).items():
        metadata[key].update(values)  # the removed keys, and the renewed record
    return {"metadata": metadata, **fields}


def decide(wanted: Wanted, existing: Mapping[str, Any] | None, status: StatusLike) -> Outcome:
    """What to do about the child, given the one found under its name (or None) and the BTJ's status.

    `status` is the BTJ's status as read after the child when no child was found: a watcher that recorded
    the child's end (finished, a permanent error) did so before it let the child go, so that read sees it.
    """
    kind, name, status = wanted.kind.kind, wanted.name, typed(status)
    if existing is not None and not owned_by(existing, wanted.owner_uid):
        return NameConflict(conflict_message(kind, name))
    # The replacement's intent, compared with the child that exists, on every pass (level-triggered, as a
    # Kubernetes controller compares desired and observed state): a stale child left by a lost DELETE or
    # an operator stopped after the re-plan's status write is deleted here, whoever runs the pass.
    stale = existing is not None and replaced_child_uid(status) == existing["metadata"].get("uid")
    if existing is not None and existing["metadata"].get("deletionTimestamp"):
        # A stale child's end is not the job's: nothing of it needs recording before it goes.
        uid = existing["metadata"].get("uid")
        recorded = stale or deleted_child_uid(status) == uid or is_finished(status)
        return PreviousDeleting(release=recorded and holds(existing), message=still_deleting(kind, name))
    if existing is not None and stale:
        return StaleChild(
            str(existing["metadata"]["uid"]),
            f"the previous {kind} {name} ran the plan a re-plan replaced; it is being deleted",
            resized=resized_child(status),
        )
    if existing is None:
        previous = (status.child.uid if status.child is not None else None) or None
        if previous and is_finished(status) and not runs_again(wanted.generation, status):
            message = f"{kind} {name} was deleted; the job had finished, so it is not re-created."
            gone = ConditionChange(ConditionType.CHILD_CREATED, "False", CHILD_DELETED, message)
            return FinishedChildGone(Effects((gone,)))
        why = Creation.FIRST
        if previous:
            why = Creation.AFTER_DELETION
            if replacing_child(status):
                why = Creation.AFTER_RESIZE if resized_child(status) else Creation.AFTER_OUT_OF_MEMORY
        return Create(wanted, previous, why)

    hold = not holds(existing)
    found = ConditionChange(ConditionType.CHILD_CREATED, "True", "Exists", wanted.what)
    relabel = label_patch(existing, wanted.job)
    if render_hash(existing) == render_hash(wanted.job):
        return UpToDate(hold, found, relabel)
    if wanted.earlier_hash is not None and render_hash(existing) == wanted.earlier_hash:
        # Made by an earlier version: the same render, stamped with the hash that counted the labels. The
        # relabel stamps today's, so a later label edit still reads as no new render.
        stamp = {RENDER_HASH_ANNOTATION: render_hash(wanted.job)}
        metadata = dict((relabel or {}).get("metadata") or {})
        metadata["annotations"] = {**(metadata.get("annotations") or {}), **stamp}
        return UpToDate(hold, found, {"metadata": metadata})
    child_status = existing.get("status") or {}
    if can_patch_in_place(child_status) and not immutable_change(wanted.kind, existing, wanted.job):
        patched = ConditionChange(
            ConditionType.SPEC_APPLIED,
            "True",
            "Patched",
            "The job had not started; it was updated in place.",
        )
        updated = Notice("Updated", f"Updated {kind} {name} to the new plan (it had not started)")
        return PatchInPlace(
            hold,
            found,
            relabel,
            patch=in_place_patch(wanted.kind, wanted.job),
            effects=Effects((patched,), (updated,)),
        )
    phase = child_phase(child_status)
    if phase in TERMINAL_PHASES:
        reason = "JobFinished"
    elif can_patch_in_place(child_status):
        reason = "TrainJobImmutable"  # not started, but its node or process count changed
    else:
        reason = "RunningJobImmutable"
    message = (
        f"{kind} {name} is {phase.value}; its shape cannot change in place. "
        "Fix: delete and re-create the BlackwellTrainingJob (it resumes from its checkpoint) to "
        "apply this spec"
    )
    refused = ConditionChange(ConditionType.SPEC_APPLIED, "False", reason, message)
    notice = Notice(reason, message, warning=True, once=ConditionType.SPEC_APPLIED)
    return CannotChange(
        hold,
        found,
        relabel,
        reason=reason,
        message=message,
        effects=Effects((refused,), (notice,), write_plan=False),
    )
