"""What a BTJ's status and its child's metadata say of the child: ours, held, finished, deleted, current."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from blackwell_operator.lifecycle.conditions import find_condition
from blackwell_operator.lifecycle.phase import TERMINAL_PHASES
from blackwell_operator.lifecycle.status_read import StatusLike, typed
from blackwell_operator.models.status import ConditionType
from blackwell_operator.render.labels import RENDER_HASH_ANNOTATION

# The ChildCreated reason the child watcher writes when it sees the recorded child deleted.
CHILD_DELETED = "ChildDeleted"
# A child deleted while no operator runs (by hand, or by the training operator's ttlSecondsAfterFinished)
# would take its final status with it: a restarted operator would see a running BTJ without its child
# and run the job again. With this finalizer the deleted child stays, Terminating, until the child
# watcher has written what it saw onto the BTJ; then the watcher releases it.
FINAL_STATUS_FINALIZER = "training.blackwell.dev/final-status"


def owned_by(obj: Mapping[str, Any], owner_uid: str) -> bool:
    """Whether `obj` carries an ownerReference to `owner_uid`."""
    refs = obj.get("metadata", {}).get("ownerReferences") or []
    return any(ref.get("uid") == owner_uid for ref in refs)


def holds(child: Mapping[str, Any]) -> bool:
    """Whether the child carries the final-status finalizer."""
    return FINAL_STATUS_FINALIZER in ((child.get("metadata") or {}).get("finalizers") or [])


def with_finalizer(job: dict[str, Any]) -> dict[str, Any]:
    """`job` (a rendered child) with the finalizer added, in place."""
    meta = job.setdefault("metadata", {})
    if FINAL_STATUS_FINALIZER not in (meta.get("finalizers") or []):
        meta["finalizers"] = [*(meta.get("finalizers") or []), FINAL_STATUS_FINALIZER]
    return job


def render_hash(obj: Mapping[str, Any]) -> str | None:
    """The render hash annotation the renderer stamps on every child."""
    return (obj.get("metadata", {}).get("annotations") or {}).get(RENDER_HASH_ANNOTATION)


def deleted_child_uid(status: StatusLike) -> str | None:
    """The recorded child's uid when the child watcher saw it deleted (ChildCreated False, ChildDeleted)."""
    stored = typed(status)
    created = find_condition(stored.conditions, ConditionType.CHILD_CREATED)
    if created is None or (created.status, created.reason) != ("False", CHILD_DELETED):
        return None
    return (stored.child.uid if stored.child is not None else None) or None


def is_finished(status: StatusLike) -> bool:
    """Whether the BTJ's phase is Succeeded or Failed."""
    return typed(status).phase in TERMINAL_PHASES


def spec_changed(generation: int, status: StatusLike) -> bool:
    """Whether the spec changed since the recorded child was made (a finished job may then run anew).

    The generation reconcile last wrote, else the one the child watcher stamped on ChildCreated when it
    recorded the child before reconcile wrote anything (a job that finished within its first pass).
    Without either nothing says the spec changed: a finished job is not run again on a guess.
    """
    stored = typed(status)
    created = find_condition(stored.conditions, ConditionType.CHILD_CREATED)
    seen = stored.observed_generation or (created.observed_generation if created is not None else None)
    return seen is not None and generation != seen


def runs_again(generation: int, status: StatusLike) -> bool:
    """Whether a finished BTJ whose child is gone runs again from its spec: only when the spec was edited
    after the finished child's deletion was recorded (ChildCreated False, ChildDeleted, stamped with the
    generation current then: lifecycle/child_mirror.py).

    An edit made while the finished child still existed is not applied to a finished job, whether the
    operator was running (the edit reads JobFinished, and a later deletion runs nothing) or down (the
    child's final-status finalizer kept it until the operator came back and recorded it, edit included).
    Without a recorded deletion nothing says the edit came after it: a finished job is never run again on
    a guess.
    """
    created = find_condition(typed(status).conditions, ConditionType.CHILD_CREATED)
    if created is None or created.status != "False" or created.reason != CHILD_DELETED:
        return False
    return created.observed_generation is not None and generation != created.observed_generation
