"""Whether Kueue queues a BTJ's job: what current Kueue manages by default, then what the child shows."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from blackwell_operator.lifecycle.conditions import ConditionChange, ConditionStatus
from blackwell_operator.models.status import ConditionType
from blackwell_operator.render import hyperpod, pytorchjob, trainjob

# Kueue v0.19 and later ship with the Kubeflow Training Operator v1 integrations (kubeflow.org/pytorchjob
# among them) off in the default configuration and plan to remove them (kubernetes-sigs/kueue#12620,
# PRs #12606 and #12601); trainer.kubeflow.org/trainjob stays on. HyperPodPyTorchJob is not a Kueue
# integration at all: HyperPod's task governance add-on configures its own Kueue for it.
_FIX = (
    "Fix: set spec.backend to TrainJob (or auto), which Kueue manages by default, or have the Kueue "
    "administrator add {framework} to integrations.frameworks in Kueue's configuration"
)
_DEFAULT_OFF = {
    pytorchjob.KIND: (
        "kubeflow.org/pytorchjob",
        "Kueue v0.19 and later do not manage PyTorchJob in their default configuration "
        "(kubernetes-sigs/kueue#12620)",
    ),
    hyperpod.KIND: (
        "the HyperPodPyTorchJob integration (HyperPod task governance)",
        "Kueue manages HyperPodPyTorchJob only where HyperPod task governance configured it",
    ),
}


def kueue_condition(
    child_kind: str | None, queue_name: str, child_status: Mapping[str, Any] | None
) -> ConditionChange:
    """The KueueManaged condition of a BTJ whose spec names a queue.

    What the child shows decides: Kueue suspends every job it manages at creation and resumes it on
    admission, so a `Suspended` condition (either status) means Kueue has it, and a job that runs or ends
    without ever having one was not queued. Before that, what current Kueue manages by default.
    """
    conditions = {
        str(c.get("type")): c for c in (child_status or {}).get("conditions") or [] if isinstance(c, Mapping)
    }
    started = any(
        conditions.get(kind, {}).get("status") == "True"
        for kind in ("Running", "Restarting", "Succeeded", "Complete", "Completed", "Failed")
    ) or any(int(e.get("ready") or 0) for e in (child_status or {}).get("jobsStatus") or [])
    kind = child_kind or "job"
    if "Suspended" in conditions:
        return _managed(
            "True", "SuspendedByKueue", f"Kueue holds or admitted the {kind} (queue {queue_name})."
        )
    framework, default = _DEFAULT_OFF.get(child_kind or "", ("", ""))
    if started:
        why = f"{default}. " if default else ""
        return _managed(
            "False",
            "NotQueued",
            f"spec.queueName is {queue_name}, but the {kind} started without Kueue suspending it, so it runs "
            f"outside the queue's quota. {why}"
            + (
                _FIX.format(framework=framework)
                if framework
                else "Fix: check that Kueue is installed and the queue exists (kubectl get localqueue)"
            ),
        )
    if child_kind == trainjob.KIND:
        return _managed("True", "ManagedByDefault", f"Kueue manages TrainJob by default; queue {queue_name}.")
    if framework:
        return _managed(
            "Unknown",
            "IntegrationOffByDefault",
            f"spec.queueName is {queue_name}, but {default}: unless the integration is on, the {kind} runs "
            f"at once, outside the queue. {_FIX.format(framework=framework)}",
        )
    return _managed("Unknown", "Pending", f"Waiting for Kueue to take the job (queue {queue_name}).")


def _managed(status: ConditionStatus, reason: str, message: str) -> ConditionChange:
    return ConditionChange(ConditionType.KUEUE_MANAGED, status, reason, message)
