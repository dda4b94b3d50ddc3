"""Pulls metric names out of PromQL expressions (enough PromQL for dashboard queries, strict on leftovers)."""

from __future__ import annotations

import re

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGES = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_VARIABLES = re.compile(r"\$\{[^}]*\}|\$\w+")
_IDENTIFIER = re.compile(r"(?<![\w.])[A-Za-z_:][A-Za-z0-9_:]*")
KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "inf",
    "nan",
    "atan2",
}


def metric_names(expr: str) -> set[str]:
    """Every metric name an expression selects (functions, keywords, labels and variables removed)."""
    text = _STRING.sub('""', expr)
    text = _VARIABLES.sub("0", text)
    text = _MATCHERS.sub("", text)
    text = _RANGES.sub("", text)
    text = _GROUPING.sub("", text)
    names: set[str] = set()
    for match in _IDENTIFIER.finditer(text):
        word = match.group(0)
        following = text[match.end() :].lstrip()
        if following.startswith("(") or word.lower() in KEYWORDS:
            continue  # a function or aggregation call, or a keyword
        names.add(word)
    return names


def selectors(expr: str, metric: str) -> list[str]:
    """The label-matcher blocks written right after `metric` in `expr` ("" when it has none)."""
    found = []
    for match in re.finditer(rf"(?<![\w:]){re.escape(metric)}(?![\w:])", expr):
        rest = expr[match.end() :]
        found.append(rest[1 : rest.index("}")] if rest.startswith("{") else "")
    return found


def label_values_metric(query: str) -> str | None:
    """The metric of a Grafana `label_values(metric{...}, label)` variable query."""
    match = re.match(r"\s*label_values\(\s*([A-Za-z_:][\w:]*)", query)
    return match.group(1) if match else None
