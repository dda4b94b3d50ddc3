"""The small PromQL name extractor the dashboard test relies on."""

from __future__ import annotations

from tests.dashboard.promql import label_values_metric, metric_names, selectors


def test_functions_labels_ranges_and_groupings_are_not_metrics() -> None:
    expr = (
        'histogram_quantile(0.95, sum by (namespace, job, le) (rate(a_seconds_bucket{job=~"$job", x="y"}'
        "[$__rate_interval]))) / on (pod) group_left b_total offset 5m"
    )
    assert metric_names(expr) == {"a_seconds_bucket", "b_total"}


def test_time_and_numbers_are_not_metrics() -> None:
    assert metric_names("time() - (max(c_timestamp_seconds) > 0) * 1e3") == {"c_timestamp_seconds"}


def test_a_misspelt_metric_is_found() -> None:
    assert metric_names('sum(rate(btj_trainer_token_total{pod=~"$pod"}[5m]))') == {"btj_trainer_token_total"}


def test_selectors_and_label_values() -> None:
    expr = 'x{a="1"} / x + y{b="2"}'
    assert selectors(expr, "x") == ['a="1"', ""]
    assert label_values_metric('label_values(m_total{namespace=~"$namespace"}, job)') == "m_total"
    assert label_values_metric("query_result(up)") is None
