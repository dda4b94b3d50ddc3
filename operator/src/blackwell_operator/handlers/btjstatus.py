"""Writing BTJ status: read-modify-write on the status subresource, guarded by resourceVersion."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from blackwell_operator.handlers.api import ApiError, KubeApi, resource_path
from blackwell_operator.models.spec import API_GROUP, API_VERSION, PLURAL

BTJ_API_VERSION = f"{API_GROUP}/{API_VERSION}"
_MAX_ATTEMPTS = 8

# Given the BTJ as it is now, the new status (full replacement of the keys it names; None deletes a key),
# or None when nothing needs writing.
StatusUpdate = Callable[[Mapping[str, Any]], dict[str, Any] | None]


def btj_path(namespace: str, name: str, subresource: str | None = None) -> str:
    """API path of one BTJ."""
    return resource_path(BTJ_API_VERSION, PLURAL, namespace, name, subresource)


def write_status(api: KubeApi, namespace: str, name: str, update: StatusUpdate) -> dict[str, Any] | None:
    """Apply `update` to the latest BTJ; on a concurrent write (409) re-read and recompute.

    Two writers share the status (the spec reconciler and the child watcher); the resourceVersion
    precondition makes each write land on what its computation saw. Returns the BTJ written, or None
    when the BTJ is gone or nothing changed.
    """
    for _ in range(_MAX_ATTEMPTS):
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
        try:
            return api.patch(btj_path(namespace, name, "status"), body)
        except ApiError as exc:
            if exc.status != 409:
                raise
    raise ApiError(409, "Conflict", f"status of {namespace}/{name} kept changing; will retry")
