"""Trainer pods stuck Terminating on a lost node: which to force-delete so their replacements can start.

A node that stops reporting (powered off, kernel panic, network cut) leaves its pods Terminating for ever:
the API server waits for a kubelet that never confirms. The training operator does not replace a pod
that still exists, so the whole job sits in Restarting (kubeflow/trainer#2072, #2185). Force-deleting such
a pod is safe only when its node is gone or not Ready: a Ready node's kubelet finishes the deletion itself.
Only a pod that the BTJ's own child controls is force-deleted (lifecycle/ownership.py): the trainer's labels
are no evidence, anyone who may create pods can copy them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from blackwell_operator.timefmt import rfc3339_seconds


@dataclass(frozen=True)
class StuckPod:
    """A pod to force-delete, and why."""

    name: str
    uid: str
    node: str
    overdue_s: float
    node_state: str  # "gone" or the node's Ready condition status ("False", "Unknown")

    def _where(self) -> str:
        if self.node_state == "gone":
            return f"node {self.node} is gone"
        return f"node {self.node} is not Ready ({self.node_state})"

    def describe(self) -> str:
        """One line for the Event."""
        return (
            f"pod {self.name} was stuck Terminating {self.overdue_s:.0f} s past its deadline and "
            f"{self._where()}: force-deleted so that the training operator can start its replacement"
        )

    def describe_ignored(self, namespace: str) -> str:
        """One line for a pod with the job's labels that no child of the job controls."""
        return (
            f"pod {self.name} carries this job's labels and is stuck Terminating ({self._where()}), but no "
            "child of this BlackwellTrainingJob controls it (made outside the operator, or a deleted "
            "child's): not force-deleted. If it blocks the job, check who made it, then "
            f"kubectl delete pod {self.name} -n {namespace} --grace-period=0 --force"
        )


def node_ready_status(node: Mapping[str, Any]) -> str:
    """The node's Ready condition status: "True", "False" or "Unknown" (no condition: Unknown)."""
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return str(cond.get("status") or "Unknown")
    return "Unknown"


def terminating_overdue(
    pods: Iterable[Mapping[str, Any]], now: float, timeout_s: float
) -> list[Mapping[str, Any]]:
    """Pods whose deletion deadline passed more than `timeout_s` ago and that were placed on a node."""
    out = []
    for pod in pods:
        deadline = rfc3339_seconds((pod.get("metadata") or {}).get("deletionTimestamp"))
        if deadline is not None and now - deadline >= timeout_s and (pod.get("spec") or {}).get("nodeName"):
            out.append(pod)
    return out


def stuck_pods(
    pods: Iterable[Mapping[str, Any]], nodes: Iterable[Mapping[str, Any]], now: float, timeout_s: float
) -> list[StuckPod]:
    """The overdue Terminating pods whose node is gone or not Ready (a Ready node finishes them itself)."""
    ready = {str((n.get("metadata") or {}).get("name")): node_ready_status(n) for n in nodes}
    out = []
    for pod in terminating_overdue(pods, now, timeout_s):
        meta = pod.get("metadata") or {}
        node = str((pod.get("spec") or {}).get("nodeName"))
        state = ready.get(node, "gone")
        if state == "True":
            continue
        deadline = rfc3339_seconds(meta.get("deletionTimestamp")) or now
        out.append(StuckPod(str(meta.get("name")), str(meta.get("uid") or ""), node, now - deadline, state))
    return out
