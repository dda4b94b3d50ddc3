"""A refusal without the value it quotes: the operator's status and Events name the field and its type only.

`btj plan` shows the user their own value (`got {'secret': ...}`); a BTJ's status and its Events are read
by whoever may read the namespace, and a value in `spec.env` may be a credential. The lines stay as the
admission check wrote them, the field's value (as any message may spell it) replaced by its type.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Mapping
from typing import Any

from blackwell_operator.admission.openapi import shown

_PART = re.compile(r"\.?([^.\[\]]+)|\[(\d+)\]")
# Shorter strings are words a message may use for itself ("on", "1"), not a quote worth hiding.
_SHORTEST = 3


def value_at(body: Any, path: str) -> tuple[bool, Any]:
    """(found, value) at a path as admission names it: spec.env[0].value, metadata.labels.team."""
    node = body
    for match in _PART.finditer(path):
        key, index = match.groups()
        if index is not None and isinstance(node, list) and int(index) < len(node):
            node = node[int(index)]
        elif key is not None and isinstance(node, Mapping) and key in node:
            node = node[key]
        else:
            return False, None
    return True, node


def type_name(value: Any) -> str:
    """The value's YAML type in words."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    return "null" if value is None else "a value"


def _spellings(value: Any) -> list[str]:
    """How a message may quote the value: as admission shows it, as JSON, Python's repr, the text itself."""
    out = {shown(value), repr(value)}
    with contextlib.suppress(TypeError, ValueError):
        out.add(json.dumps(value))
    if isinstance(value, str):
        out.add(value)
    if isinstance(value, Mapping | list | tuple):  # a nested string may be quoted alone (the first one)
        out.update(
            s for item in (value.values() if isinstance(value, Mapping) else value) for s in _spellings(item)
        )
    return sorted((s for s in out if len(s) >= _SHORTEST), key=len, reverse=True)


def redacted(line: str, body: Mapping[str, Any], *, strings_only: bool = False) -> str:
    """`line` (`path: problem`) with the value at `path` in `body`, however the problem spells it, replaced
    by `<its type>`. `strings_only`: only a string there is replaced, for a spec admission has already
    typed (the planner's refusals reason in counts, and name a section such as spec.model whose parts
    they quote as fields)."""
    path, sep, problem = line.partition(": ")
    found, value = value_at(body, path)
    # A `name` (of a variable, a volume, a Secret) is how the spec refers to a thing, shown like a path;
    # written as anything but a string it is a value like any other.
    named = path.endswith(".name") and isinstance(value, str)
    if not sep or not found or value is None or isinstance(value, bool) or named:
        return line
    if strings_only and isinstance(value, Mapping | list | tuple):
        # A section (spec.model) the refusal reasons about: the strings written in it are values too
        # (a weights folder may name a project); its counts stay, they are the reasoning.
        for text in sorted({s for s in _strings_in(value) if len(s) >= _SHORTEST}, key=len, reverse=True):
            problem = problem.replace(text, "<string>")
        return f"{path}{sep}{problem}"
    if strings_only and not isinstance(value, str):
        return line
    for text in _spellings(value):
        problem = problem.replace(text, f"<{type_name(value).removeprefix('a ')}>")
    return f"{path}{sep}{problem}"


def _strings_in(value: Any) -> list[str]:
    """Every string written inside a mapping or a list, at any depth (not the keys: they are fields)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, Mapping):
        return [s for item in value.values() for s in _strings_in(item)]
    if isinstance(value, list | tuple):
        return [s for item in value for s in _strings_in(item)]
    return []
