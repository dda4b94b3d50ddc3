"""A pydantic ValidationError of the models as one line per field, in the manifest's (camelCase) paths."""

from __future__ import annotations

from pydantic import ValidationError
from pydantic_core import ErrorDetails

# loc parts that name a union branch or a validator, not a field.
_BRANCH_PREFIXES = ("literal[", "str-enum[", "enum[", "constrained-", "function-", "lax-", "json-or-python[")
_BRANCH_NAMES = {"int", "float", "str", "bool"}
_NUMBER_ERRORS = {"int_parsing", "int_type", "int_from_float", "float_parsing", "float_type"}
_BOUND_ERRORS = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}


def _field_path(loc: tuple[int | str, ...]) -> str:
    parts = [str(p) for p in loc]
    return ".".join(p for p in parts if p not in _BRANCH_NAMES and not p.startswith(_BRANCH_PREFIXES))


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
    # pydantic names its model classes where a user wrote a mapping: say what the field must be instead.
    if item["type"] in ("model_type", "dict_type", "model_attributes_type"):
        return f"must be a mapping (got {item.get('input')!r})"
    return item["msg"]


def format_validation_error(error: ValidationError, prefix: str = "") -> str:
    """One line per field: the dotted wire path and what is wrong (union alternatives merged)."""
    grouped: dict[str, list[ErrorDetails]] = {}
    for item in error.errors():
        grouped.setdefault(_field_path(item["loc"]), []).append(item)
    lines = []
    for path, items in grouped.items():
        where = f"{prefix}{path}" if path else prefix.rstrip(".") or "manifest"
        merged = _merge_union(items) if len(items) > 1 else None
        if merged is not None:
            lines.append(f"{where}: {merged}")
        else:
            lines.extend(f"{where}: {_message(item)}" for item in items)
    return "\n".join(dict.fromkeys(lines))
