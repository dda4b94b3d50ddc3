"""Before a child is created: the ServiceAccount its pods run as must exist, its pull Secrets should, and
no other BlackwellTrainingJob of the namespace may hold its checkpoint folder.

The rules and messages are lifecycle/references.py's; this module makes the reads. A read the API refuses
(403: a chart without the grant) or cannot answer is advisory: logged, and the pass goes on as if the
object were there, so that a missing permission never stops a job that would run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from blackwell_operator.handlers.api import ApiError, KubeApi, resource_path
from blackwell_operator.handlers.btjstatus import BTJ_API_VERSION
from blackwell_operator.handlers.logs import Logger
from blackwell_operator.lifecycle.references import (
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
    job_path: str,
    logger: Logger,
    *,
    stored: BlackwellTrainingJobStatus,
) -> Preflight:
    """Read what the rendered child's pods name: spec.serviceAccountName (a create waits for it) and, when
    BTJ_CHECK_IMAGE_PULL_SECRETS is on, spec.imagePullSecrets (a Warning condition only). `stored`: the
    BTJ's status as the pass parsed it."""
    meta, found = body["metadata"], Preflight()
    namespace = str(meta["namespace"])
    if operator_environment().check_image_pull_secrets:
        names = [secret.name for secret in spec.image_pull_secrets]
        checked = {name: _exists(api, "secrets", namespace, name, logger) for name in names}
        if None not in checked.values():  # a refused read says nothing either way
            missing = [name for name in names if not checked[name]]
            found.conditions.append(pull_secrets_condition(names, missing, namespace))
    account = spec.service_account_name
    no_account = bool(account) and _exists(api, "serviceaccounts", namespace, str(account), logger) is False
    if not (no_account or spec.training.checkpoint.path) or not _creating(
        api, job_path, meta, stored, logger
    ):
        return found  # only a create needs them: a running job's pods exist already
    if no_account:
        found.blocked = service_account_missing(str(account), namespace)
    else:
        found.path_in_use = _path_in_use(api, body, namespace, logger)
    return found


def _creating(
    api: KubeApi, job_path: str, meta: Mapping[str, Any], stored: BlackwellTrainingJobStatus, logger: Logger
) -> bool:
    """Whether this pass would create the child; False when the child cannot be read (logged: the create
    path reads it again and reports what it finds)."""
    try:
        child_exists = api.get(job_path) is not None
    except ApiError as exc:
        logger.warning(f"Cannot read the child {job_path}: {exc}")
        return False
    return would_create(stored, int(meta.get("generation") or 1), child_exists=child_exists)


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
