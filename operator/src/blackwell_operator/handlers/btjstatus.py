"""Writing BTJ status: read-modify-write on the status subresource, guarded by resourceVersion."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from blackwell_operator.handlers import retrying
from blackwell_operator.handlers.api import ApiError, KubeApi, resource_path
from blackwell_operator.handlers.context import OperatorContext
from blackwell_operator.handlers.logs import Logger
from blackwell_operator.lifecycle.child_record import CHILD_DELETED as CHILD_DELETED
from blackwell_operator.lifecycle.status_patch import changes_nothing, status_patch
from blackwell_operator.lifecycle.status_read import ReadBtj, read_btj
from blackwell_operator.lifecycle.writers import StatusWriter
from blackwell_operator.models.spec import API_GROUP, API_VERSION, PLURAL
from blackwell_operator.models.status import StatusChange

BTJ_API_VERSION = f"{API_GROUP}/{API_VERSION}"
_LOG = logging.getLogger(__name__)

# Given the BTJ as it is now, what its status becomes (lifecycle/status_patch.py says how a StatusChange is
# written), or None when nothing needs writing.
StatusUpdate = Callable[[Mapping[str, Any]], StatusChange | None]
# (BTJ uid, problem) pairs already logged: an unreadable stored status is said once, not on every write.
_REPORTED: set[tuple[str, str]] = set()
_REPORTED_LIMIT = 10_000


def btj_path(namespace: str, name: str, subresource: str | None = None) -> str:
    """API path of one BTJ."""
    return resource_path(BTJ_API_VERSION, PLURAL, namespace, name, subresource)


def report_unreadable(read: ReadBtj, logger: Logger) -> None:
    """Log, once per BTJ and problem, each part of its stored status the models cannot read (the writers
    work from the rest; lifecycle/status_read.py)."""
    uid = str((read.body.get("metadata") or {}).get("uid") or "")
    for problem in read.stored.problems:
        if (uid, problem) in _REPORTED:
            continue
        if len(_REPORTED) >= _REPORTED_LIMIT:
            _REPORTED.clear()
        _REPORTED.add((uid, problem))
        logger.warning(f"Unreadable status, left as it is: {problem}")


def write_status(
    api: KubeApi,
    namespace: str,
    name: str,
    update: StatusUpdate,
    writer: StatusWriter,
    logger: Logger | None = None,
    *,
    read: ReadBtj | None = None,
) -> dict[str, Any] | None:
    """Apply `update` to the latest BTJ under the retry policy: a conflict (409) re-reads and recomputes.

    Several writers share the status (the spec reconciler, the child, pod and measure watchers), each
    owning its keys (lifecycle/writers.py); the resourceVersion precondition makes each write land on what
    its computation saw. Returns the BTJ written, or None when the BTJ is gone or nothing changed; raises
    the last ApiError when the policy gives up.

    read: the BTJ as the caller last read it, its status parsed (a reconcile pass, at its start). The first
    attempt computes from it instead of reading the BTJ again (and parses nothing again); if anything wrote
    since, its resourceVersion is stale, the write is refused with a conflict and the next attempt reads.
    Nothing else differs. `update` is handed `read.body` itself on that attempt.
    """
    log = logger if logger is not None else _LOG
    unused = [read] if read is not None else []

    def once() -> dict[str, Any] | None:
        if unused:
            known: ReadBtj | None = unused.pop()
        else:
            fetched = api.get(btj_path(namespace, name))
            known = read_btj(fetched) if fetched is not None else None
        if known is None:
            return None
        current = known.body
        report_unreadable(known, log)
        change = update(current)
        if change is None:
            return None
        stored = current.get("status") or {}
        patch = status_patch(change, stored, writer, read=known.stored)
        if changes_nothing(patch, stored):
            return None
        body = {"metadata": {"resourceVersion": current["metadata"]["resourceVersion"]}, "status": patch}
        return api.patch(btj_path(namespace, name, "status"), body)

    return retrying.call(f"status of BlackwellTrainingJob {namespace}/{name}", log, once)


def write_status_logged(
    ctx: OperatorContext,
    namespace: str,
    name: str,
    update: StatusUpdate,
    writer: StatusWriter,
    logger: Logger,
    *,
    purpose: str,
) -> tuple[bool, dict[str, Any] | None]:
    """write_status for the watchers, which get no retries from Kopf: a write the policy gives up on is
    counted and logged in one line (the object's next event, or the resync loop, tries again).
    Returns (whether it went through or had nothing to do, the BTJ written)."""
    try:
        return True, write_status(ctx.api, namespace, name, update, writer, logger)
    except ApiError as exc:
        ctx.metrics.record_error(exc.metric_reason)
        # A warning: the caller keeps the event and it is offered again (handlers/redeliver.py; the
        # elastic loop looks again on its own), so nothing is lost that a person must redo.
        logger.warning(f"Cannot {purpose} on BlackwellTrainingJob {namespace}/{name} yet: {exc}")
        return False, None
