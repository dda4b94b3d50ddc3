"""Which ServiceAccount a BTJ's pods may run as: never the operator's own; else one the admins allowed.

A BTJ's author names `spec.serviceAccountName`; whoever the cluster's admins are decides which accounts
that may be (docs/security.md). The operator's own account is refused whatever marks it carries: its pods
would run the BTJ's image with every right the operator has. Any other account is accepted when the
chart's allow-list names it (`operator.allowedServiceAccounts`, `BTJ_ALLOWED_SERVICE_ACCOUNTS`) or an
admin labelled it `training.blackwell.dev/allowed: "true"`. The rules and messages are here (pure);
handlers/pass_inputs.py refuses the operator's own account at admission, handlers/preflight.py reads the
account and applies the rest before a child is made or changed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from blackwell_operator.errors import SpecError
from blackwell_operator.models.spec import API_GROUP, BlackwellTrainingJobSpec

# The label an admin puts on a ServiceAccount that trainer pods may run as, and its one value.
TRAINING_ACCOUNT_LABEL = f"{API_GROUP}/allowed"
TRAINING_ACCOUNT_VALUE = "true"
# The account a pod that names none runs as (the ServiceAccount admission controller's default).
DEFAULT_ACCOUNT = "default"
FIELD = "spec.serviceAccountName"
# The chart's value that lists accounts allowed without the label.
ALLOW_LIST_VALUE = "operator.allowedServiceAccounts"


@dataclass(frozen=True)
class AccountPolicy:
    """The operator's own account (namespace, name), when known, and the allow-list: names (any served
    namespace) or namespace/name."""

    operator: tuple[str, str] | None = None
    allowed: tuple[str, ...] = (DEFAULT_ACCOUNT,)

    def is_operators(self, namespace: str, name: str) -> bool:
        return self.operator == (namespace, name)

    def listed(self, namespace: str, name: str) -> bool:
        return name in self.allowed or f"{namespace}/{name}" in self.allowed


def pods_account(spec: BlackwellTrainingJobSpec) -> str:
    """The ServiceAccount the trainer pods run as: the named one, else the namespace's default."""
    return spec.service_account_name or DEFAULT_ACCOUNT


def marked(account: Mapping[str, Any]) -> bool:
    """Whether an admin labelled the ServiceAccount object for training."""
    labels = (account.get("metadata") or {}).get("labels") or {}
    return labels.get(TRAINING_ACCOUNT_LABEL) == TRAINING_ACCOUNT_VALUE


def _which(name: str, named: bool) -> str:
    return f"ServiceAccount {name}" if named else f"unset, so the pods would run as ServiceAccount {name}"


def operators_account(namespace: str, name: str, *, named: bool) -> SpecError:
    """The refusal of the operator's own account: the field, why, and the fix."""
    return SpecError(
        FIELD,
        f"{_which(name, named)}, the operator's own account in namespace {namespace}; trainer pods never "
        "run with the operator's rights, so nothing was created",
        f"name a ServiceAccount made for training (kubectl -n {namespace} create serviceaccount training, "
        f"and an admin runs kubectl -n {namespace} label serviceaccount training "
        f"{TRAINING_ACCOUNT_LABEL}={TRAINING_ACCOUNT_VALUE}), and serve BlackwellTrainingJobs outside the "
        "operator's namespace (the chart's operator.watchNamespaces)",
    )


def refuse_operators_account(namespace: str, spec: BlackwellTrainingJobSpec, policy: AccountPolicy) -> None:
    """Admission: SpecError when the pods would run as the operator's own account."""
    name = pods_account(spec)
    if policy.is_operators(namespace, name):
        raise operators_account(namespace, name, named=bool(spec.service_account_name))


def not_allowed(namespace: str, name: str, *, named: bool) -> str:
    """The refusal of an account no admin allowed: the field, why, the fixes, and that the operator waits."""
    return (
        f"{FIELD}: {_which(name, named)} of namespace {namespace} is not allowed for training: the cluster's "
        "admins decide which accounts trainer pods may run as, so nothing was created. Fix: an admin "
        f"labels it (kubectl -n {namespace} label serviceaccount {name} "
        f"{TRAINING_ACCOUNT_LABEL}={TRAINING_ACCOUNT_VALUE}) or adds {namespace}/{name} to the chart's "
        f"{ALLOW_LIST_VALUE}, or name an allowed account; the job is created once it is allowed"
    )


def unverified(namespace: str, name: str, error: str) -> str:
    """The refusal of an account the operator could not read: whether it is allowed is unknown."""
    return (
        f"{FIELD}: ServiceAccount {name} of namespace {namespace} could not be read ({error}), so whether "
        "an admin allowed it for training is unknown and nothing was created. Fix: grant the operator get "
        f"on serviceaccounts in {namespace} (the chart's Role does), or add {namespace}/{name} to the "
        f"chart's {ALLOW_LIST_VALUE}; the operator looks again"
    )
