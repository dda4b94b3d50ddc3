"""The one serializer of status changes: a writer's StatusChange -> the merge patch of BTJ status.

Rules, for every writer alike:
- a field the change leaves unset is not in the patch; an explicit None deletes the key;
- `plan` is the minimal merge patch from the stored plan (lifecycle/patch.py), left out when equal;
- any other object replaces the stored one whole (a key the new one lacks is deleted, at any depth), so
  that a newer reading or failure never shows beside a field of an older one;
- `conditions` is the writer's whole list; a stored condition the models cannot read, of a type the
  writer does not set, is kept as it was (status_read.py);
- the writer must own every key it changes and every condition type whose content it changes
  (lifecycle/writers.py), and writes `message` and `headline` together (lifecycle/message.set_message):
  anything else is a bug, and raises OwnershipError.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from blackwell_operator.lifecycle.patch import (
    apply_merge_patch,
    merge_patch_to,
    plan_document,
    replacing_patch,
)
from blackwell_operator.lifecycle.status_read import StoredStatus, read_keys
from blackwell_operator.lifecycle.writers import StatusWriter
from blackwell_operator.models.status import Condition, StatusChange

_ALIASES = {name: info.alias or name for name, info in StatusChange.model_fields.items()}


class OwnershipError(Exception):
    """A writer changed a status key or condition it does not own (a programming error)."""


def _no_nulls_in_lists(value: Any, in_list: bool = False) -> Any:
    """`value` with None members dropped from objects inside lists: there a null deletes nothing (a merge
    patch replaces a list whole) and would be stored as it is."""
    if isinstance(value, list):
        return [_no_nulls_in_lists(item, True) for item in value]
    if isinstance(value, dict):
        return {k: _no_nulls_in_lists(v, in_list) for k, v in value.items() if not (in_list and v is None)}
    return value


def _dump(condition: Condition) -> dict[str, Any]:
    return condition.model_dump(by_alias=True, exclude_unset=True, mode="json")


def changed_condition_types(stored: StoredStatus, new: list[Condition] | None) -> set[str]:
    """Condition types whose content differs between the stored (readable) list and `new` (None: all)."""
    old = {c.type: _dump(c) for c in stored.status.conditions}
    if new is None:
        return set(old)
    wanted = {c.type: _dump(c) for c in new}
    return {kind for kind in old.keys() | wanted.keys() if old.get(kind) != wanted.get(kind)}


def check_ownership(change: StatusChange, stored: StoredStatus, writer: StatusWriter) -> None:
    """Raise OwnershipError when `change` touches what `writer` does not own."""
    keys = {_ALIASES[name] for name in change.model_fields_set if name != "conditions"}
    foreign = sorted(key for key in keys if not writer.owns(key))
    if "conditions" in change.model_fields_set:
        touched = changed_condition_types(stored, change.conditions)
        foreign += sorted(f"condition {kind}" for kind in touched - writer.conditions)
    if ("message" in keys) != ("headline" in keys):
        raise OwnershipError(
            f"the {writer.name} changed one of message and headline without the other. Fix: set both with "
            "lifecycle/message.set_message"
        )
    if foreign:
        raise OwnershipError(
            f"the {writer.name} changed {', '.join(foreign)}, which it does not own. Fix: leave it to its "
            "owner, or declare it in lifecycle/writers.py and docs/operator.md"
        )


def status_patch(
    change: StatusChange,
    stored: Mapping[str, Any] | None,
    writer: StatusWriter,
    *,
    read: StoredStatus | None = None,
) -> dict[str, Any]:
    """The merge patch of status that applies `change` by `writer` to the `stored` status.

    read: `stored` as the caller parsed it already (read_status: a reconcile pass parses its BTJ once);
    else only its conditions are read here, all this reads of it besides the raw keys."""
    stored = stored if isinstance(stored, Mapping) else {}
    if read is None:
        read = read_keys(stored, "conditions")  # not the plan, which the other writers never read
    check_ownership(change, read, writer)
    fields = change.model_fields_set
    patch: dict[str, Any] = {}
    dumped = change.model_dump(by_alias=True, exclude_unset=True, mode="json", exclude={"plan", "conditions"})
    for key, value in dumped.items():
        patch[key] = replacing_patch(stored.get(key), _no_nulls_in_lists(value))
    if "plan" in fields:
        if change.plan is None:
            patch["plan"] = None
        else:
            diff = merge_patch_to(stored.get("plan"), plan_document(change.plan.to_json()))
            if diff != {}:
                patch["plan"] = diff
    if "conditions" in fields:
        if change.conditions is None:
            patch["conditions"] = None
        else:
            written = [_dump(c) for c in change.conditions]
            types = {c["type"] for c in written}
            kept = [dict(c) for c in read.unreadable_conditions if c.get("type") not in types]
            patch["conditions"] = written + kept
    return patch


def changes_nothing(patch: Mapping[str, Any], stored: Mapping[str, Any] | None) -> bool:
    """Whether applying `patch` leaves the `stored` status as it is (nothing to write)."""
    before = dict(stored) if isinstance(stored, Mapping) else {}
    return not patch or apply_merge_patch(before, patch) == before
