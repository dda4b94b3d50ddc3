"""status.message, composed in one place: the headline, and the latest worker failure while it explains it.

The headline is what the phase's writer says (the child's phase and detail, a deletion, a re-plan, a
refusal). While the job restarts or has failed, the latest worker failure follows it, unless that failure
ended long before the job entered the phase. The headline is stored too (status.headline), so that a
writer adding a newer failure starts from it; the message is never taken apart again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from blackwell_operator.models.status import Phase, StatusChange, WorkerFailure
from blackwell_operator.render.pod import TERMINATION_GRACE_SECONDS
from blackwell_operator.timefmt import rfc3339_seconds

# What joins the headline and the worker failure.
FAILURE_SEPARATOR = "; last worker failure: "
FAILURE_PHASES = frozenset({Phase.RESTARTING.value, Phase.FAILED.value})
OOM_EXIT_CODE = 137  # 128 + SIGKILL: what the kernel's OOM killer leaves
# How long after a worker's own failure the stops of the other workers follow it: the termination grace
# plus the training operator's reaction, with margin.
CASCADE_WINDOW_S = TERMINATION_GRACE_SECONDS + 600.0


def summary_message(phase: Phase, child_kind: str | None, child_name: str | None, detail: str = "") -> str:
    """The headline a child's phase gives: "PyTorchJob w is Running: detail"."""
    if child_kind and child_name:
        base = f"{child_kind} {child_name} is {phase.value}"
        return f"{base}: {detail}" if detail else base
    return detail or phase.value


def describe(failure: Mapping[str, Any]) -> str:
    """One line for people about a worker failure (status.lastFailure): pod, exit code and reason, and
    the termination message."""
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


def status_message(
    headline: str,
    phase: str | None,
    failure: WorkerFailure | Mapping[str, Any] | None = None,
    *,
    since: str | None = None,
) -> str:
    """status.message: `headline`, and while `phase` is Restarting or Failed the worker `failure`.

    `since`: when the job entered that phase (its Running condition's last transition). A failure that
    ended long before it (more than CASCADE_WINDOW_S) is not the cause: a restart hours later, after a
    node was lost, must not be blamed on an old worker failure.
    """
    if phase not in FAILURE_PHASES or not failure:
        return headline
    if isinstance(failure, WorkerFailure):
        failure = failure.model_dump(by_alias=True, exclude_unset=True, mode="json")
    ended, entered = rfc3339_seconds(failure.get("finishedAt")), rfc3339_seconds(since)
    if ended is not None and entered is not None and entered - ended > CASCADE_WINDOW_S:
        return headline
    return f"{headline}{FAILURE_SEPARATOR}{describe(failure)}"


def set_message(
    change: StatusChange,
    headline: str,
    phase: str | None,
    failure: WorkerFailure | Mapping[str, Any] | None = None,
    *,
    since: str | None = None,
) -> StatusChange:
    """`change` with its headline and the status.message composed from it for `phase` (the BTJ's phase
    after the change): the two keys are always written together."""
    change.headline = headline
    change.message = status_message(headline, phase, failure, since=since)
    return change
