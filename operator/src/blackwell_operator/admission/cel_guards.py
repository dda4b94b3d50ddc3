"""A CEL rule's guards (`!has(self.x) || ...`), decided on the JSON value without the interpreter.

Most of the CRD's rules say "when this field is set, ...": a chain of `||` whose first terms are
`!has(self.a.b)`, `!(has(self.a) && has(self.b))`, `!self.flag` or `self.kind != 'shards'` (or "unless
this field is set": `has(self.a) || ...`). When the field is absent (or present, or another word) one such
term is true, and in CEL a `||` with one true term is true whatever the others are, errors included (the
spec's commutative logical operators); an `&&` is true when all of its terms are. cel-python evaluates
every term and costs about a millisecond a rule, so the admission check decides such rules here first
and runs the interpreter only for a rule this cannot show true. A term this module cannot decide (a
parent that is not a mapping, a form it does not know) is left to the interpreter: it only ever answers
"true" where CEL must. The int-or-string fields' `type(self) == string ? (self == 'auto') : ...` is
true for the word itself.
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
# A string literal without escapes (its value is its text) compared with a field.
_COMPARE = re.compile(rf"{_PATH} (==|!=) '([^'\\]*)'")
# The CRD's int-or-string rule: `type(self) == string ? (self == 'auto') : (<the number's bounds>)`.
_WORD_OR_NUMBER = re.compile(r"type\(self\) == string \? \(self == '([^'\\]*)'\) : .*", re.DOTALL)

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


def _compared(value: Any, fields: tuple[str, ...], equal: bool, literal: str) -> bool:
    """`self.<fields> == 'literal'` (or `!=`) is certainly true: the field is there and is a string."""
    for name in fields:
        if not isinstance(value, Mapping) or name not in value:
            return False
        value = value[name]
    return isinstance(value, str) and (value == literal) is equal


def _unwrapped(expr: str) -> str:
    """The expression without brackets around all of it."""
    expr = expr.strip()
    while expr.startswith("(") and _closing(expr) == len(expr) - 1:
        expr = expr[1:-1].strip()
    return expr


def _closing(expr: str) -> int:
    """Where the bracket that `expr` starts with closes (-1: nowhere)."""
    depth = 0
    for index, char in enumerate(_without_strings(expr)):
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
            if depth == 0:
                return index
    return -1


def _without_strings(expr: str) -> str:
    """`expr` with the characters of its string literals blanked (brackets inside them do not count)."""
    out, quote, escaped = [], "", False
    for char in expr:
        if quote:
            out.append(" ")
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == quote:
                quote = ""
        else:
            out.append(char)
            if char in "'\"":
                quote = char
    return "".join(out)


def _leaf(term: str) -> Guard | None:
    """A guard for one term of a form known here; None for any other term."""
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
    if match := _COMPARE.fullmatch(term):
        fields, equal, literal = _fields(match.group(1)), match.group(2) == "==", match.group(3)
        return lambda value: _compared(value, fields, equal, literal)
    if match := _WORD_OR_NUMBER.fullmatch(term):
        word = match.group(1)  # a string self takes the first branch, which is true for the word
        return lambda value: isinstance(value, str) and value == word
    return None


def guard_of(expr: str) -> Guard | None:
    """A guard for a rule (or a part of one): an `||` is certainly true when one of its terms is, an `&&`
    when all of its terms are, and a term of a known form as _leaf decides; None when nothing is known."""
    expr = _unwrapped(expr)
    terms = split_top_level(expr)
    if terms is not None and len(terms) > 1:
        some = [guard for guard in map(guard_of, terms) if guard is not None]
        return (lambda value: any(guard(value) for guard in some)) if some else None
    factors = split_top_level(expr, "&&")
    if factors is not None and len(factors) > 1:
        every = [guard_of(factor) for factor in factors]
        if any(guard is None for guard in every):
            return None
        known = [guard for guard in every if guard is not None]
        return lambda value: all(guard(value) for guard in known)
    return _leaf(expr)


def certainly_true(guard: Guard | None, value: Any) -> bool:
    """Whether the rule's guard makes it true for `value` (its `self`, as JSON)."""
    return guard is not None and guard(value)
