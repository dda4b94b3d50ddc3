"""The operator's environment settings (`BTJ_*`), read and checked by pydantic-settings; one line if bad.

The operator reads them at start and refuses to run with a value it cannot use, naming the variable and
the fix, rather than fall back to a default the user did not ask for.
"""

from __future__ import annotations

import json
import os
import re
import threading
from typing import Annotated, Any

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

PREFIX = "BTJ_"
# Settings where 0 means "off" (the loop does not run) rather than "no time at all".
OFF_AT_ZERO = frozenset({"stuck_pod_timeout_s", "measure_interval_s", "elastic_interval_s"})
_PROBLEMS = {
    "float_parsing": "not a number of seconds",
    "float_type": "not a number of seconds",
    "finite_number": "not a finite number of seconds",
    "greater_than_equal": "must not be negative",
    "greater_than": "must be positive",
    "string_pattern_mismatch": "not an image reference (it has whitespace)",
    "bool_parsing": "not true or false",
}
# The fix for settings whose default is not a number of seconds.
_FIXES = {
    "default_trainer_image": "Fix: e.g. 123456789012.dkr.ecr.us-west-2.amazonaws.com/blackwell-trainer:0.1.0 "
    "(the chart sets it from trainerImage)",
    "cluster_calibration_namespace": "Fix: e.g. btj-system (the chart sets it to the release's namespace)",
    "check_image_pull_secrets": "Fix: true or false (the chart sets it from operator.checkImagePullSecrets)",
    "cluster_calibration_pool": "Fix: true or false (false: each namespace learns from its own jobs)",
    "free_capacity": "Fix: true or false (the chart sets it from operator.freeCapacity)",
    "allowed_service_accounts": "Fix: a JSON list of ServiceAccount names or namespace/name pairs, e.g. "
    '["default", "team-a/training-s3"], or [] (the chart sets it from operator.allowedServiceAccounts)',
    "operator_namespace": "Fix: the operator pod's namespace (the chart sets it from the downward API)",
    "operator_service_account": "Fix: the operator pod's ServiceAccount name (the chart sets it)",
}
# Problems that depend on the setting, not only on the kind of error.
_FIELD_PROBLEMS = {
    "cluster_calibration_namespace": "not a namespace name (lowercase letters, digits and '-')",
    "operator_namespace": "not a namespace name (lowercase letters, digits and '-')",
    "operator_service_account": "not a ServiceAccount name (lowercase letters, digits, '-' and '.')",
    "allowed_service_accounts": "not a JSON list of ServiceAccount names or namespace/name pairs",
}
# A namespace is a DNS label; a ServiceAccount's name a DNS subdomain (Kubernetes' object name rules).
_NAMESPACE = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_ACCOUNT = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_ALLOWED_ENTRY = re.compile(rf"^({_NAMESPACE}/)?{_ACCOUNT}$")


class OperatorEnvironment(BaseSettings):
    """Every `BTJ_*` variable the operator reads; unset or empty means the default."""

    model_config = SettingsConfigDict(env_prefix=PREFIX, env_ignore_empty=True, extra="ignore", frozen=True)

    child_retry_interval_s: float = Field(
        60.0, gt=0, allow_inf_nan=False, description="Seconds between re-create attempts of a lost child."
    )
    # Past the pod's own deletion deadline (deletionTimestamp already includes its grace period): long
    # enough for a node that only blinked to come back, short against a job idling with all its GPUs.
    stuck_pod_timeout_s: float = Field(
        300.0,
        ge=0,
        allow_inf_nan=False,
        description="Seconds past a pod's deletion deadline before it is force-deleted; 0: off.",
    )
    measure_interval_s: float = Field(
        60.0, ge=0, allow_inf_nan=False, description="Seconds between throughput readings; 0: off."
    )
    # The grace periods of elastic jobs are minutes; a look every 30 s reacts well within them.
    elastic_interval_s: float = Field(
        30.0,
        ge=0,
        allow_inf_nan=False,
        description="Seconds between checks of elastic jobs' healthy nodes against their plans; 0: off.",
    )
    # The largest job plans in milliseconds (benchmarks/results/plan_speed.json); a thousand times that is
    # still short next to the watch timeouts, and long enough for a CPU shared with other work.
    plan_deadline_s: float = Field(
        10.0, gt=0, allow_inf_nan=False, description="Seconds one reconcile may plan before it is Invalid."
    )
    # The chart sets it to the release's namespace; unset, no cluster calibration is kept or applied.
    cluster_calibration_namespace: str | None = Field(
        None,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        description="Namespace of the cluster-calibration ConfigMap; None: measured runs teach nothing.",
    )
    # Off by default: a plan learns from its own namespace's jobs only, so no team's jobs move another's
    # plans. On, every namespace's newest jobs count (each capped: calibration/cluster.py).
    cluster_calibration_pool: bool = Field(
        False, description="Pool the cluster calibration across namespaces (each namespace capped)."
    )
    # "off" disables the server (e.g. several operators in one test).
    # Reading Secrets is a broad grant (RBAC cannot limit it to their names), so the check is opt-in: the
    # chart grants `get secrets` and sets this only with operator.checkImagePullSecrets.
    check_image_pull_secrets: bool = Field(
        False, description="Check that spec.imagePullSecrets name Secrets of the namespace (advisory)."
    )
    metrics_bind: str | None = Field(
        None, description="host:port of the metrics and health server, or 'off'; None: all interfaces."
    )
    # On, the operator lists the pods on nodes cluster-wide (their node, phase and GPU requests only) to
    # count the nodes other workloads hold (discovery/capacity.py); the chart sets it from
    # operator.freeCapacity and grants `list pods` cluster-wide with it. Off: capacity counts allocatable.
    free_capacity: bool = Field(
        True, description="Count free GPUs: allocatable minus what pods on each node request."
    )
    # A burst of BTJs reads capacity once per this many seconds; a node or pod change shows within it.
    capacity_cache_s: float = Field(
        5.0, ge=0, allow_inf_nan=False, description="Seconds a LIST of nodes or pods is reused."
    )
    # The chart sets it from trainerImage; an image reference has no whitespace, and one that does would
    # render every pod with an image no node can pull, so the operator refuses to start instead.
    default_trainer_image: str | None = Field(
        None,
        pattern=r"^\S+$",
        description="Trainer image for a BlackwellTrainingJob whose spec names none; None: the built-in.",
    )

    # Who the operator runs as (the chart passes both from the downward API): a BTJ's pods may never run
    # as this account (admission/accounts.py). Unset (the operator run off the cluster with a kubeconfig):
    # no account is known to be the operator's, and only the allow-list and the label decide.
    operator_namespace: str | None = Field(
        None, pattern=rf"^{_NAMESPACE}$", description="The operator pod's namespace."
    )
    operator_service_account: str | None = Field(
        None, pattern=rf"^{_ACCOUNT}$", description="The operator pod's ServiceAccount."
    )
    # The ServiceAccounts trainer pods may run as without an admin's label on them: a name (in any served
    # namespace) or namespace/name. A JSON list, so that the chart's empty list reads as no account rather
    # than as unset. `default`: the namespace's default account, which a BTJ naming none runs as.
    allowed_service_accounts: Annotated[tuple[str, ...], NoDecode] = Field(
        ("default",), description="ServiceAccounts trainer pods may run as without the training label."
    )

    @field_validator("allowed_service_accounts", mode="before")
    @classmethod
    def _accounts(cls, value: object) -> object:
        entries = json.loads(value) if isinstance(value, str) else value
        if not isinstance(entries, list | tuple) or not all(
            isinstance(entry, str) and _ALLOWED_ENTRY.match(entry) for entry in entries
        ):
            raise ValueError("not a list of ServiceAccount names or namespace/name pairs")
        return tuple(entries)

    @field_validator("default_trainer_image", mode="before")
    @classmethod
    def _strip(cls, value: object) -> object:
        # Surrounding whitespace (a YAML block scalar's newline) is not part of the reference.
        return (value.strip() or None) if isinstance(value, str) else value


def env_name(field: str) -> str:
    """The environment variable of a setting, e.g. BTJ_STUCK_POD_TIMEOUT_S."""
    if field not in OperatorEnvironment.model_fields:
        raise KeyError(f"no operator setting {field!r}")
    return f"{PREFIX}{field.upper()}"


def _one_line(error: dict[str, Any]) -> str:
    field = str(error["loc"][0])
    default = OperatorEnvironment.model_fields[field].default
    fix = _FIXES.get(field) or f"Fix: e.g. {default:g}" + (", or 0 for off" if field in OFF_AT_ZERO else "")
    problem = _FIELD_PROBLEMS.get(field) or _PROBLEMS.get(error["type"], error["msg"])
    return f"{env_name(field)}={error['input']!r}: {problem}. {fix}"


# The settings last read, by the BTJ_* variables they were read from: pydantic-settings takes about a
# millisecond per read and a reconcile pass reads them several times.
_LAST: tuple[tuple[tuple[str, str], ...], OperatorEnvironment] | None = None
_LAST_LOCK = threading.Lock()


def _variables() -> tuple[tuple[str, str], ...]:
    """Every environment variable pydantic-settings may read for the settings (names are case-insensitive)."""
    return tuple(sorted((k, v) for k, v in os.environ.items() if k.upper().startswith(PREFIX)))


def operator_environment() -> OperatorEnvironment:
    """The settings as the environment has them now; ValueError with one line for the first bad one."""
    global _LAST
    variables = _variables()
    with _LAST_LOCK:
        if _LAST is not None and _LAST[0] == variables:
            return _LAST[1]
    try:
        settings = OperatorEnvironment()
    except ValidationError as exc:
        raise ValueError(_one_line(dict(exc.errors()[0]))) from None
    with _LAST_LOCK:
        _LAST = (variables, settings)
    return settings
