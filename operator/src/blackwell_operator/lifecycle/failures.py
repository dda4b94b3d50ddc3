"""Pure worker-failure logic: a trainer pod's terminated container -> status.lastFailure and its wording."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from blackwell_operator.lifecycle.conditions import get_condition, set_condition
from blackwell_operator.lifecycle.phase import TERMINAL_PHASES
from blackwell_operator.lifecycle.replan import oom_of, replacing_child, replan_changes
from blackwell_operator.models.status import FAILURE_MESSAGE_LIMIT, ConditionType, Phase
from blackwell_operator.render import trainjob
from blackwell_operator.render.kinds import JOB_KINDS
from blackwell_operator.render.labels import JOB_NAME_LABEL
from blackwell_operator.render.pod import TERMINATION_GRACE_SECONDS, TRAINER_CONTAINER_NAMES
from blackwell_operator.timefmt import rfc3339_seconds
from blackwell_trainer.config import PERMANENT_ERROR_PREFIX, OomResult

# What status.message appends while the phase is Restarting or Failed; the text before it is the summary
# the child watcher writes, so a newer failure replaces the old suffix instead of stacking up.
FAILURE_SEPARATOR = "; last worker failure: "
FAILURE_PHASES = frozenset({Phase.RESTARTING.value, Phase.FAILED.value})
OOM_EXIT_CODE = 137  # 128 + SIGKILL: what the kernel's OOM killer leaves
STOP_EXIT_CODES = frozenset({130, 137, 143})  # 128 + SIGINT, SIGKILL, SIGTERM
# How long after a worker's own failure the stops of the other workers follow it: the termination grace
# plus the training operator's reaction, with margin.
CASCADE_WINDOW_S = TERMINATION_GRACE_SECONDS + 600.0
# The Kubeflow training operator's pod label naming the PyTorchJob (docs/reference/hyperpod-pytorchjob.md §1).
KUBEFLOW_JOB_NAME_LABEL = "training.kubeflow.org/job-name"
# A TrainJob's pods are owned by Jobs of its JobSet, which names them by the TrainJob in this label.
CHILD_JOB_NAME_LABELS = (KUBEFLOW_JOB_NAME_LABEL, trainjob.JOBSET_NAME_LABEL)
CHILD_KINDS = frozenset(row.kind for row in JOB_KINDS.values())
# The Failed condition's reason when a worker ended on an error no restart can fix; the operator then
# deletes the child (its GPUs are freed) instead of letting torchrun and the pods retry it.
PERMANENT_ERROR_REASON = "PermanentError"
_TERMINAL = frozenset(phase.value for phase in TERMINAL_PHASES)


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


def describe(failure: Mapping[str, Any]) -> str:
    """One line for people: pod, exit code and reason, and the termination message."""
    code, reason = failure.get("exitCode"), failure.get("reason") or ""
    head = f"pod {failure.get('pod')} exit {code}"
    if code == OOM_EXIT_CODE and reason == "OOMKilled":
        # Users read "OOM" as CUDA out-of-memory; that one is a Python error (exit 1), not a kill.
        head += (
            " (OOMKilled: the kernel killed it for host memory, the pod's memory limit or the node's RAM; "
            "not GPU memory)"
        )
    elif reason:
        head += f" ({reason})"
    message = failure.get("message") or ""
    return f"{head}: {message}" if message else head


def with_failure(
    message: str, phase: str | None, failure: Mapping[str, Any] | None, since: str | None = None
) -> str:
    """status.message with the worker failure folded in while the phase is Restarting or Failed.

    `since`: when the job entered that phase (its Running condition's last transition). A failure that
    ended long before it (more than CASCADE_WINDOW_S) is not the cause: a restart hours later, after a
    node was lost, must not be blamed on an old worker failure.
    """
    base = message.split(FAILURE_SEPARATOR, 1)[0]
    if phase not in FAILURE_PHASES or not failure:
        return base
    ended, entered = rfc3339_seconds(failure.get("finishedAt")), rfc3339_seconds(since)
    if ended is not None and entered is not None and entered - ended > CASCADE_WINDOW_S:
        return base
    return f"{base}{FAILURE_SEPARATOR}{describe(failure)}"


def belongs_to(pod: Mapping[str, Any], btj: Mapping[str, Any]) -> bool:
    """Whether a pod labelled with the BTJ's name is one of this BTJ's workers (not a predecessor's).

    A pod older than the BTJ cannot be its worker. When the BTJ has recorded its child, a pod's
    controlling job reference (or the training operator's job-name label) must name that child; a pod
    with neither is taken on its job-name label alone.
    """
    pod_meta, btj_meta = pod.get("metadata") or {}, btj.get("metadata") or {}
    if (pod_meta.get("labels") or {}).get(JOB_NAME_LABEL) != btj_meta.get("name"):
        return False
    pod_created, btj_created = pod_meta.get("creationTimestamp"), btj_meta.get("creationTimestamp")
    if pod_created and btj_created and str(pod_created) < str(btj_created):
        return False
    child = (btj.get("status") or {}).get("child") or {}
    if not child.get("name"):
        return True
    for ref in pod_meta.get("ownerReferences") or []:
        if ref.get("kind") in CHILD_KINDS and ref.get("controller", True):
            if child.get("uid"):
                return bool(ref.get("uid") == child["uid"])
            return bool(ref.get("name") == child["name"])
    labels = pod_meta.get("labels") or {}
    job_label = next((labels[key] for key in CHILD_JOB_NAME_LABELS if key in labels), None)
    return job_label is None or job_label == child["name"]


def is_permanent(failure: Mapping[str, Any] | None) -> bool:
    """The trainer said no restart can help (its termination message starts PERMANENT_ERROR_PREFIX)."""
    return bool(failure) and str((failure or {}).get("message") or "").startswith(PERMANENT_ERROR_PREFIX)


def stopping_child(status: Mapping[str, Any]) -> bool:
    """The recorded child is being deleted by the operator: the job failed on a permanent error, or a
    re-plan replaces it. Its last phases no longer speak for the BTJ."""
    return stopped_on_permanent_error(status) or replacing_child(status)


def stopped_on_permanent_error(status: Mapping[str, Any]) -> bool:
    """The BTJ failed because a worker hit a permanent error (its child is, or is being, deleted)."""
    failed = get_condition(status.get("conditions"), ConditionType.FAILED)
    return (
        status.get("phase") == Phase.FAILED.value
        and failed is not None
        and failed.get("reason") == PERMANENT_ERROR_REASON
    )


def _permanent_stop(
    status: Mapping[str, Any], failure: Mapping[str, Any], generation: Any, now: str
) -> dict[str, Any]:
    """The status keys that fail the BTJ on a worker's permanent error."""
    child = status.get("child") or {}
    what = f"{child.get('kind', 'job')} {child.get('name', '')}".strip()
    reason = (
        f"a worker ended on a permanent error, which no restart can fix: {describe(failure)}. "
        f"{what} is deleted to free its GPUs; fix the spec and apply it again (a spec change starts a "
        "new job)"
    )
    conds = set_condition(
        status.get("conditions") or [],
        ConditionType.FAILED,
        "True",
        PERMANENT_ERROR_REASON,
        reason[: FAILURE_MESSAGE_LIMIT * 2],
        generation=generation,
        now=now,
    )
    return {"phase": Phase.FAILED.value, "conditions": conds, "message": f"Failed: {reason}"}


def failure_changes(
    btj: Mapping[str, Any], pod: Mapping[str, Any], failure: Mapping[str, Any], *, now: str
) -> tuple[dict[str, Any] | None, bool]:
    """The BTJ status keys that record `failure` of `pod` (None: nothing to write), and whether it is a
    failure not recorded before (worth one Event). `now` (metav1.Time) stamps a condition it sets."""
    if (btj.get("metadata") or {}).get("deletionTimestamp") or not belongs_to(pod, btj):
        return None, False
    status = btj.get("status") or {}
    if status.get("phase") == Phase.SUCCEEDED.value:
        return None, False  # the job is done: a worker stopped now is the training operator's clean-up
    stored = status.get("lastFailure")
    if not supersedes(failure, stored):
        return None, False
    changes: dict[str, Any] = {"lastFailure": dict(failure)}
    if (
        is_permanent(failure)
        and status.get("phase") not in _TERMINAL
        and (status.get("child") or {}).get("name")
    ):
        if replacing_child(status):
            return None, False  # a re-plan already replaces this child: its other workers end too
        oom = oom_of(failure)
        if oom is not None and status.get("plan"):
            # Out of GPU memory: the same plan runs out again, a smaller one may not (replan.py).
            replanned, _ = replan_changes(btj, failure, oom, failed_reason=PERMANENT_ERROR_REASON, now=now)
            return replanned, True
        generation = status.get("observedGeneration") or (btj.get("metadata") or {}).get("generation")
        changes.update(_permanent_stop(status, failure, generation, now))
        return changes, True
    message = with_failure(str(status.get("message") or ""), status.get("phase"), failure)
    if message != (status.get("message") or ""):
        changes["message"] = message
    return changes, failure_key(stored) != failure_key(failure)
