"""The CRD's x-kubernetes-validations (CEL) rules, evaluated with cel-python as the API server would."""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import cache
from typing import Any

from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError

from blackwell_operator.admission.openapi import Schema, dotted

_PROGRAMS: dict[str, Any] = {}


@cache
def _environment() -> Any:
    # Built on first use (half a second: it compiles the CEL grammar), not when the CLI starts.
    import celpy

    return celpy.Environment()


def _program(rule: str) -> Any:
    if rule not in _PROGRAMS:
        env = _environment()
        _PROGRAMS[rule] = env.program(env.compile(rule))
    return _PROGRAMS[rule]


# A rule message that starts with the field it is about ("spec.cluster.gpusPerNode must be ...").
_NAMED = re.compile(r"^((?:metadata|spec)(?:\.[A-Za-z0-9_\[\]*]+)+) (.*)$", re.DOTALL)


def _field_first(message: str, where: str) -> str:
    """`field: problem`, like every other admission line: the field the message names, else the rule's."""
    named = _NAMED.match(message)
    return f"{named.group(1)}: {named.group(2)}" if named else f"{where}: {message}"


def cel_errors(schema: Schema, obj: Any, path: tuple[Any, ...] = ()) -> Iterator[str]:
    """Each failing rule's message, on a schema-valid, defaulted object (a create: no oldSelf)."""
    for entry in schema.get("x-kubernetes-validations", []):
        rule = entry["rule"]
        if "oldSelf" in rule:  # transition rules run only on update
            continue
        try:
            ok = bool(_program(rule).evaluate({"self": json_to_cel(obj)}))
        except CELEvalError:  # the API server rejects an object whose rule fails to evaluate
            ok = False
        if not ok:
            yield _field_first(str(entry.get("message") or f"failed rule: {rule}"), dotted(path) or "spec")
    if isinstance(obj, dict):
        for name, child in schema.get("properties", {}).items():
            if name in obj:
                yield from cel_errors(child, obj[name], (*path, name))
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(obj):
            yield from cel_errors(schema["items"], item, (*path, index))
