"""A CEL rule's presence guards (`!has(self.x) || ...`), decided on the JSON value without the interpreter.

Most of the CRD's rules say "when this field is set, ...": a chain of `||` whose first terms are
`!has(self.a.b)`, `!(has(self.a) && has(self.b))` or `!self.flag` (or "unless this field is set":
`has(self.a) || ...`). When the field is absent (or present) one such term is true, and in CEL a `||` with
one true term is true whatever the others are, errors included (the spec's commutative logical operators).
cel-python evaluates every term of a `||` and costs about a millisecond a rule, so the admission check
decides these terms here first and runs the interpreter only for a rule that none of them makes true. A
term this module cannot decide (a parent that is not a mapping, a form it does not know) is left to the
interpreter: it only ever answers "true" where CEL must.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

# `self` followed by one or more `.field` selections.
_PATH = r"self((?:\.[A-Za-z_][A-Za-z0-9_]*)+)"
_NOT_HAS = re.compile(rf"!has\({_PATH}\)")
_NOT_ALL_HAVE = re.compile(rf"!\(has\({_PATH}\)((?: && has\({_PATH}\))+)\)")
_NOT_FLAG = re.compile(rf"!{_PATH}")
_HAS = re.compile(rf"has\({_PATH}\)")

# A guard: the JSON value of the rule's `self` -> True when the term is certainly true.
Guard = Callable[[Any], bool]


def _fields(path: str) -> tuple[str, ...]:
    return tuple(path.lstrip(".").split("."))


def _absent(value: Any, fields: tuple[str, ...]) -> bool:
    """`has(self.<fields>)` is certainly false: every parent is a mapping and the last field is missing.
    (A missing parent makes `has` an error in CEL, which proves nothing.)"""
    for name in fields[:-1]:
        if not isinstance(value, Mapping) or name not in value:
            return False
        value = value[name]
    return isinstance(value, Mapping) and fields[-1] not in value


def _present(value: Any, fields: tuple[str, ...]) -> bool:
    """`has(self.<fields>)` is certainly true: every parent is a mapping and the last field is there."""
    for name in fields[:-1]:
        if not isinstance(value, Mapping) or name not in value:
            return False
        value = value[name]
    return isinstance(value, Mapping) and fields[-1] in value


def _false_flag(value: Any, fields: tuple[str, ...]) -> bool:
    """`self.<fields>` is certainly the boolean false (so `!self.<fields>` is true)."""
    for name in fields:
        if not isinstance(value, Mapping) or name not in value:
            return False
        value = value[name]
    return value is False


def split_top_level(rule: str, operator: str = "||") -> list[str] | None:
    """The rule's terms around `operator` outside brackets and string literals; None when the rule has a
    top-level `?` (a conditional binds looser than `||`, so its terms would not be the rule's)."""
    terms, depth, start, quote, i = [], 0, 0, "", 0
    while i < len(rule):
        char = rule[i]
        if quote:
            if char == "\\":
                i += 1
            elif char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif depth == 0 and char == "?":
            return None
        elif depth == 0 and rule.startswith(operator, i):
            terms.append(rule[start:i].strip())
            start = i + len(operator)
            i = start
            continue
        i += 1
    if quote or depth:
        return None  # not a rule the API server would have accepted; leave it to the interpreter
    terms.append(rule[start:].strip())
    return terms


def _guard(term: str) -> Guard | None:
    """A guard for one `||` term of a form known here; None for any other term."""
    if match := _NOT_HAS.fullmatch(term):
        fields = _fields(match.group(1))
        return lambda value: _absent(value, fields)
    if _NOT_ALL_HAVE.fullmatch(term):
        # !(has(a) && has(b) && ...): true when any one of them is certainly false (false && x is false).
        paths = [_fields(m.group(1)) for m in _HAS.finditer(term)]
        return lambda value: any(_absent(value, fields) for fields in paths)
    if match := _HAS.fullmatch(term):
        fields = _fields(match.group(1))
        return lambda value: _present(value, fields)
    if match := _NOT_FLAG.fullmatch(term):
        fields = _fields(match.group(1))
        return lambda value: _false_flag(value, fields)
    return None


def guards_of(rule: str) -> tuple[Guard, ...]:
    """The guards of a rule's top-level `||` terms that have a known form (none for any other rule)."""
    terms = split_top_level(rule)
    if terms is None or len(terms) < 2:
        return ()
    return tuple(guard for guard in map(_guard, terms) if guard is not None)


def certainly_true(guards: tuple[Guard, ...], value: Any) -> bool:
    """Whether one of the rule's guards makes it true for `value` (its `self`, as JSON)."""
    return any(guard(value) for guard in guards)
