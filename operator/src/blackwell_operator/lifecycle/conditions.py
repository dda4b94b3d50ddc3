"""metav1.Condition bookkeeping: read, upsert and remove conditions in a status's list."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

ConditionStatus = Literal["True", "False", "Unknown"]


def condition_map(conditions: Iterable[Mapping[str, Any]] | None) -> dict[str, Mapping[str, Any]]:
    """type -> the latest condition of that type (the training operator re-appends changed ones)."""
    result: dict[str, Mapping[str, Any]] = {}
    for cond in conditions or ():
        if isinstance(cond, Mapping) and "type" in cond:
            result[str(cond["type"])] = cond
    return result


def first_true(conds: Mapping[str, Mapping[str, Any]], *types: str) -> Mapping[str, Any] | None:
    """The first of `types` whose condition in `conds` (a condition_map) is True, or None."""
    for kind in types:
        cond = conds.get(kind)
        if cond is not None and cond.get("status") == "True":
            return cond
    return None


def set_condition(
    conditions: Sequence[Mapping[str, Any]],
    type_: str,
    status: ConditionStatus,
    reason: str,
    message: str,
    *,
    generation: int | None,
    now: str,
) -> list[dict[str, Any]]:
    """A new list with one condition upserted; lastTransitionTime moves only when status flips."""
    result = [dict(c) for c in conditions]
    for cond in result:
        if cond.get("type") == type_:
            if cond.get("status") != status:
                cond["lastTransitionTime"] = now
            cond.update(status=status, reason=reason, message=message)
            if generation is not None:
                cond["observedGeneration"] = generation
            return result
    new: dict[str, Any] = {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": now,
    }
    if generation is not None:
        new["observedGeneration"] = generation
    result.append(new)
    return result


def remove_condition(conditions: Sequence[Mapping[str, Any]], type_: str) -> list[dict[str, Any]]:
    """A new list without conditions of that type."""
    return [dict(c) for c in conditions if c.get("type") != type_]


def get_condition(conditions: Iterable[Mapping[str, Any]] | None, type_: str) -> Mapping[str, Any] | None:
    """The condition of that type, or None."""
    return condition_map(conditions).get(type_)
