"""A pydantic ValidationError of the models as one line per field: the wire path, what is wrong, the fix."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, get_args

from pydantic import ValidationError
from pydantic_core import ErrorDetails
from pydantic_core.core_schema import ErrorType

# loc parts that name a union branch or a validator, not a field.
_BRANCH_PREFIXES = ("literal[", "str-enum[", "enum[", "constrained-", "function-", "lax-", "json-or-python[")
_BRANCH_NAMES = {"int", "float", "str", "bool"}
_NUMBER_ERRORS = {"int_parsing", "int_type", "int_from_float", "float_parsing", "float_type"}
_BOUND_ERRORS = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}
# pydantic's own error types; any other is a rule of the models (PydanticCustomError), in their words.
_PYDANTIC_TYPES = frozenset(get_args(ErrorType))


@dataclass(frozen=True)
class FieldMessage:
    """One refusal: the field's wire path (spec.env[0].name), what is wrong and the fix."""

    path: str
    text: str
    # The models' own words (a rule of theirs, or a union's alternatives merged): preferred over the
    # CRD's line for the same field, which can only say which pattern or branch failed.
    own: bool
    kind: str

    def __str__(self) -> str:
        return f"{self.path}: {self.text}"


def _field_path(loc: tuple[int | str, ...], prefix: str) -> str:
    text = prefix.rstrip(".")
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        elif part not in _BRANCH_NAMES and not part.startswith(_BRANCH_PREFIXES):
            text += f".{part}" if text else part
    return text or "manifest"


def _shown(value: Any) -> str:
    """The value as YAML would show it (true, not True), shortened."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def _merge_union(items: list[ErrorDetails]) -> str | None:
    """One message for a union field (auto | enum | number): the allowed values and what was given."""
    literals: list[str] = []
    others: list[str] = []
    for item in items:
        kind, ctx = item["type"], item.get("ctx") or {}
        if kind in ("literal_error", "enum"):
            literals.extend(v.strip() for v in str(ctx.get("expected", "")).replace(" or ", ", ").split(","))
        elif kind in _NUMBER_ERRORS:
            others.append("a whole number" if kind.startswith("int") else "a number")
        elif kind in _BOUND_ERRORS:
            others.append(f"a number {_BOUND_ERRORS[kind]} {next(iter(ctx.values()), '')}")
        else:
            return None
    values = list(dict.fromkeys(v for v in literals if v))
    text = " or ".join(
        [*([f"one of {', '.join(values)}"] if len(values) > 1 else values), *dict.fromkeys(others)]
    )
    return f"must be {text} (got {items[0].get('input')!r})"


def _message(item: ErrorDetails) -> str:
    """pydantic's words for its own error types, as a person who wrote YAML reads them."""
    kind, ctx, given = item["type"], item.get("ctx") or {}, _shown(item.get("input"))
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        return f"must be a mapping (got {given})"
    if kind == "missing":
        return "required: add it"
    if kind == "extra_forbidden":
        return "unknown field: remove it, or check its spelling against `kubectl explain btj.spec`"
    if kind in _BOUND_ERRORS:
        return f"must be {_BOUND_ERRORS[kind]} {next(iter(ctx.values()), '')} (got {given})"
    if kind in _NUMBER_ERRORS:
        whole = kind.startswith("int")
        return f"must be {'a whole number' if whole else 'a number'} (got {given}); write it without quotes"
    if kind in ("string_type", "string_sub_type"):
        return f'must be a string (got {given}); quote it, e.g. "{item.get("input")}"'
    if kind in ("bool_parsing", "bool_type"):
        return f"must be true or false (got {given})"
    if kind in ("literal_error", "enum"):
        return f"must be one of {ctx.get('expected', '')} (got {given})"
    if kind == "string_too_short":
        return f"at least {ctx.get('min_length')} characters (got {len(str(item.get('input')))})"
    if kind == "string_too_long":
        return f"at most {ctx.get('max_length')} characters (got {len(str(item.get('input')))}); shorten it"
    if kind == "too_long":
        return f"at most {ctx.get('max_length')} entries (got {ctx.get('actual_length')})"
    if kind == "list_type":
        return f"must be a list (got {given})"
    if kind == "value_error":
        return item["msg"].removeprefix("Value error, ")
    return item["msg"]


def field_messages(error: ValidationError, prefix: str = "") -> list[FieldMessage]:
    """One message per field (union alternatives merged), in the order pydantic found them."""
    grouped: dict[str, list[ErrorDetails]] = {}
    for item in error.errors():
        grouped.setdefault(_field_path(item["loc"], prefix), []).append(item)
    found: list[FieldMessage] = []
    for path, items in grouped.items():
        merged = _merge_union(items) if len(items) > 1 else None
        if merged is not None:
            found.append(FieldMessage(path, merged, own=True, kind="union"))
            continue
        for item in items:
            own = item["type"] not in _PYDANTIC_TYPES or item["type"] in ("value_error", "assertion_error")
            found.append(FieldMessage(path, _message(item), own=own, kind=item["type"]))
    return list(dict.fromkeys(found))


def format_validation_error(error: ValidationError, prefix: str = "") -> str:
    """One line per field: the dotted wire path and what is wrong (union alternatives merged)."""
    return "\n".join(dict.fromkeys(str(message) for message in field_messages(error, prefix)))
