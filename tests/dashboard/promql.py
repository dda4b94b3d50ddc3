"""PromQL of the dashboard, read with a real PromQL parser (promql-parser, the Python binding of
GreptimeTeam's Rust parser): metric names, label matchers, rate() arguments, quantile groupings."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import promql_parser

# Grafana replaces these before Prometheus sees the query; any valid duration parses the same way.
_GRAFANA_RANGES = re.compile(r"\$__(rate_)?interval|\$__range")


@dataclass
class Query:
    """What one PromQL expression selects and computes."""

    selectors: list[tuple[str, dict[str, str]]] = field(default_factory=list)  # (metric, {label: value})
    rated: list[str] = field(default_factory=list)  # metrics under rate()/irate()/increase()
    quantile_groupings: list[list[str]] = field(default_factory=list)  # `by` labels under histogram_quantile

    @property
    def metrics(self) -> set[str]:
        return {name for name, _ in self.selectors}


def parse(expr: str) -> Query:
    """Parse `expr` (raises ValueError on a syntax error) and collect what the tests check."""
    ast = promql_parser.parse(_GRAFANA_RANGES.sub("5m", expr))
    query = Query()

    def visit(node: Any) -> bool:
        kind = type(node).__name__
        if kind == "VectorSelector":
            matchers = {m.name: m.value for m in node.matchers.matchers}
            query.selectors.append((node.name, matchers))
        elif kind == "Call" and node.func.name in {"rate", "irate", "increase"}:
            query.rated += [a.vector_selector.name for a in node.args if type(a).__name__ == "MatrixSelector"]
        elif kind == "Call" and node.func.name == "histogram_quantile":
            for arg in node.args:
                if type(arg).__name__ == "AggregateExpr" and arg.modifier is not None:
                    query.quantile_groupings.append(list(arg.modifier.labels))
                elif type(arg).__name__ == "AggregateExpr":
                    query.quantile_groupings.append([])
        return True

    promql_parser.walk(ast, visit)
    return query


def label_values_query(query: str) -> tuple[str, str]:
    """(selector expression, label) of a Grafana `label_values(selector, label)` variable query."""
    match = re.fullmatch(r"\s*label_values\((.*),\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)\s*", query)
    if not match:
        raise ValueError(f"not a label_values() query: {query}")
    return match.group(1), match.group(2)
