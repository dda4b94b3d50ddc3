"""A child job's status as the BTJ's phase and child conditions (PyTorchJob, HyperPodPyTorchJob, TrainJob)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from blackwell_operator.lifecycle.conditions import (
    ConditionStatus,
    condition_map,
    first_true,
    remove_condition,
    set_condition,
)
from blackwell_operator.lifecycle.kueue import kueue_condition
from blackwell_operator.lifecycle.message import set_message, summary_message
from blackwell_operator.models.status import (
    FAILURE_MESSAGE_LIMIT,
    Condition,
    ConditionType,
    Phase,
    StatusChange,
)

# Phases the child job decides; the operator sets the others (Planning, Planned, Invalid) itself.
CHILD_PHASES = frozenset(
    {Phase.PENDING, Phase.QUEUED, Phase.RUNNING, Phase.RESTARTING, Phase.SUCCEEDED, Phase.FAILED}
)


TERMINAL_PHASES = frozenset({Phase.SUCCEEDED, Phase.FAILED})


# Conditions derived from the child; the spec reconciler owns the rest (Planned, ChildCreated, ...).
CHILD_CONDITIONS = (
    ConditionType.ADMITTED,
    ConditionType.RUNNING,
    ConditionType.SUCCEEDED,
    ConditionType.FAILED,
)


# HyperPodPyTorchJob condition names are not published (docs/reference/hyperpod-pytorchjob.md, open question
# 1): the SDK speaks of "Complete", third-party code of "Completed". Both count as success.
_SUCCESS_TYPES = ("Succeeded", "Completed", "Complete")


def _jobs_status_phase(child_status: Mapping[str, Any]) -> Phase | None:
    """Running or Restarting of a TrainJob from status.jobsStatus (Trainer v2 has no such conditions).

    Each entry counts one replicated job's Jobs: a failed one that has not failed the TrainJob is being
    re-created by JobSet (a gang restart); a ready one has every pod ready (or done).
    """
    entries = [e for e in child_status.get("jobsStatus") or [] if isinstance(e, Mapping)]
    if any(int(e.get("failed") or 0) > 0 for e in entries):
        return Phase.RESTARTING
    if any(int(e.get("ready") or 0) > 0 for e in entries):
        return Phase.RUNNING
    return None


def child_phase(child_status: Mapping[str, Any] | None) -> Phase:
    """Phase of a PyTorchJob/HyperPodPyTorchJob/TrainJob; first match wins.

    The mapping is docs/reference/hyperpod-pytorchjob.md §1.4.

    A TrainJob's conditions are only Suspended, Complete and Failed (docs/backends.md); its Running and
    Restarting come from status.jobsStatus.
    """
    conds = condition_map((child_status or {}).get("conditions"))
    if first_true(conds, "Failed"):
        return Phase.FAILED
    if first_true(conds, *_SUCCESS_TYPES):
        return Phase.SUCCEEDED
    if first_true(conds, "Suspended"):
        return Phase.QUEUED
    if first_true(conds, "Restarting"):
        return Phase.RESTARTING
    if first_true(conds, "Running"):
        return Phase.RUNNING
    return _jobs_status_phase(child_status or {}) or Phase.PENDING


def child_message(child_status: Mapping[str, Any] | None) -> str:
    """The message of the child's most recent True condition (what `kubectl get` would show)."""
    for cond in reversed(list((child_status or {}).get("conditions") or [])):
        if isinstance(cond, Mapping) and cond.get("status") == "True" and cond.get("message"):
            return str(cond["message"])
    return ""


def child_headline(phase: Phase, kind: str, name: str, child_status: Mapping[str, Any] | None) -> str:
    """status.headline (and the phase Event's message) from a child: its kind, name, phase and the message
    of its latest True condition."""
    return summary_message(phase, kind, name, child_message(child_status))


def child_conditions(
    conditions: Sequence[Condition],
    child_status: Mapping[str, Any] | None,
    *,
    generation: int | None,
    now: str,
    queue_name: str | None = None,
    child_kind: str | None = None,
) -> tuple[Phase, list[Condition]]:
    """The BTJ phase and its Admitted/Running/Succeeded/Failed conditions from the child's status, and
    KueueManaged while the spec names a queue (kueue.py)."""
    phase = child_phase(child_status)
    conds = condition_map((child_status or {}).get("conditions"))
    detail = child_message(child_status)
    out = list(conditions)

    def put(kind: str, status: ConditionStatus, reason: str, message: str) -> None:
        nonlocal out
        out = set_condition(out, kind, status, reason, message, generation=generation, now=now)

    queue = f" in queue {queue_name}" if queue_name else ""
    if phase == Phase.QUEUED:
        put(ConditionType.ADMITTED, "False", "Suspended", detail or f"The job is suspended{queue} (Kueue).")
    elif (
        phase != Phase.PENDING
        or first_true(conds, "Created")
        or conds.get("Suspended")
        or (child_status or {}).get("jobsStatus")
    ):
        put(ConditionType.ADMITTED, "True", "Admitted", f"The job was admitted{queue}.")
    else:
        put(ConditionType.ADMITTED, "Unknown", "Pending", "The training operator has not reported yet.")

    if phase == Phase.RUNNING:
        put(ConditionType.RUNNING, "True", "Running", detail or "The job is running.")
    elif phase == Phase.RESTARTING:
        put(ConditionType.RUNNING, "False", "Restarting", detail or "The job is restarting.")
    elif phase == Phase.QUEUED:
        put(ConditionType.RUNNING, "False", "Suspended", "The job waits in the queue.")
    elif phase in TERMINAL_PHASES:
        put(ConditionType.RUNNING, "False", "Finished", f"The job {phase.value.lower()}.")
    else:
        put(ConditionType.RUNNING, "False", "Pending", "The job has not started.")

    if phase == Phase.SUCCEEDED:
        put(ConditionType.SUCCEEDED, "True", "Succeeded", detail or "The job succeeded.")
    else:
        put(ConditionType.SUCCEEDED, "False", "NotFinished", "The job has not finished.")
    if phase == Phase.FAILED:
        put(ConditionType.FAILED, "True", "JobFailed", detail or "The job failed.")
    else:
        put(ConditionType.FAILED, "False", "NoFailure", "The job has not failed.")
    if queue_name:
        managed = kueue_condition(child_kind, queue_name, child_status)
        put(managed.type, managed.status, managed.reason, managed.message)
    else:
        out = remove_condition(out, ConditionType.KUEUE_MANAGED)
    return phase, out


def can_patch_in_place(child_status: Mapping[str, Any] | None) -> bool:
    """A job's shape may change only before its pods exist: no status yet, or suspended in a queue."""
    conds = condition_map((child_status or {}).get("conditions"))
    phase = child_phase(child_status)
    if phase == Phase.QUEUED:
        return True
    return (
        phase == Phase.PENDING
        and not first_true(conds, "Created")
        and not (child_status or {}).get("startTime")
        and not any(
            int(e.get("active") or 0) or int(e.get("ready") or 0)
            for e in (child_status or {}).get("jobsStatus") or []
            if isinstance(e, Mapping)
        )
    )


def fail(
    change: StatusChange,
    conditions: Sequence[Condition],
    reason: str,
    message: str,
    *,
    generation: int | None,
    now: str,
) -> StatusChange:
    """`change` failing the BTJ for `reason`: condition Failed True (its message cut to twice the CRD's
    lastFailure limit), phase Failed, and status.message "Failed: <message>" (the failure is in the
    headline already)."""
    change.phase = Phase.FAILED
    change.conditions = set_condition(
        conditions,
        ConditionType.FAILED,
        "True",
        reason,
        message[: FAILURE_MESSAGE_LIMIT * 2],
        generation=generation,
        now=now,
    )
    return set_message(change, f"Failed: {message}", Phase.FAILED)
