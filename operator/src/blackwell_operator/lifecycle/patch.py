"""Status as JSON merge patches (RFC 7386): computing and applying them, and status.plan's document."""

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


def replacing_patch(old: Any, new: Any) -> Any:
    """The merge patch that replaces `old` with `new` whole: every key of `new`, changed or not, and None
    for each key (at any depth) `old` has and `new` lacks, so that nothing of `old` survives beside it."""
    if not isinstance(new, Mapping) or not isinstance(old, Mapping):
        return new
    patch: dict[str, Any] = {key: None for key in old if key not in new}
    for key, value in new.items():
        patch[key] = replacing_patch(old.get(key), value)
    return patch


def apply_merge_patch(target: Any, patch: Any) -> Any:
    """`target` with the JSON merge patch applied (RFC 7386 §2): what the API server stores."""
    if not isinstance(patch, Mapping):
        return patch
    result: dict[str, Any] = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = apply_merge_patch(result.get(key), value)
    return result
