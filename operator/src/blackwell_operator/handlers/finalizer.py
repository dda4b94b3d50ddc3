"""The finalizer each child carries until the operator has recorded how it ended, and its release."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from blackwell_operator.handlers import retrying
from blackwell_operator.handlers.api import KubeApi, resource_path

# A child deleted while no operator runs (by hand, or by the training operator's ttlSecondsAfterFinished)
# would take its final status with it: a restarted operator would see a running BTJ without its child
# and run the job again. With this finalizer the deleted child stays, Terminating, until the child
# watcher has written what it saw onto the BTJ; then the watcher releases it.
FINAL_STATUS_FINALIZER = "training.blackwell.dev/final-status"


def holds(child: Mapping[str, Any]) -> bool:
    """Whether the child carries the finalizer."""
    return FINAL_STATUS_FINALIZER in ((child.get("metadata") or {}).get("finalizers") or [])


def with_finalizer(job: dict[str, Any]) -> dict[str, Any]:
    """`job` (a rendered child) with the finalizer added, in place."""
    meta = job.setdefault("metadata", {})
    if FINAL_STATUS_FINALIZER not in (meta.get("finalizers") or []):
        meta["finalizers"] = [*(meta.get("finalizers") or []), FINAL_STATUS_FINALIZER]
    return job


def release(api: KubeApi, child: Mapping[str, Any], plural: str, logger: Any) -> None:
    """Remove the finalizer from the child (the same object: uid checked), leaving any other finalizer.

    A merge patch of the list guarded by resourceVersion: a concurrent change (another controller's
    finalizer) makes it re-read, under the retry policy.
    """
    meta = child["metadata"]
    path = resource_path(str(child.get("apiVersion")), plural, meta.get("namespace"), meta["name"])

    def once() -> None:
        current = api.get(path)
        if current is None or current["metadata"].get("uid") != meta.get("uid") or not holds(current):
            return
        rest = [f for f in current["metadata"].get("finalizers") or [] if f != FINAL_STATUS_FINALIZER]
        api.patch(
            path,
            {"metadata": {"finalizers": rest, "resourceVersion": current["metadata"]["resourceVersion"]}},
        )

    retrying.call(f"release of {child.get('kind')} {meta['name']}", logger, once)
