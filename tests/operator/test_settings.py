"""The operator's BTJ_* environment settings: defaults, off at zero, and one line naming a bad variable."""

from __future__ import annotations

import pytest

from blackwell_operator.settings import OFF_AT_ZERO, OperatorEnvironment, env_name, operator_environment


def test_unset_and_empty_variables_mean_the_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for field in OperatorEnvironment.model_fields:
        monkeypatch.delenv(env_name(field), raising=False)
    monkeypatch.setenv("BTJ_MEASURE_INTERVAL_S", "")
    env = operator_environment()
    assert (env.child_retry_interval_s, env.stuck_pod_timeout_s, env.measure_interval_s) == (60, 300, 60)
    assert env.metrics_bind is None


def test_every_setting_has_its_documented_variable() -> None:
    names = {env_name(field) for field in OperatorEnvironment.model_fields}
    assert names == {
        "BTJ_CHILD_RETRY_INTERVAL_S",
        "BTJ_STUCK_POD_TIMEOUT_S",
        "BTJ_MEASURE_INTERVAL_S",
        "BTJ_METRICS_BIND",
        "BTJ_PLAN_DEADLINE_S",
        "BTJ_DEFAULT_TRAINER_IMAGE",
        "BTJ_CLUSTER_CALIBRATION_NAMESPACE",
        "BTJ_CLUSTER_CALIBRATION_POOL",
        "BTJ_CHECK_IMAGE_PULL_SECRETS",
        "BTJ_ELASTIC_INTERVAL_S",
        "BTJ_OPERATOR_NAMESPACE",
        "BTJ_OPERATOR_SERVICE_ACCOUNT",
        "BTJ_ALLOWED_SERVICE_ACCOUNTS",
        "BTJ_FREE_CAPACITY",
        "BTJ_CAPACITY_CACHE_S",
    }
    assert set(OperatorEnvironment.model_fields) >= OFF_AT_ZERO
    with pytest.raises(KeyError, match="no operator setting"):
        env_name("stuck_pod_timeout")


@pytest.mark.parametrize(
    ("name", "raw", "line"),
    [
        ("BTJ_STUCK_POD_TIMEOUT_S", "soon", "BTJ_STUCK_POD_TIMEOUT_S='soon': not a number of seconds. "
         "Fix: e.g. 300, or 0 for off"),
        ("BTJ_STUCK_POD_TIMEOUT_S", "-1", "BTJ_STUCK_POD_TIMEOUT_S='-1': must not be negative. "
         "Fix: e.g. 300, or 0 for off"),
        # float() reads "nan" and "inf"; neither is a usable number of seconds.
        ("BTJ_MEASURE_INTERVAL_S", "nan", "BTJ_MEASURE_INTERVAL_S='nan': not a finite number of seconds. "
         "Fix: e.g. 60, or 0 for off"),
        ("BTJ_CHILD_RETRY_INTERVAL_S", "0", "BTJ_CHILD_RETRY_INTERVAL_S='0': must be positive. Fix: e.g. 60"),
        ("BTJ_CLUSTER_CALIBRATION_NAMESPACE", "BTJ System",
         "BTJ_CLUSTER_CALIBRATION_NAMESPACE='BTJ System': not a namespace name (lowercase letters, digits "
         "and '-'). Fix: e.g. btj-system (the chart sets it to the release's namespace)"),
        ("BTJ_CHECK_IMAGE_PULL_SECRETS", "maybe", "BTJ_CHECK_IMAGE_PULL_SECRETS='maybe': not true or false. "
         "Fix: true or false (the chart sets it from operator.checkImagePullSecrets)"),
        ("BTJ_FREE_CAPACITY", "sure", "BTJ_FREE_CAPACITY='sure': not true or false. "
         "Fix: true or false (the chart sets it from operator.freeCapacity)"),
        ("BTJ_CAPACITY_CACHE_S", "-5", "BTJ_CAPACITY_CACHE_S='-5': must not be negative. Fix: e.g. 5"),
    ],
)  # fmt: skip
def test_a_bad_value_is_one_line_naming_the_variable_and_the_fix(
    monkeypatch: pytest.MonkeyPatch, name: str, raw: str, line: str
) -> None:
    monkeypatch.setenv(name, raw)
    with pytest.raises(ValueError) as info:
        operator_environment()
    assert str(info.value) == line


def test_the_settings_are_read_when_asked_not_at_import(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BTJ_METRICS_BIND", "127.0.0.1:9")
    assert operator_environment().metrics_bind == "127.0.0.1:9"
    monkeypatch.setenv("BTJ_METRICS_BIND", "off")
    assert operator_environment().metrics_bind == "off"


def test_a_read_is_reused_only_while_the_variables_are_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BTJ_MEASURE_INTERVAL_S", "30")
    first = operator_environment()
    assert operator_environment() is first  # nothing changed: the same settings, not read again
    monkeypatch.setenv("btj_measure_interval_s", "45")  # names are case-insensitive: a change all the same
    monkeypatch.delenv("BTJ_MEASURE_INTERVAL_S")
    assert operator_environment().measure_interval_s == 45.0
    monkeypatch.setenv("btj_measure_interval_s", "soon")
    with pytest.raises(ValueError, match="BTJ_MEASURE_INTERVAL_S='soon'"):
        operator_environment()
    with pytest.raises(ValueError):  # a bad value is refused on every read, never remembered as good
        operator_environment()
