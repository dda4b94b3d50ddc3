"""The PromQL reading the dashboard test relies on."""

from __future__ import annotations

import pytest

from tests.dashboard.promql import label_values_query, parse


def test_metrics_matchers_rates_and_quantile_groupings() -> None:
    query = parse(
        'histogram_quantile(0.95, sum by (namespace, job, le) (rate(a_seconds_bucket{job=~"$job", x="y"}'
        "[$__rate_interval]))) / on (pod) group_left b_total offset 5m"
    )
    assert query.metrics == {"a_seconds_bucket", "b_total"}
    assert ("a_seconds_bucket", {"job": "$job", "x": "y"}) in query.selectors
    assert query.rated == ["a_seconds_bucket"]
    assert query.quantile_groupings == [["namespace", "job", "le"]]


def test_functions_and_numbers_are_not_metrics() -> None:
    assert parse("time() - (max(c_timestamp_seconds) > 0) * 1e3").metrics == {"c_timestamp_seconds"}


def test_a_syntax_error_is_an_error() -> None:
    with pytest.raises(ValueError):
        parse("sum(rate(x_total[5m])")


def test_label_values() -> None:
    assert label_values_query('label_values(m_total{namespace=~"$namespace"}, job)') == (
        'm_total{namespace=~"$namespace"}',
        "job",
    )
    with pytest.raises(ValueError):
        label_values_query("query_result(up)")
