"""The finalizer each child carries until the operator has recorded how it ended, and its release."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from blackwell_operator.handlers import retrying
from blackwell_operator.handlers.api import ApiError, KubeApi, resource_path
from blackwell_operator.handlers.logs import Logger

# The finalizer's name and the pure checks live with the rest of what a child records (lifecycle).
from blackwell_operator.lifecycle.child_record import FINAL_STATUS_FINALIZER as FINAL_STATUS_FINALIZER
from blackwell_operator.lifecycle.child_record import holds as holds
from blackwell_operator.lifecycle.child_record import with_finalizer as with_finalizer


def release(api: KubeApi, child: Mapping[str, Any], plural: str, logger: Logger) -> None:
    """Remove the finalizer from the child (the same object: uid checked), leaving any other finalizer.

    A merge patch of the list guarded by resourceVersion: a concurrent change (another controller's
    finalizer) makes it re-read, under the retry policy. A child gone by the time of the patch (another
    release landed between the read and the patch, or this one's answer was lost) is released: done.
    """
    meta = child["metadata"]
    path = resource_path(str(child.get("apiVersion")), plural, meta.get("namespace"), meta["name"])

    def once() -> None:
        current = api.get(path)
        if current is None or current["metadata"].get("uid") != meta.get("uid") or not holds(current):
            return
        rest = [f for f in current["metadata"].get("finalizers") or [] if f != FINAL_STATUS_FINALIZER]
        try:
            api.patch(
                path,
                {"metadata": {"finalizers": rest, "resourceVersion": current["metadata"]["resourceVersion"]}},
            )
        except ApiError as exc:
            if exc.status != 404:
                raise

    retrying.call(f"release of {child.get('kind')} {meta['name']}", logger, once)
