"""Whose pod is it: a trainer pod's controller chain, object by object and uid by uid, up to its BTJ.

Labels say nothing about who made a pod: anyone who may create pods in a namespace can copy the trainer's.
A pod's result (a `permanent error:` termination message, an out-of-memory line, its /metrics) counts
only when its controlling owner references lead, through objects that exist with exactly the uids they
name, to a job kind of ours that a BlackwellTrainingJob controls, and the pod is what that job's
controller makes: created after them, from the job's current template (lifecycle/pod_origin.py;
docs/reference/pod-ownership.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from blackwell_operator.lifecycle.pod_origin import created_after, job_templates, made_from
from blackwell_operator.models.spec import API_GROUP, KIND
from blackwell_operator.render import trainjob
from blackwell_operator.render.kinds import JOB_KINDS, POD_OWNER_CHAINS, TRAINING_RUNTIME, ChildKind

# Reads one object by kind, namespace and name (None: there is none).
Reader = Callable[[ChildKind, str, str], Mapping[str, Any] | None]
_JOB_KINDS = {row.kind: row for row in JOB_KINDS.values()}
_BETWEEN = {row.kind: row for chain in POD_OWNER_CHAINS.values() for row in chain}
# The longest chain from a pod to its job kind, plus the job itself.
MAX_HOPS = max(len(chain) for chain in POD_OWNER_CHAINS.values()) + 1


@dataclass(frozen=True)
class Lineage:
    """A pod's verified origin: the job of ours that controls it, and the BTJ that controls that job."""

    kind: str
    name: str
    uid: str
    btj_name: str
    btj_uid: str


def controller_of(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The owner reference marked `controller: true` (the API server allows at most one)."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            return ref
    return None


def _group(api_version: Any) -> str:
    return str(api_version or "").rpartition("/")[0]


def _kind_of(ref: Mapping[str, Any]) -> ChildKind | None:
    """The kind a controller reference names, when it is one a trainer pod's chain may pass through."""
    row = _JOB_KINDS.get(str(ref.get("kind"))) or _BETWEEN.get(str(ref.get("kind")))
    if row is None or _group(ref.get("apiVersion")) != row.group:
        return None
    return row


def lineage(pod: Mapping[str, Any], read: Reader) -> Lineage | None:
    """Follow the pod's controllers; the Lineage when they lead to a job of ours that a BTJ controls.

    Each object on the way is read and must carry the uid its reference names: a reference copied into a
    forged object, to an object since deleted or replaced under the same name, leads nowhere. The path
    must be the one the job's kind makes (POD_OWNER_CHAINS).
    """
    namespace = str((pod.get("metadata") or {}).get("namespace") or "")
    ref = controller_of(pod)
    passed: list[ChildKind] = []
    above: list[Mapping[str, Any]] = []
    for _ in range(MAX_HOPS):
        if ref is None or not namespace:
            return None
        kind = _kind_of(ref)
        if kind is None or not ref.get("uid") or not ref.get("name"):
            return None
        obj = read(kind, namespace, str(ref["name"]))
        if obj is None or (obj.get("metadata") or {}).get("uid") != ref["uid"]:
            return None
        above.append(obj)
        if kind.kind not in _JOB_KINDS:
            passed.append(kind)
            ref = controller_of(obj)
            continue
        if tuple(passed) != POD_OWNER_CHAINS[kind.kind] or not _made_by(pod, obj, above, read):
            return None
        owner = controller_of(obj)
        if owner is None or owner.get("kind") != KIND or _group(owner.get("apiVersion")) != API_GROUP:
            return None
        if not owner.get("uid") or not owner.get("name"):
            return None
        return Lineage(kind.kind, str(ref["name"]), str(ref["uid"]), str(owner["name"]), str(owner["uid"]))
    return None


def _made_by(
    pod: Mapping[str, Any], job: Mapping[str, Any], above: list[Mapping[str, Any]], read: Reader
) -> bool:
    """Whether the pod shows what its job's controller would have made (lifecycle/pod_origin.py): created
    no earlier than any object of its chain, from the job's current pod template. A TrainJob's template is
    in the TrainingRuntime it references (read here)."""
    if not created_after(pod, above):
        return False
    runtime = None
    if job.get("kind") == trainjob.KIND:  # its pod template lives in the TrainingRuntime it references
        ref = (job.get("spec") or {}).get("runtimeRef") or {}
        namespace = str((job.get("metadata") or {}).get("namespace") or "")
        if ref.get("kind") == TRAINING_RUNTIME.kind and ref.get("name") and namespace:
            runtime = read(TRAINING_RUNTIME, namespace, str(ref["name"]))
    return made_from(pod, job_templates(job, runtime))


def of_child(found: Lineage | None, btj: Mapping[str, Any]) -> bool:
    """Whether a pod of this lineage is a worker of this BTJ's current child.

    The BTJ must be the one the job names (same uid: not a predecessor of the same name); when the BTJ has
    recorded its child's uid, the job must be that child (a deleted child's pods are not this one's).
    """
    if found is None or (btj.get("metadata") or {}).get("uid") != found.btj_uid:
        return False
    child = (btj.get("status") or {}).get("child") or {}
    if not isinstance(child, Mapping) or not child.get("name"):
        return True  # not recorded yet: the job is controlled by this very BTJ, which is enough
    if child.get("kind") and child.get("kind") != found.kind:
        return False
    if child.get("uid"):
        return bool(child["uid"] == found.uid)
    return bool(child["name"] == found.name)
