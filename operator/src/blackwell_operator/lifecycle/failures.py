"""Pure worker-failure logic: a trainer pod's terminated container -> status.lastFailure and its wording."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from blackwell_operator.lifecycle.conditions import find_condition
from blackwell_operator.lifecycle.message import CASCADE_WINDOW_S, describe, set_message, status_message
from blackwell_operator.lifecycle.ownership import Lineage, of_child
from blackwell_operator.lifecycle.phase import TERMINAL_PHASES, fail
from blackwell_operator.lifecycle.replan import oom_of, replacing_child, replan_changes
from blackwell_operator.lifecycle.status_read import StatusLike, read_status, typed
from blackwell_operator.models.status import (
    FAILURE_MESSAGE_LIMIT,
    BlackwellTrainingJobStatus,
    ConditionType,
    Phase,
    StatusChange,
    WorkerFailure,
)
from blackwell_operator.render.pod import TRAINER_CONTAINER_NAMES
from blackwell_operator.timefmt import rfc3339_seconds
from blackwell_trainer.plan.config import PERMANENT_ERROR_PREFIX, OomResult

STOP_EXIT_CODES = frozenset({130, 137, 143})  # 128 + SIGINT, SIGKILL, SIGTERM
# The Failed condition's reason when a worker ended on an error no restart can fix; the operator then
# deletes the child (its GPUs are freed) instead of letting torchrun and the pods retry it.
PERMANENT_ERROR_REASON = "PermanentError"


def first_line(text: str | None, limit: int = FAILURE_MESSAGE_LIMIT) -> str:
    """The first non-empty line, stripped, cut to `limit` characters ("" when there is none)."""
    for line in (text or "").splitlines():
        if line.strip():
            return line.strip()[:limit]
    return ""


def _failed_termination(status: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The container's current termination if it failed, else its previous one if that failed."""
    for key in ("state", "lastState"):
        terminated = (status.get(key) or {}).get("terminated")
        if isinstance(terminated, Mapping) and int(terminated.get("exitCode") or 0) != 0:
            return terminated
    return None


def worker_failure(
    pod: Mapping[str, Any], containers: frozenset[str] = TRAINER_CONTAINER_NAMES
) -> dict[str, Any] | None:
    """status.lastFailure (camelCase, no null values) from a pod, or None when its trainer has not failed.

    `state.terminated` is the container's latest end; `lastState.terminated` the one before a restart
    in place (restartPolicy OnFailure), still there while the container runs again.
    """
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    for status in statuses:
        if not isinstance(status, Mapping) or status.get("name") not in containers:
            continue
        terminated = _failed_termination(status)
        if terminated is None:
            return None
        failure: dict[str, Any] = {
            "pod": (pod.get("metadata") or {}).get("name", ""),
            "container": str(status["name"]),
            "exitCode": int(terminated["exitCode"]),
            "reason": str(terminated.get("reason") or ""),
            "message": first_line(terminated.get("message")),
        }
        if terminated.get("finishedAt"):
            failure["finishedAt"] = str(terminated["finishedAt"])
        # The trainer's out-of-memory result: a later line of the same message (config.OomResult).
        oom = OomResult.find(terminated.get("message"))
        if oom is not None:
            failure["outOfMemory"] = oom.model_dump(by_alias=True, exclude_none=True, mode="json")
        return failure
    return None


def failure_key(failure: Mapping[str, Any] | None) -> tuple[str, str] | None:
    """One failure's identity (pod, finishedAt): one Event per key."""
    if not failure:
        return None
    return str(failure.get("pod", "")), str(failure.get("finishedAt", ""))


def stopped_from_outside(failure: Mapping[str, Any]) -> bool:
    """Exit by SIGINT, SIGTERM or SIGKILL without an OOM kill: the pod was stopped, it did not fail itself."""
    return failure.get("exitCode") in STOP_EXIT_CODES and failure.get("reason") != "OOMKilled"


def supersedes(new: Mapping[str, Any], stored: Mapping[str, Any] | None) -> bool:
    """Whether `new` should replace the stored lastFailure.

    A later end wins; an earlier one (another worker's event arriving late) never replaces it, so that
    several failed workers do not make the field flip. The same key with other content (a pod event
    completing the termination) replaces it. A stop from outside (exit 143/137/130) within
    CASCADE_WINDOW_S after a worker's own failure does not hide it: that is the training operator
    stopping the other workers because of it (cleanPodPolicy, a restart of the gang).
    """
    if not stored:
        return True
    if dict(new) == dict(stored):
        return False
    if failure_key(new) == failure_key(stored):
        return True
    new_end, stored_end = str(new.get("finishedAt", "")), str(stored.get("finishedAt", ""))
    if new_end <= stored_end:
        return False
    if stopped_from_outside(new) and not stopped_from_outside(stored):
        new_s, stored_s = rfc3339_seconds(new_end), rfc3339_seconds(stored_end)
        if new_s is None or stored_s is None or new_s - stored_s <= CASCADE_WINDOW_S:
            return False
    return True


def belongs_to(pod: Mapping[str, Any], btj: Mapping[str, Any], found: Lineage | None) -> bool:
    """Whether `pod`, whose verified owner chain is `found` (lifecycle/ownership.py), is one of this BTJ's
    current workers. Labels play no part: anyone who may create a pod can copy them."""
    pod_meta, btj_meta = pod.get("metadata") or {}, btj.get("metadata") or {}
    if pod_meta.get("namespace") and pod_meta.get("namespace") != btj_meta.get("namespace"):
        return False
    return of_child(found, btj)


def is_permanent(failure: Mapping[str, Any] | None) -> bool:
    """The trainer said no restart can help (its termination message starts PERMANENT_ERROR_PREFIX)."""
    return bool(failure) and str((failure or {}).get("message") or "").startswith(PERMANENT_ERROR_PREFIX)


def stopping_child(status: StatusLike) -> bool:
    """The recorded child is being deleted by the operator: the job failed on a permanent error, or a
    re-plan replaces it. Its last phases no longer speak for the BTJ."""
    return stopped_on_permanent_error(status) or replacing_child(status)


def stopped_on_permanent_error(status: StatusLike) -> bool:
    """The BTJ failed because a worker hit a permanent error (its child is, or is being, deleted)."""
    stored = typed(status)
    failed = find_condition(stored.conditions, ConditionType.FAILED)
    return stored.phase == Phase.FAILED and failed is not None and failed.reason == PERMANENT_ERROR_REASON


def _permanent_stop(
    status: Mapping[str, Any],
    stored: BlackwellTrainingJobStatus,
    failure: Mapping[str, Any],
    generation: Any,
    now: str,
) -> StatusChange:
    """The status change that fails the BTJ on a worker's permanent error."""
    child = _child_of(status)
    what = f"{child.get('kind', 'job')} {child.get('name', '')}".strip()
    reason = (
        f"a worker ended on a permanent error, which no restart can fix: {describe(failure)}. "
        f"{what} is deleted to free its GPUs; fix the spec and apply it again (a spec change starts a "
        "new job)"
    )
    return fail(
        StatusChange(), stored.conditions, PERMANENT_ERROR_REASON, reason, generation=generation, now=now
    )


def _child_of(status: Mapping[str, Any]) -> Mapping[str, Any]:
    """status.child as stored (read leniently: a child recorded without its apiVersion still names it)."""
    child = status.get("child")
    return child if isinstance(child, Mapping) else {}


def _failure_dump(stored: BlackwellTrainingJobStatus) -> dict[str, Any] | None:
    failure = stored.last_failure
    return None if failure is None else failure.model_dump(by_alias=True, exclude_unset=True, mode="json")


def failure_changes(
    btj: Mapping[str, Any],
    pod: Mapping[str, Any],
    failure: Mapping[str, Any],
    *,
    now: str,
    found: Lineage | None,
) -> tuple[StatusChange | None, bool]:
    """The status change that records `failure` of `pod` (None: nothing to write), and whether it is a
    failure not recorded before (worth one Event). `now` (metav1.Time) stamps a condition it sets;
    `found` is the pod's verified owner chain (None: not a pod of any BTJ's child, nothing is written)."""
    if (btj.get("metadata") or {}).get("deletionTimestamp") or not belongs_to(pod, btj, found):
        return None, False
    status = btj.get("status") or {}
    read = read_status(status).status
    if read.phase == Phase.SUCCEEDED:
        return None, False  # the job is done: a worker stopped now is the training operator's clean-up
    stored = _failure_dump(read)
    if not supersedes(failure, stored):
        return None, False
    recorded = WorkerFailure.model_validate(failure)
    if is_permanent(failure) and read.phase not in TERMINAL_PHASES and _child_of(status).get("name"):
        if replacing_child(read):
            return None, False  # a re-plan already replaces this child: its other workers end too
        oom = oom_of(failure)
        if oom is not None and read.plan is not None:
            # Out of GPU memory: the same plan runs out again, a smaller one may not (replan.py).
            replanned, _ = replan_changes(btj, failure, oom, failed_reason=PERMANENT_ERROR_REASON, now=now)
            return replanned, True
        generation = read.observed_generation or (btj.get("metadata") or {}).get("generation")
        change = _permanent_stop(status, read, failure, generation, now)
        change.last_failure = recorded
        return change, True
    change = StatusChange(last_failure=recorded)
    # The headline the phase's writer stored; a status from before headlines were stored has its message.
    headline = read.headline if read.headline is not None else (read.message or "")
    if status_message(headline, read.phase, failure) != (read.message or ""):
        set_message(change, headline, read.phase, failure)
    return change, failure_key(stored) != failure_key(failure)
