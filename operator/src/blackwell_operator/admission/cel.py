"""The CRD's x-kubernetes-validations (CEL) rules, evaluated with cel-python as the API server would."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError

from blackwell_operator.admission.cel_guards import Guard, certainly_true, guard_of
from blackwell_operator.admission.openapi import Schema, dotted
from blackwell_operator.shared_cache import shared_cache


@shared_cache
def _environment() -> Any:
    # Built on first use (half a second: it compiles the CEL grammar), not when the CLI starts.
    import celpy

    return celpy.Environment()


@shared_cache
def _program(rule: str) -> Any:
    env = _environment()
    return env.program(env.compile(rule))


@shared_cache
def _guard(rule: str) -> Guard | None:
    return guard_of(rule)


def compile_rules(schema: Schema) -> int:
    """Compile every create-time rule of a schema now (the operator's start-up, off the first BTJs' path);
    how many there are."""
    count = 0
    for entry in schema.get("x-kubernetes-validations", []):
        if "oldSelf" not in entry["rule"]:
            _program(entry["rule"])
            _guard(entry["rule"])
            count += 1
    for child in schema.get("properties", {}).values():
        count += compile_rules(child)
    if isinstance(schema.get("items"), dict):
        count += compile_rules(schema["items"])
    return count


# A rule message that starts with the field it is about ("spec.cluster.gpusPerNode must be ...").
_NAMED = re.compile(r"^((?:metadata|spec)(?:\.[A-Za-z0-9_\[\]*]+)+) (.*)$", re.DOTALL)


def _field_first(message: str, where: str) -> str:
    """`field: problem`, like every other admission line: the field the message names, else the rule's."""
    named = _NAMED.match(message)
    return f"{named.group(1)}: {named.group(2)}" if named else f"{where}: {message}"


def cel_errors(schema: Schema, obj: Any, path: tuple[Any, ...] = (), *, guards: bool = True) -> Iterator[str]:
    """Each failing rule's message, on a schema-valid, defaulted object (a create: no oldSelf).

    guards: a rule that one of its presence guards makes true (admission/cel_guards.py) is not run through
    the interpreter; False runs every rule (the reference the guarded path is tested against).
    """
    activation: dict[str, Any] | None = None  # the object as CEL values, converted once for all its rules
    for entry in schema.get("x-kubernetes-validations", []):
        rule = entry["rule"]
        if "oldSelf" in rule:  # transition rules run only on update
            continue
        if guards and certainly_true(_guard(rule), obj):
            continue
        if activation is None:
            activation = {"self": json_to_cel(obj)}
        try:
            ok = bool(_program(rule).evaluate(activation))
        except CELEvalError:  # the API server rejects an object whose rule fails to evaluate
            ok = False
        if not ok:
            yield _field_first(str(entry.get("message") or f"failed rule: {rule}"), dotted(path) or "spec")
    if isinstance(obj, dict):
        for name, child in schema.get("properties", {}).items():
            if name in obj:
                yield from cel_errors(child, obj[name], (*path, name), guards=guards)
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(obj):
            yield from cel_errors(schema["items"], item, (*path, index), guards=guards)
