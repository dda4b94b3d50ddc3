"""Before a child is created: the ServiceAccount its pods run as must exist, its pull Secrets should.

The rules and messages are lifecycle/references.py's; this module makes the reads. A read the API refuses
(403: a chart without the grant) or cannot answer is advisory: logged, and the pass goes on as if the
object were there, so that a missing permission never stops a job that would run.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from blackwell_operator.handlers.api import ApiError, KubeApi, resource_path
from blackwell_operator.handlers.logs import Logger
from blackwell_operator.lifecycle.references import (
    Preflight,
    pull_secrets_condition,
    service_account_missing,
    would_create,
)
from blackwell_operator.models.spec import BlackwellTrainingJobSpec
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
    if account and _exists(api, "serviceaccounts", namespace, account, logger) is False:
        try:
            child_exists = api.get(job_path) is not None
        except ApiError as exc:
            logger.warning(f"Cannot read the child {job_path}: {exc}")
            return found  # the create path reads it again and reports what it finds
        generation = int(meta.get("generation") or 1)
        if would_create(stored, generation, child_exists=child_exists):
            found.blocked = service_account_missing(account, namespace)
    return found
