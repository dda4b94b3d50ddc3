"""Whether a BTJ has converged, and if not why: what the resync loop (handlers/resync.py) reconciles for."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from blackwell_operator.lifecycle.child_apply import CREATE_REFUSED, PATCH_REFUSED
from blackwell_operator.lifecycle.child_record import deleted_child_uid, is_finished
from blackwell_operator.lifecycle.conditions import find_condition
from blackwell_operator.lifecycle.outcome import NO_JOB_API
from blackwell_operator.lifecycle.references import (
    CHECKPOINT_PATH_IN_USE,
    SERVICE_ACCOUNT_MISSING,
    SERVICE_ACCOUNT_NOT_ALLOWED,
)
from blackwell_operator.lifecycle.replan import replaced_child_uid
from blackwell_operator.lifecycle.status_read import read_keys
from blackwell_operator.models.status import BlackwellTrainingJobStatus, ConditionType, Phase

# The ChildCreated / SpecApplied reasons that mean "not there yet, try again" (no watch on ServiceAccounts:
# the loop looks for a missing one, or an admin's label on one, with its backoff).
RETRY_REASONS = frozenset(
    {
        CREATE_REFUSED,
        PATCH_REFUSED,
        NO_JOB_API,
        SERVICE_ACCOUNT_MISSING,
        SERVICE_ACCOUNT_NOT_ALLOWED,
        CHECKPOINT_PATH_IN_USE,
    }
)


# The status keys these checks read (lifecycle/status_read.read_keys: not the plan, most of a status).
_KEYS = ("observedGeneration", "conditions", "child", "phase", "planHistory")


def wants_child_back(btj: Mapping[str, Any]) -> bool:
    """A BTJ whose child was deleted while the job had not finished, and that is not being deleted itself."""
    return _wants_child_back(btj, read_keys(btj.get("status"), *_KEYS).status)


def _wants_child_back(btj: Mapping[str, Any], stored: BlackwellTrainingJobStatus) -> bool:
    return (
        deleted_child_uid(stored) is not None
        and not is_finished(stored)
        and not (btj.get("metadata") or {}).get("deletionTimestamp")
    )


def needs_reconcile(btj: Mapping[str, Any], stored: BlackwellTrainingJobStatus | None = None) -> str | None:
    """Why this BTJ has not converged (None when it has): what the loop would reconcile it for. `stored`:
    its status as the caller parsed it (a reconcile pass); else only the keys read here are parsed."""
    meta = btj.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return None
    if stored is None:
        stored = read_keys(btj.get("status"), *_KEYS).status
    if stored.observed_generation != int(meta.get("generation") or 1):
        return "its spec has not been reconciled"
    if _wants_child_back(btj, stored):
        return "its child was deleted before the job finished"
    stale = replaced_child_uid(stored)
    if stale is not None:
        # A re-plan's intent not driven to its end (a lost DELETE, an operator stopped after the write):
        # no event may come back for it, so the loop finishes it.
        return f"a re-plan replaces its child {stale}, which has not been replaced yet"
    for type_ in (ConditionType.CHILD_CREATED, ConditionType.SPEC_APPLIED):
        cond = find_condition(stored.conditions, type_)
        if cond is not None and cond.status == "False" and cond.reason in RETRY_REASONS:
            return f"the API server refused its child ({cond.reason})"
    if (
        find_condition(stored.conditions, ConditionType.CHILD_CREATED) is None
        and stored.phase != Phase.INVALID
    ):
        return "no child recorded"
    return None
