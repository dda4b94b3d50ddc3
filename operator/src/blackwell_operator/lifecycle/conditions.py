"""metav1.Condition bookkeeping: read raw condition lists, upsert and remove typed Conditions."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from blackwell_operator.models.status import Condition

ConditionStatus = Literal["True", "False", "Unknown"]


@dataclass(frozen=True)
class ConditionChange:
    """One condition a writer sets (set_conditions adds the time and the generation)."""

    type: str
    status: ConditionStatus
    reason: str
    message: str

    def with_message(self, message: str) -> ConditionChange:
        """The same condition saying `message`."""
        return ConditionChange(self.type, self.status, self.reason, message)


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
    conditions: Sequence[Condition],
    type_: str,
    status: ConditionStatus,
    reason: str,
    message: str,
    *,
    generation: int | None,
    now: str,
) -> list[Condition]:
    """A new list with one condition upserted; lastTransitionTime moves only when status flips.

    Without a generation the condition keeps the one it had (a new one gets none).
    """
    result = list(conditions)
    fields: dict[str, Any] = {"type": str(type_), "status": status, "reason": reason, "message": message}
    if generation is not None:
        fields["observedGeneration"] = generation
    for index, cond in enumerate(result):
        if cond.type == type_:
            stored = cond.model_dump(by_alias=True, exclude_unset=True)
            when = now if cond.status != status else cond.last_transition_time
            result[index] = Condition.model_validate({**stored, **fields, "lastTransitionTime": when})
            return result
    result.append(Condition.model_validate({**fields, "lastTransitionTime": now}))
    return result


def set_conditions(
    conditions: Sequence[Condition], changes: Iterable[ConditionChange], *, generation: int | None, now: str
) -> list[Condition]:
    """set_condition for each change, in order."""
    result = list(conditions)
    for c in changes:
        result = set_condition(result, c.type, c.status, c.reason, c.message, generation=generation, now=now)
    return result


def remove_condition(conditions: Sequence[Condition], type_: str) -> list[Condition]:
    """A new list without conditions of that type."""
    return [c for c in conditions if c.type != type_]


def find_condition(conditions: Iterable[Condition], type_: str) -> Condition | None:
    """The typed condition of that type, or None."""
    return next((c for c in conditions if c.type == type_), None)


def get_condition(conditions: Iterable[Mapping[str, Any]] | None, type_: str) -> Mapping[str, Any] | None:
    """The condition of that type in a raw (stored or foreign) list, or None."""
    return condition_map(conditions).get(type_)
