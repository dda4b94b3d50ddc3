"""The chart's training alerts: the PrometheusRule embeds the rule file unchanged, Prometheus's own promtool
accepts it, and its unit tests (fixtures/alerts-test.yaml) fire each alert on the series it is for and on
no other. promtool comes with Debian's prometheus package (.ci/run installs it); skipped without it."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support.helm import CHART, by_kind, render

RULES = CHART / "files" / "alerts" / "btj-training.rules.yaml"
UNIT_TESTS = Path(__file__).parent / "fixtures" / "alerts-test.yaml"
ALERTS = {
    "BTJThroughputBelowPlan",
    "BTJTrainingStalled",
    "BTJCheckpointSavesFailing",
    "BTJCheckpointSkipped",
    "BTJAtGPUMemoryCapacity",
}


def promtool() -> str:
    binary = shutil.which("promtool")
    if binary is None:
        message = "no promtool (apt-get install prometheus) to check the alert rules with"
        if os.environ.get("CI", "").lower() == "true" and shutil.which("prometheus"):
            pytest.fail(message)  # the package is there but its promtool is not: broken install
        pytest.skip(message)
    return binary


def test_the_prometheus_rule_embeds_the_rule_file_unchanged(helm: str) -> None:
    assert by_kind(render(helm), "PrometheusRule") == [], "off by default"
    (rule,) = by_kind(
        render(helm, sets=("prometheusRule.enabled=true", "prometheusRule.labels.release=kps")),
        "PrometheusRule",
    )
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["labels"]["release"] == "kps"
    assert rule["spec"] == yaml.safe_load(RULES.read_text())
    names = {r["alert"] for group in rule["spec"]["groups"] for r in group["rules"]}
    assert names == ALERTS
    # Prometheus's templates reach the cluster as written: Helm did not expand them.
    assert "{{ $labels.job }}" in yaml.safe_dump(rule["spec"])


def test_promtool_accepts_the_rules() -> None:
    result = subprocess.run(
        [promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in result.stdout


def test_each_alert_fires_on_its_series_and_no_other() -> None:
    tested = {
        t["alertname"]
        for case in yaml.safe_load(UNIT_TESTS.read_text())["tests"]
        for t in case["alert_rule_test"]
    }
    assert tested == ALERTS, "every alert has a unit test"
    result = subprocess.run(
        [promtool(), "test", "rules", str(UNIT_TESTS)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
