"""The CRD's structural schema applied as the API server applies it: null pruning, defaults, types, bounds."""

from __future__ import annotations

import copy
import difflib
import json
from collections.abc import Iterator
from typing import Any

import jsonschema
from jsonschema.exceptions import ValidationError

from blackwell_operator.models.pod import DNS1123_SUBDOMAIN, LABEL_VALUE, QUALIFIED_KEY
from blackwell_operator.yamlscalars import INT64_MAX, INT64_MIN

Schema = dict[str, Any]

_KIND_WORDS = {
    "integer": "a whole number",
    "number": "a number",
    "string": "a string",
    "boolean": "a boolean",
    "object": "a mapping",
    "array": "a list",
}


# The patterns the CRD shares with Kubernetes names, in words.
_PATTERN_WORDS = {
    LABEL_VALUE: "a label value (empty, or at most 63 letters, digits, '-', '_' or '.', starting and ending "
    "with a letter or digit)",
    DNS1123_SUBDOMAIN: "a DNS-1123 subdomain (lowercase letters, digits, '-' and '.', starting and ending "
    "with a letter or digit)",
    QUALIFIED_KEY: "a qualified name ([prefix/]name: a DNS subdomain prefix, a name of at most 63 letters, "
    "digits, '-', '_' or '.')",
}


def _to_json_schema(node: Any) -> Any:
    """OpenAPI v3 (Kubernetes flavour) to Draft 4 JSON Schema; unknown fields are errors (kubectl's
    default server-side field validation is Strict)."""
    if isinstance(node, list):
        return [_to_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    out: Schema = {}
    for key, value in node.items():
        if key.startswith("x-kubernetes-") or key in ("description", "default"):
            continue
        if key == "properties":
            out[key] = {name: _to_json_schema(child) for name, child in value.items()}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = _to_json_schema(value)
        else:
            out[key] = copy.deepcopy(value)
    if node.get("x-kubernetes-int-or-string"):
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    if "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields"):
        out.setdefault("additionalProperties", False)
    return out


def build_validator(open_api: Schema) -> jsonschema.Draft4Validator:
    """A Draft 4 validator for an openAPIV3Schema."""
    return jsonschema.Draft4Validator(_to_json_schema(open_api))


def prune_nulls(obj: Any) -> Any:
    """The API server drops the nulls of non-nullable fields before it defaults (none of ours is nullable)."""
    if isinstance(obj, dict):
        return {key: prune_nulls(value) for key, value in obj.items() if value is not None}
    if isinstance(obj, list):
        return [prune_nulls(item) for item in obj]
    return obj


def apply_defaults(schema: Schema, obj: Any) -> Any:
    """Structural defaulting, top-down: a defaulted `{}` gets its own fields' defaults in turn."""
    if isinstance(obj, dict) and "properties" in schema:
        for name, child in schema["properties"].items():
            if name not in obj and "default" in child:
                obj[name] = copy.deepcopy(child["default"])
            if name in obj:
                obj[name] = apply_defaults(child, obj[name])
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        return [apply_defaults(schema["items"], item) for item in obj]
    return obj


def dotted(parts: Any) -> str:
    """A wire path as users write it: spec.env[1].value."""
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def shown(value: Any) -> str:
    """The value as YAML would show it (true, not True), shortened."""
    scalar = isinstance(value, bool | int | float | str) or value is None
    text = json.dumps(value) if scalar else repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def did_you_mean(word: Any, names: Any) -> str:
    """` (did you mean `precision`?)` for a misspelt name, else the names there are, shortly."""
    known = sorted(map(str, names))
    close = difflib.get_close_matches(str(word), known, n=1, cutoff=0.6)
    if close:
        return f"; did you mean `{close[0]}`?"
    shown = ", ".join(known[:12]) + (", ..." if len(known) > 12 else "")
    return f"; remove it (known here: {shown})" if known else "; remove it"


# What to write instead when YAML (as kubectl reads it) made a value of another type than the field's.
def _type_fix(expected: list[str], value: Any) -> str:
    if "string" in expected and (isinstance(value, bool) or value is None):
        return (
            "; YAML reads y, n, yes, no, on, off, true, false as booleans and ~, null as null: quote the "
            'value, e.g. "y"'
        )
    if "string" in expected and isinstance(value, int | float):
        return f'; quote it: "{value}"'
    if "boolean" in expected and isinstance(value, str):
        return "; write true or false, without quotes"
    if ("integer" in expected or "number" in expected) and isinstance(value, str):
        if value.lstrip("+-").isdigit() and len(value) > 300:  # kubectl sends these digits as text
            return f"; a number of {len(value)} digits is beyond any the API server holds"
        return "; write the number without quotes"
    return ""


def describe(error: ValidationError) -> str:
    """One line for a schema error: the field and what it must be (the value shown, shortened)."""
    where = dotted(error.absolute_path) or "manifest"
    kind, expected, value = error.validator, error.validator_value, error.instance
    if kind == "type":
        kinds = [expected] if isinstance(expected, str) else expected
        words = " or ".join(_KIND_WORDS.get(kind, kind) for kind in kinds)
        given = _KIND_WORDS.get(_kind_of(value), _kind_of(value))
        return f"{where}: must be {words} (got {shown(value)}, {given}){_type_fix(kinds, value)}"
    if kind == "additionalProperties":
        known = error.schema.get("properties", {})
        extra = sorted(set(value) - set(known), key=str)
        # One line per field, at the field's own path (kubectl's strict field validation names each).
        return "\n".join(
            f"{dotted((*error.absolute_path, name))}: unknown field{did_you_mean(name, known)}"
            for name in extra
        )
    if kind == "required":
        name = error.message.split(" is a required")[0].strip("'")
        return f"{dotted((*error.absolute_path, name))}: required: add it"
    if kind == "enum":
        choices = ", ".join(map(str, expected))
        hint = did_you_mean(value, expected) if isinstance(value, str) else ""
        hint = hint if hint.startswith("; did") else ""
        return f"{where}: must be one of {choices} (got {shown(value)}){hint}"
    if kind == "pattern":
        phrase = _PATTERN_WORDS.get(str(expected))
        if phrase:
            return f"{where}: {shown(value)} is not {phrase}"
        return f"{where}: {shown(value)} does not match the pattern {expected}"
    if kind == "maxLength":
        return f"{where}: at most {expected} characters (got {len(value)})"
    if kind == "minLength":
        return f"{where}: at least {expected} characters (got {len(value)})"
    if kind == "maxItems":
        return f"{where}: at most {expected} entries (got {len(value)})"
    if kind in ("minimum", "maximum"):
        exclusive = bool(error.schema.get(f"exclusive{kind.capitalize()}"))
        sign = (">" if exclusive else ">=") if kind == "minimum" else ("<" if exclusive else "<=")
        return f"{where}: must be {sign} {expected} (got {shown(value)})"
    if kind == "anyOf":
        return f"{where}: must be a string or a whole number (got {shown(value)})"
    return f"{where}: {error.message}"


def _kind_of(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    return type(value).__name__


def schema_errors(check: jsonschema.Draft4Validator, obj: Any) -> list[str]:
    """Every schema error, one line each, in document order."""
    found = sorted(check.iter_errors(obj), key=lambda e: [str(p) for p in e.absolute_path])
    lines: dict[str, str] = {}  # one line per field: the first of its errors (`""` breaks minLength first)
    for error in found:
        for line in describe(error).splitlines():
            lines.setdefault(line.split(": ", 1)[0], line)
    return list(lines.values())


def int64_errors(obj: Any, path: tuple[Any, ...] = ()) -> Iterator[str]:
    """Integers the API server cannot hold (it decodes JSON integers to int64)."""
    if isinstance(obj, bool):
        return
    if isinstance(obj, int) and not INT64_MIN <= obj <= INT64_MAX:
        yield f"{dotted(path) or 'manifest'}: {str(obj)[:20]}... is outside the int64 range"
    elif isinstance(obj, dict):
        for key, value in obj.items():
            yield from int64_errors(value, (*path, key))
    elif isinstance(obj, list):
        for index, value in enumerate(obj):
            yield from int64_errors(value, (*path, index))


def list_map_errors(schema: Schema, obj: Any, path: tuple[Any, ...] = ()) -> Iterator[str]:
    """x-kubernetes-list-type: map keys must be unique (the API server rejects a duplicate entry)."""
    if isinstance(obj, list):
        keys = schema.get("x-kubernetes-list-map-keys")
        if schema.get("x-kubernetes-list-type") == "map" and keys:
            seen: set[str] = set()
            for index, item in enumerate(obj):
                if not isinstance(item, dict):
                    continue
                values = [item.get(k) for k in keys]
                # Compared as canonical JSON: a key of the wrong type (a list, an object) is the schema
                # check's error to report, and must not make this one raise.
                key = json.dumps(values, sort_keys=True, default=str)
                if key in seen:
                    shown = ", ".join(f"{k}={v!r}" for k, v in zip(keys, values, strict=True))
                    yield f"{dotted((*path, index))}: duplicate entry ({shown}); each must be unique"
                seen.add(key)
        for index, item in enumerate(obj):
            yield from list_map_errors(schema.get("items", {}), item, (*path, index))
    elif isinstance(obj, dict):
        for name, child in schema.get("properties", {}).items():
            if name in obj:
                yield from list_map_errors(child, obj[name], (*path, name))
