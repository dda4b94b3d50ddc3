"""Status as JSON merge patches: the patch between two documents, and status.plan's document."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def merge_patch_to(old: Any, new: Any) -> Any:
    """The JSON merge patch (RFC 7386) that turns `old` into `new`: removed keys become None."""
    if not isinstance(new, Mapping) or not isinstance(old, Mapping):
        return new
    patch: dict[str, Any] = {key: None for key in old if key not in new}
    for key, value in new.items():
        if key not in old or old[key] != value:
            patch[key] = merge_patch_to(old.get(key), value)
    return patch


def plan_document(plan_json: str) -> dict[str, Any]:
    """status.plan: the plan file's JSON without nulls (a merge patch cannot carry null values)."""

    def prune(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: prune(v) for k, v in value.items() if v is not None}
        if isinstance(value, list):
            return [prune(v) for v in value]
        return value

    return dict(prune(json.loads(plan_json)))
