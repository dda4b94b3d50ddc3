"""Writing BTJ status: read-modify-write on the status subresource, guarded by resourceVersion."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from blackwell_operator.handlers import retrying
from blackwell_operator.handlers.api import ApiError, KubeApi, resource_path
from blackwell_operator.handlers.context import OperatorContext
from blackwell_operator.lifecycle.child_record import CHILD_DELETED as CHILD_DELETED
from blackwell_operator.lifecycle.child_record import deleted_child_uid as deleted_child_uid
from blackwell_operator.lifecycle.child_record import is_finished as is_finished
from blackwell_operator.models.spec import API_GROUP, API_VERSION, PLURAL

BTJ_API_VERSION = f"{API_GROUP}/{API_VERSION}"
_LOG = logging.getLogger(__name__)

# Given the BTJ as it is now, the new status (full replacement of the keys it names; None deletes a key),
# or None when nothing needs writing.
StatusUpdate = Callable[[Mapping[str, Any]], dict[str, Any] | None]


def btj_path(namespace: str, name: str, subresource: str | None = None) -> str:
    """API path of one BTJ."""
    return resource_path(BTJ_API_VERSION, PLURAL, namespace, name, subresource)


def wants_child_back(btj: Mapping[str, Any]) -> bool:
    """A BTJ whose child was deleted while the job had not finished, and that is not being deleted itself."""
    status = btj.get("status") or {}
    return (
        deleted_child_uid(status) is not None
        and not is_finished(status)
        and not (btj.get("metadata") or {}).get("deletionTimestamp")
    )


def write_status(
    api: KubeApi, namespace: str, name: str, update: StatusUpdate, logger: Any = None
) -> dict[str, Any] | None:
    """Apply `update` to the latest BTJ under the retry policy: a conflict (409) re-reads and recomputes.

    Several writers share the status (the spec reconciler, the child and pod watchers); the resourceVersion
    precondition makes each write land on what its computation saw. Returns the BTJ written, or None
    when the BTJ is gone or nothing changed; raises the last ApiError when the policy gives up.
    """
    log = logger if logger is not None else _LOG

    def once() -> dict[str, Any] | None:
        current = api.get(btj_path(namespace, name))
        if current is None:
            return None
        changes = update(current)
        if not changes:
            return None
        old_status = current.get("status") or {}
        if all(old_status.get(key) == value for key, value in changes.items()):
            return None
        body = {"metadata": {"resourceVersion": current["metadata"]["resourceVersion"]}, "status": changes}
        return api.patch(btj_path(namespace, name, "status"), body)

    return retrying.call(f"status of BlackwellTrainingJob {namespace}/{name}", log, once)


def write_status_logged(
    ctx: OperatorContext, namespace: str, name: str, update: StatusUpdate, logger: Any, *, purpose: str
) -> tuple[bool, dict[str, Any] | None]:
    """write_status for the watchers, which get no retries from Kopf: a write the policy gives up on is
    counted and logged in one line (the object's next event, or the resync loop, tries again).
    Returns (whether it went through or had nothing to do, the BTJ written)."""
    try:
        return True, write_status(ctx.api, namespace, name, update, logger)
    except ApiError as exc:
        ctx.metrics.record_error(exc.metric_reason)
        logger.error(f"Cannot {purpose} on BlackwellTrainingJob {namespace}/{name}: {exc}")
        return False, None
