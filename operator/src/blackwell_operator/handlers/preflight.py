"""Before a child is created or changed: the ServiceAccount its pods run as must be one they may use, and
exist; its pull Secrets should exist; no other BlackwellTrainingJob of the namespace may hold its checkpoint
folder.

The rules and messages are admission/accounts.py's and lifecycle/references.py's; this module makes the
reads. The account decides whose rights the pods get, so it fails closed: a read of an account the
allow-list does not name that the API refuses or cannot answer holds the child, saying so. The other reads
are advisory: logged, and the pass goes on as if the object were there, so that a missing permission never
stops a job that would run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from blackwell_operator.admission.accounts import (
    AccountPolicy,
    marked,
    not_allowed,
    operators_account,
    pods_account,
    unverified,
)
from blackwell_operator.handlers.api import ApiError, KubeApi, resource_path
from blackwell_operator.handlers.btjstatus import BTJ_API_VERSION
from blackwell_operator.handlers.logs import Logger
from blackwell_operator.lifecycle.child_record import render_hash
from blackwell_operator.lifecycle.references import (
    SERVICE_ACCOUNT_MISSING,
    SERVICE_ACCOUNT_NOT_ALLOWED,
    Blocked,
    Preflight,
    checkpoint_folder,
    checkpoint_path_in_use,
    path_holder,
    pull_secrets_condition,
    service_account_missing,
    would_create,
)
from blackwell_operator.models.spec import PLURAL, BlackwellTrainingJobSpec
from blackwell_operator.models.status import BlackwellTrainingJobStatus
from blackwell_operator.settings import operator_environment


def account_policy() -> AccountPolicy:
    """The operator's own account and the allow-list, as the operator's environment has them now."""
    settings = operator_environment()
    own = settings.operator_namespace, settings.operator_service_account
    operator = (own[0], own[1]) if own[0] and own[1] else None
    return AccountPolicy(operator=operator, allowed=settings.allowed_service_accounts)


def _exists(api: KubeApi, plural: str, namespace: str, name: str, logger: Logger) -> bool | None:
    """Whether the core object exists; None when the read failed (logged)."""
    try:
        return api.get(resource_path("v1", plural, namespace, name)) is not None
    except ApiError as exc:
        logger.warning(f"Cannot check {plural} {namespace}/{name} (going on as if it exists): {exc}")
        return None


def check_references(
    api: KubeApi,
    body: Mapping[str, Any],
    spec: BlackwellTrainingJobSpec,
    job: Mapping[str, Any],
    job_path: str,
    logger: Logger,
    *,
    stored: BlackwellTrainingJobStatus,
    renders: tuple[str | None, ...] = (),
) -> Preflight:
    """Read what the rendered child `job`'s pods name: their ServiceAccount (a create or a change of the
    child waits for one they may use) and, when BTJ_CHECK_IMAGE_PULL_SECRETS is on, spec.imagePullSecrets
    (a Warning condition only). `stored`: the BTJ's status as the pass parsed it; `renders`: other render
    hashes that count as this render (an earlier operator version's)."""
    meta, found = body["metadata"], Preflight()
    namespace = str(meta["namespace"])
    if operator_environment().check_image_pull_secrets:
        names = [secret.name for secret in spec.image_pull_secrets]
        checked = {name: _exists(api, "secrets", namespace, name, logger) for name in names}
        if None not in checked.values():  # a refused read says nothing either way
            missing = [name for name in names if not checked[name]]
            found.conditions.append(pull_secrets_condition(names, missing, namespace))
    refusal = _account_refusal(api, namespace, spec, account_policy(), logger)
    if refusal is None and not spec.training.checkpoint.path:
        return found
    change = _change(api, job, job_path, meta, stored, logger, renders)
    if change is None:
        return found  # nothing new for the pods: a running job's pods exist already
    if refusal is not None:
        reason, message = refusal
        found.blocked = Blocked(reason, message, creating=change == "create")
    elif change == "create":
        found.path_in_use = _path_in_use(api, body, namespace, logger)
    return found


def _account_refusal(
    api: KubeApi, namespace: str, spec: BlackwellTrainingJobSpec, policy: AccountPolicy, logger: Logger
) -> tuple[str, str] | None:
    """(reason, message) when the pods may not run as their account, or it does not exist; None when they
    may. The operator's own account first and whatever marks it: admission refuses it too, this is the
    last line before a child."""
    name, named = pods_account(spec), bool(spec.service_account_name)
    if policy.is_operators(namespace, name):
        return SERVICE_ACCOUNT_NOT_ALLOWED, operators_account(namespace, name, named=named).message
    listed = policy.listed(namespace, name)
    if listed and not named:
        return None  # the namespace's default account, allowed: every namespace has one
    try:
        account = api.get(resource_path("v1", "serviceaccounts", namespace, name))
    except ApiError as exc:
        if listed:  # allowed by name: whether it exists is advisory, as before
            logger.warning(f"Cannot check serviceaccounts {namespace}/{name} (going on, it is listed): {exc}")
            return None
        logger.warning(f"Cannot read serviceaccounts {namespace}/{name}; the child waits: {exc}")
        return SERVICE_ACCOUNT_NOT_ALLOWED, unverified(namespace, name, f"HTTP {exc.status or 'no answer'}")
    if account is None:
        return SERVICE_ACCOUNT_MISSING, service_account_missing(name, namespace)
    if listed or marked(account):
        return None
    return SERVICE_ACCOUNT_NOT_ALLOWED, not_allowed(namespace, name, named=named)


def _change(
    api: KubeApi,
    job: Mapping[str, Any],
    path: str,
    meta: Mapping[str, Any],
    stored: BlackwellTrainingJobStatus,
    logger: Logger,
    renders: tuple[str | None, ...],
) -> str | None:
    """ "create" when this pass would create the child, "patch" when the child it finds holds another render
    (its pods may be made anew from this one), None when neither or the child cannot be read (logged: the
    create path reads it again and reports what it finds)."""
    try:
        existing = api.get(path)
    except ApiError as exc:
        logger.warning(f"Cannot read the child {path}: {exc}")
        return None
    if existing is None:
        generation = int(meta.get("generation") or 1)
        return "create" if would_create(stored, generation, child_exists=False) else None
    return None if render_hash(existing) in {render_hash(job), *renders} else "patch"


def _path_in_use(api: KubeApi, body: Mapping[str, Any], namespace: str, logger: Logger) -> str | None:
    """ChildCreated's message when another BTJ of the namespace holds this one's checkpoint folder."""
    try:
        others = api.list(resource_path(BTJ_API_VERSION, PLURAL, namespace))
    except ApiError as exc:  # advisory, as the reads above: the trainer refuses another job's checkpoints
        logger.warning(f"Cannot list the BlackwellTrainingJobs of {namespace} (going on): {exc}")
        return None
    holder = path_holder(body, others)
    folder = checkpoint_folder(body)
    return None if holder is None or folder is None else checkpoint_path_in_use(folder, holder)
