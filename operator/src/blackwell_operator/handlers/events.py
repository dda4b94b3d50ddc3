"""Kubernetes Events on BTJs, posted through Kopf's event queue (works from sync handlers too)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from typing import Any, cast

import kopf

from blackwell_operator.applabels import MANAGER
from blackwell_operator.handlers.api import ApiError, KubeApi, resource_path
from blackwell_operator.timefmt import now_rfc3339

# Set where a watcher runs outside Kopf's handlers (the resync loop offering its failed events again):
# post_event writes through the API then, as Kopf's event queue is not set up there.
_DIRECT: ContextVar[KubeApi | None] = ContextVar("btj_direct_events", default=None)


@contextlib.contextmanager
def direct_events(api: KubeApi) -> Iterator[None]:
    """post_event writes its Events through `api` within this block (best effort: a failure is dropped,
    as Kopf's queue drops one)."""
    token = _DIRECT.set(api)
    try:
        yield
    finally:
        _DIRECT.reset(token)


def post_event(obj: Mapping[str, Any], reason: str, message: str, *, warning: bool = False) -> None:
    """An Event about `obj` (any dict with apiVersion, kind and metadata)."""
    api = _DIRECT.get()
    if api is not None:
        with contextlib.suppress(ApiError):
            create_event(api, obj, reason, message, warning=warning)
        return
    # Kopf types the target as its Body class, but reads only those keys: a plain dict is fine.
    kopf.event(cast(Any, dict(obj)), type="Warning" if warning else "Normal", reason=reason, message=message)


def create_event(api: KubeApi, obj: Mapping[str, Any], reason: str, message: str, *, warning: bool) -> None:
    """An Event about `obj` written through the API: for code outside Kopf's handlers (the stuck-pod
    sweep), where Kopf's event queue is not set up."""
    meta = obj["metadata"]
    now = now_rfc3339()
    event = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": obj.get("apiVersion"),
            "kind": obj.get("kind"),
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta.get("uid"),
        },
        "reason": reason,
        "message": message[:1024],
        "type": "Warning" if warning else "Normal",
        "source": {"component": MANAGER},
        "reportingComponent": MANAGER,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
    api.create(resource_path("v1", "events", meta["namespace"]), event)


def adopt_children(children: list[dict[str, Any]], owner: Mapping[str, Any]) -> None:
    """Owner references (controller, blockOwnerDeletion) to `owner` on each child.

    Not kopf.adopt: it also copies the owner's labels, Argo CD's tracking label among them, which
    render_children deliberately stripped (docs/reference/hyperpod-pytorchjob.md §3.2).
    """
    kopf.append_owner_reference(children, owner=cast(Any, dict(owner)))
