"""Kubernetes Events on BTJs, posted through Kopf's event queue (works from sync handlers too)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import kopf


def post_event(obj: Mapping[str, Any], reason: str, message: str, *, warning: bool = False) -> None:
    """An Event about `obj` (any dict with apiVersion, kind and metadata)."""
    # Kopf types the target as its Body class, but reads only those keys: a plain dict is fine.
    kopf.event(cast(Any, dict(obj)), type="Warning" if warning else "Normal", reason=reason, message=message)


def adopt_children(children: list[dict[str, Any]], owner: Mapping[str, Any]) -> None:
    """Owner references (controller, blockOwnerDeletion) to `owner` on each child.

    Not kopf.adopt: it also copies the owner's labels, Argo CD's tracking label among them, which
    render_children deliberately stripped (hyperpod-pytorchjob.md §3.2).
    """
    kopf.append_owner_reference(children, owner=cast(Any, dict(owner)))
