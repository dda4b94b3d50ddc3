"""What the trainer pods name (their ServiceAccount, pull Secrets, checkpoint folder): the rules and messages
(pure).

A ServiceAccount that does not exist makes the training operator's pod creates fail ("serviceaccount not
found") where only its own Events say so; the BTJ would show a job that never starts. The reconcile pass
reads it first (handlers/preflight.py) and, when it is missing, creates nothing and says why. A missing
pull Secret only warns: the kubelet skips a pull secret it cannot find and still pulls with the node's own
credentials (on EKS the node role reaches ECR), so the job may well run. A checkpoint folder another
BlackwellTrainingJob of the namespace saves into holds the create too: two jobs in one folder would resume
each other's checkpoints (the trainer refuses another job's, docs/trainer.md "Whose checkpoint it is").
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from blackwell_operator.lifecycle.child_record import is_finished, runs_again
from blackwell_operator.lifecycle.conditions import ConditionChange
from blackwell_operator.lifecycle.status_read import StatusLike
from blackwell_operator.models.status import ConditionType

# ChildCreated's reason while spec.serviceAccountName names no ServiceAccount of the namespace.
SERVICE_ACCOUNT_MISSING = "ServiceAccountMissing"
# ChildCreated's (or, for a child that exists, SpecApplied's) reason while the pods' ServiceAccount is one
# they may not run as: the operator's own, or one no admin allowed (admission/accounts.py).
SERVICE_ACCOUNT_NOT_ALLOWED = "ServiceAccountNotAllowed"
# ChildCreated's reason while another BTJ of the namespace holds spec.training.checkpoint.path.
CHECKPOINT_PATH_IN_USE = "CheckpointPathInUse"
# ImagePullSecretsFound's reasons.
PULL_SECRET_MISSING = "ImagePullSecretMissing"
PULL_SECRETS_FOUND = "Found"


@dataclass(frozen=True)
class Blocked:
    """Why the child may not be created (`creating`) or changed: the condition reason and its message."""

    reason: str
    message: str
    creating: bool = True


@dataclass
class Preflight:
    """What the checks found: conditions to record, and why nothing may be created or changed (None: go
    on)."""

    conditions: list[ConditionChange] = field(default_factory=list)
    blocked: Blocked | None = None
    path_in_use: str | None = None  # why not: another BTJ holds the checkpoint folder (its message)


def would_create(status: StatusLike, generation: int, *, child_exists: bool) -> bool:
    """Whether this pass would create a child: none exists, and the job is not one that finished with the
    current spec (that one is never run again, lifecycle/child_apply.py). Only a create needs the account:
    a running job's pods exist already."""
    if child_exists:
        return False
    return not (is_finished(status) and not runs_again(generation, status))


def service_account_missing(name: str, namespace: str) -> str:
    """ChildCreated's message: the field, what is missing, the fix, and that the operator waits."""
    return (
        f"spec.serviceAccountName: ServiceAccount {name} does not exist in namespace {namespace}, so the "
        f"trainer pods could not start; nothing was created. Fix: create it (kubectl -n {namespace} create "
        f"serviceaccount {name}, with its IAM role for S3), or change spec.serviceAccountName; the job is "
        "created once it exists"
    )


def checkpoint_folder(btj: Mapping[str, Any]) -> str | None:
    """A BTJ's spec.training.checkpoint.path, normalised ("/fsx/a/" is "/fsx/a"); None when it has none. Read
    from the raw object: another BTJ's spec is read whatever its state, an invalid one included."""
    training = (btj.get("spec") or {}).get("training") or {}
    path = (training.get("checkpoint") or {}).get("path") if isinstance(training, dict) else None
    return posixpath.normpath(path) if isinstance(path, str) and path else None


def _created(btj: Mapping[str, Any]) -> tuple[str, str]:
    meta = btj.get("metadata") or {}
    return str(meta.get("creationTimestamp") or ""), str(meta.get("name") or "")


def path_holder(me: Mapping[str, Any], others: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The BTJ of the namespace that holds `me`'s checkpoint folder before it, if any: one of `others` (the
    namespace's BTJs, `me` among them or not) with the same folder that is not being deleted and has a
    child recorded, or was created first (the name breaks a tie of the second-resolution timestamps)."""
    folder = checkpoint_folder(me)
    if folder is None:
        return None
    uid = (me.get("metadata") or {}).get("uid")
    holders = [
        other
        for other in others
        if (other.get("metadata") or {}).get("uid") != uid
        and not (other.get("metadata") or {}).get("deletionTimestamp")
        and checkpoint_folder(other) == folder
        and ((other.get("status") or {}).get("child") or _created(other) < _created(me))
    ]
    return min(holders, key=_created) if holders else None


def checkpoint_path_in_use(folder: str, holder: Mapping[str, Any]) -> str:
    """ChildCreated's message: the field, the BTJ holding the folder, the fix, and that the operator waits."""
    meta = holder.get("metadata") or {}
    name, namespace = meta.get("name"), meta.get("namespace")
    return (
        f"spec.training.checkpoint.path: {folder} is the checkpoint folder of BlackwellTrainingJob {name} in "
        f"namespace {namespace}; two jobs saving into one folder would resume each other's checkpoints, so "
        "nothing was created. Fix: give this job a checkpoint.path of its own (to start from that job's "
        f"weights, set spec.training.checkpoint.startFrom: {folder}), or delete {name}; the job is created "
        "once the folder is free"
    )


def pull_secrets_condition(names: Sequence[str], missing: Sequence[str], namespace: str) -> ConditionChange:
    """Condition ImagePullSecretsFound: True when every spec.imagePullSecrets name is a Secret of the
    namespace, else False naming the first missing one (advisory: the job is created all the same)."""
    if not missing:
        found = ", ".join(names) if names else "none named"
        return ConditionChange(
            ConditionType.IMAGE_PULL_SECRETS_FOUND, "True", PULL_SECRETS_FOUND, f"Secrets: {found}."
        )
    index = list(names).index(missing[0])
    others = f" (also missing: {', '.join(missing[1:])})" if len(missing) > 1 else ""
    message = (
        f"spec.imagePullSecrets[{index}].name: Secret {missing[0]} does not exist in namespace {namespace}"
        f"{others}; the kubelet skips it and pulls with the node's own credentials, which may fail for a "
        f"private registry. Fix: create it (kubectl -n {namespace} create secret docker-registry "
        f"{missing[0]} ...), or remove it from spec.imagePullSecrets"
    )
    return ConditionChange(ConditionType.IMAGE_PULL_SECRETS_FOUND, "False", PULL_SECRET_MISSING, message)
