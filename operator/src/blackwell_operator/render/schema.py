"""Pydantic JSON Schema to a Kubernetes structural schema: refs inlined, unions folded."""

from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel

Schema = dict[str, Any]

INT_OR_STRING = "x-kubernetes-int-or-string"
PRESERVE_UNKNOWN = "x-kubernetes-preserve-unknown-fields"
VALIDATIONS = "x-kubernetes-validations"
# Keys pydantic emits that a CRD schema must not carry (or that only add noise).
_DROPPED = {"title", "$defs", "discriminator"}


class SchemaConversionError(ValueError):
    """A model uses a construct the structural-schema converter does not know how to express."""


# Key order in the generated YAML: what a reader looks for first.
_KEY_ORDER = [
    "type",
    INT_OR_STRING,
    "description",
    "format",
    "enum",
    "default",
    "minimum",
    "exclusiveMinimum",
    "maximum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "pattern",
    "maxItems",
    "required",
    "properties",
    "additionalProperties",
    "items",
]


def ordered(node: Any) -> Any:
    """The schema with each node's keys in a fixed, readable order (x-kubernetes-* keys last, sorted)."""
    if isinstance(node, list):
        return [ordered(item) for item in node]
    if not isinstance(node, dict):
        return node
    rank = {key: index for index, key in enumerate(_KEY_ORDER)}
    keys = sorted(node, key=lambda key: (rank.get(key, len(rank)), key))
    nested = {"properties", "additionalProperties", "items"}
    result: dict[str, Any] = {}
    for key in keys:
        value = node[key]
        if key == "properties":
            result[key] = {name: ordered(child) for name, child in value.items()}
        elif key in nested:
            result[key] = ordered(value)
        else:
            result[key] = value
    return result


def model_schema(model: type[BaseModel]) -> Schema:
    """The model's JSON Schema with wire (camelCase) names, in validation mode (what users write)."""
    return model.model_json_schema(by_alias=True, mode="validation")


def to_structural(model: type[BaseModel], *, object_defaults: bool) -> Schema:
    """A structural OpenAPI v3 schema for `model`.

    object_defaults: give optional nested objects `default: {}` so the API server applies their
    fields' defaults even when the user omits the whole object (for spec, never status).
    """
    raw = model_schema(model)
    return _convert(raw, raw.get("$defs", {}), object_defaults=object_defaults, path="")


def _resolve(node: Schema, defs: Schema) -> Schema:
    """Inline a $ref: the referencing node's own keys (description, default) win over the target's."""
    if "$ref" not in node:
        return node
    name = node["$ref"].rsplit("/", 1)[-1]
    target = copy.deepcopy(defs[name])
    rest = {key: value for key, value in node.items() if key != "$ref"}
    return _resolve({**target, **rest}, defs)


def _fold_union(node: Schema, defs: Schema, path: str) -> Schema:
    """Rewrite anyOf: `X | None` to X (not required; the API server prunes nulls), string enums
    to one enum, `"auto" | int` to int-or-string with a CEL rule; anything else is an error."""
    rest = {key: value for key, value in node.items() if key != "anyOf"}
    branches = [_resolve(branch, defs) for branch in node["anyOf"]]
    branches = [branch for branch in branches if branch.get("type") != "null"]
    if len(branches) == 1:
        return {**branches[0], **rest}
    values: list[Any] = []
    integers = [branch for branch in branches if branch.get("type") == "integer"]
    strings = [branch for branch in branches if branch.get("type") == "string"]
    if len(strings) + len(integers) != len(branches):
        raise SchemaConversionError(f"{path}: unsupported union {branches}")
    for branch in strings:
        if "const" in branch:
            values.append(branch["const"])
        elif "enum" in branch:
            values.extend(branch["enum"])
        else:
            raise SchemaConversionError(f"{path}: a free string in a union cannot be made structural")
    if not integers:
        return {**rest, "type": "string", "enum": values}
    if len(integers) != 1:
        raise SchemaConversionError(f"{path}: more than one integer branch")
    bounds: Schema = {key: integers[0][key] for key in ("minimum", "maximum") if key in integers[0]}
    words = " or ".join(f"'{value}'" for value in values)
    low, high = bounds.get("minimum"), bounds.get("maximum")
    checks = [f"self >= {low}" if low is not None else "", f"self <= {high}" if high is not None else ""]
    integer_rule = " && ".join(check for check in checks if check) or "true"
    string_rule = " || ".join(f"self == '{value}'" for value in values)
    span = f"an integer from {low} to {high}" if low is not None and high is not None else "an integer"
    return {
        **rest,
        INT_OR_STRING: True,
        # pattern constrains only strings and minimum/maximum only numbers (OpenAPI value validation).
        "pattern": "^(" + "|".join(values) + ")$",
        **bounds,
        VALIDATIONS: [
            {
                "rule": f"type(self) == string ? ({string_rule}) : ({integer_rule})",
                "message": f"must be {words}, or {span}",
            }
        ],
    }


def _convert(node: Schema, defs: Schema, *, object_defaults: bool, path: str) -> Schema:
    node = _resolve(node, defs)
    if "anyOf" in node:
        node = _fold_union(node, defs, path)
    if "allOf" in node or "oneOf" in node:
        raise SchemaConversionError(f"{path}: allOf/oneOf cannot be expressed structurally")
    out: Schema = {}
    for key, value in node.items():
        if key in _DROPPED:
            continue
        if key == "default" and value is None:
            continue  # no null defaults: an absent field is the "unset" state
        if key == "additionalProperties" and value is False:
            continue  # structural schemas prune unknown fields instead
        if key == "const":
            out["enum"] = [value]
        elif key in ("exclusiveMinimum", "exclusiveMaximum") and not isinstance(value, bool):
            # JSON Schema 2020 numeric form to the OpenAPI v3.0 boolean form Kubernetes uses.
            out["minimum" if key == "exclusiveMinimum" else "maximum"] = value
            out[key] = True
        else:
            out[key] = value
    if "properties" in out:
        required = set(out.get("required", []))
        properties: Schema = {}
        for name, child in out["properties"].items():
            converted = _convert(child, defs, object_defaults=object_defaults, path=f"{path}.{name}")
            if (
                object_defaults
                and name not in required
                and converted.get("type") == "object"
                and "properties" in converted
                and not converted.get("required")
                and "default" not in converted
            ):
                converted["default"] = {}
            properties[name] = converted
        out["properties"] = properties
        out.setdefault("type", "object")
    if isinstance(out.get("additionalProperties"), dict):
        out["additionalProperties"] = _convert(
            out["additionalProperties"], defs, object_defaults=object_defaults, path=f"{path}.*"
        )
    if "items" in out:
        out["items"] = _convert(out["items"], defs, object_defaults=object_defaults, path=f"{path}[]")
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    return out
