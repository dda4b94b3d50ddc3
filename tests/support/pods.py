"""What the training operator and the kubelet write: trainer pods, their containers, the job's conditions."""

from __future__ import annotations

import copy
import datetime
import time
from collections.abc import Mapping
from typing import Any

from blackwell_operator.lifecycle.ownership import Lineage
from blackwell_operator.render.labels import own_labels
from blackwell_trainer.plan.config import PERMANENT_ERROR_PREFIX
from tests.support.manifests import NAMESPACE


def _at(offset_s: float) -> str:
    """An RFC 3339 time `offset_s` from when the tests started: the operator compares failure times with
    its own clock (a failure long before a restart is not its cause), so they must be near now."""
    return datetime.datetime.fromtimestamp(_START + offset_s, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


_START = time.time()
# A worker failure, one three minutes later, and an hour later. Collected at import: the integration tests
# that compare them with the operator's clock must run within CASCADE_WINDOW_S (15 min) of collection,
# which the whole suite (about 3 min) does.
T1, T2, T3 = _at(-60), _at(120), _at(3540)


def terminated(code: int, reason: str, finished: str, message: str | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"exitCode": code, "reason": reason, "startedAt": T1, "finishedAt": finished}
    if message is not None:
        out["message"] = message
    return out


def container(
    state: dict[str, Any] | None = None, last: dict[str, Any] | None = None, name: str = "pytorch"
) -> dict[str, Any]:
    return {
        "name": name,
        "ready": False,
        "restartCount": 1 if last else 0,
        "image": "ghcr.io/blackwell-dev/blackwell-trainer:0.1.0",
        "state": state or {"running": {"startedAt": T1}},
        "lastState": last or {},
    }


def pod_status(*containers: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"phase": "Running", "containerStatuses": list(containers), **extra}


def worker_template(job: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The pod template a controller makes `job`'s pods from, where the test's owner carries one: a
    PyTorchJob's Worker, a HyperPodPyTorchJob's first replica, a batch Job's template. Spelled out here, not
    taken from the operator, so that the two agree only where the upstream shapes do."""
    spec = job.get("spec") or {}
    if job.get("kind") == "PyTorchJob":
        template = ((spec.get("pytorchReplicaSpecs") or {}).get("Worker") or {}).get("template")
    elif job.get("kind") == "HyperPodPyTorchJob":
        template = ((spec.get("replicaSpecs") or [{}])[0]).get("template")
    else:
        template = spec.get("template")
    return template if template and (template.get("spec") or {}).get("containers") else None


def pod(name: str, job: str = "w", *, owner: dict[str, Any] | None = None, **meta: Any) -> dict[str, Any]:
    """A trainer pod as the Kubeflow training operator creates it: from its owner's pod template when the
    owner carries one (the template deep-copied, its labels kept, the controller's own label added), else
    a bare trainer container with our template labels."""
    template = worker_template(owner) if owner is not None else None
    labels = dict((template or {}).get("metadata", {}).get("labels") or own_labels(job))
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": NAMESPACE,
        "labels": {**labels, "training.kubeflow.org/job-name": job},
        **meta,
    }
    if owner is not None:
        metadata["ownerReferences"] = [
            {
                "apiVersion": owner["apiVersion"],
                "kind": owner["kind"],
                "name": owner["metadata"]["name"],
                "uid": owner["metadata"]["uid"],
                "controller": True,
            }
        ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": copy.deepcopy(dict(template["spec"]))
        if template is not None
        else {"containers": [{"name": "pytorch", "image": "ghcr.io/blackwell-dev/blackwell-trainer:0.1.0"}]},
    }


# What the trainer writes to its termination message for a checkpoint that does not fit the plan.
PERMANENT_TRAINER_ERROR = (
    f"{PERMANENT_ERROR_PREFIX}checkpoint /fsx/ckpt/w/step-400 was written by 16 data-parallel ranks and this "
    "plan has 8: resume it with the same spec.cluster, or start a new checkpoint.path"
)


def job_condition(type_: str, status: str = "True", message: str = "") -> dict[str, Any]:
    """One PyTorchJob status condition as the training operator writes it."""
    return {"type": type_, "status": status, "reason": f"PyTorchJob{type_}", "message": message}


RESTARTING = {
    "conditions": [
        job_condition("Created"),
        job_condition("Running", "False"),
        job_condition("Restarting", message="PyTorchJob w is restarting because 1 Worker replica(s) failed."),
    ]
}


def verified(btj: dict[str, Any], job_uid: str | None = None, kind: str = "PyTorchJob") -> Lineage:
    """The owner chain the operator verifies for a genuine worker of `btj`'s child (its recorded uid, or
    `job_uid`), as lifecycle.ownership.lineage returns it from the API."""
    meta, child = btj["metadata"], (btj.get("status") or {}).get("child") or {}
    uid = job_uid or child.get("uid") or "u-job"
    return Lineage(kind, child.get("name") or meta["name"], uid, meta["name"], meta.get("uid") or "u-btj")
