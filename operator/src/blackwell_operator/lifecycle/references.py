"""What the trainer pods name (their ServiceAccount, pull Secrets): the rules and messages (pure).

A ServiceAccount that does not exist makes the training operator's pod creates fail ("serviceaccount not
found") where only its own Events say so; the BTJ would show a job that never starts. The reconcile pass
reads it first (handlers/preflight.py) and, when it is missing, creates nothing and says why. A missing
pull Secret only warns: the kubelet skips a pull secret it cannot find and still pulls with the node's own
credentials (on EKS the node role reaches ECR), so the job may well run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from blackwell_operator.lifecycle.child_record import is_finished, runs_again
from blackwell_operator.lifecycle.conditions import ConditionChange
from blackwell_operator.lifecycle.status_read import StatusLike
from blackwell_operator.models.status import ConditionType

# ChildCreated's reason while spec.serviceAccountName names no ServiceAccount of the namespace.
SERVICE_ACCOUNT_MISSING = "ServiceAccountMissing"
# ImagePullSecretsFound's reasons.
PULL_SECRET_MISSING = "ImagePullSecretMissing"
PULL_SECRETS_FOUND = "Found"


@dataclass
class Preflight:
    """What the checks found: conditions to record, and why nothing may be created (None: go on)."""

    conditions: list[ConditionChange] = field(default_factory=list)
    blocked: str | None = None


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
