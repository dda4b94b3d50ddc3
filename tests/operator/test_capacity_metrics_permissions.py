"""Unit tests: node capacity counting, OperatorMetrics, PERMISSIONS, the operator's error reasons."""

from __future__ import annotations

from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from blackwell_operator.discovery import Capacity, NodeCapacityReader, count_capacity
from blackwell_operator.handlers.api import ApiError, resource_path
from blackwell_operator.handlers.reconcile import capacity_condition
from blackwell_operator.metrics import OperatorMetrics
from blackwell_operator.permissions import PERMISSIONS, granted
from tests.operator.harness import node

B200, P5 = "ml.p6-b200.48xlarge", "ml.p5.48xlarge"


def test_capacity_counts_schedulable_nodes_of_the_type() -> None:
    cordoned = node("c")
    cordoned["spec"] = {"unschedulable": True}
    nodes = [
        node("a"),
        node("b", health="UnschedulablePendingReplacement"),
        cordoned,
        node("d", P5),
        {"metadata": {"name": "bare"}},
    ]
    assert count_capacity(nodes, B200) == Capacity(B200, 3, 1)
    assert count_capacity(nodes, B200).describe() == "1 of 3 ml.p6-b200.48xlarge nodes schedulable"


def test_capacity_condition_wording() -> None:
    assert capacity_condition(Capacity(B200, 8, 2), 4) == (
        "CapacityAvailable",
        "False",
        "InsufficientNodes",
        "2 of 8 ml.p6-b200.48xlarge nodes schedulable; 4 needed. The job waits in the queue until enough "
        "nodes are healthy.",
    )
    assert capacity_condition(Capacity(B200, 8, 8), 4)[1:3] == ("True", "Sufficient")
    assert capacity_condition(None, 4)[1:3] == ("Unknown", "NodesUnreadable")


def test_capacity_reader_lists_once_per_ttl() -> None:
    calls: list[str] = []
    now = [0.0]

    def lister(selector: str) -> list[dict[str, Any]]:
        calls.append(selector)
        return [node("a"), node("b")]

    reader = NodeCapacityReader(lister, ttl=5.0, clock=lambda: now[0])
    assert reader.read(B200).schedulable == 2
    assert reader.read(B200).schedulable == 2
    assert calls == ["node.kubernetes.io/instance-type=ml.p6-b200.48xlarge"]
    now[0] = 6.0
    reader.read(B200)
    assert len(calls) == 2


def test_operator_metrics_names_and_phases() -> None:
    metrics = OperatorMetrics()
    metrics.reconcile_duration.observe(0.02)
    metrics.record_error("InvalidSpec")
    metrics.observe_job("u1", "Running")
    metrics.observe_job("u2", "Running")
    metrics.observe_job("u2", "Succeeded")
    metrics.observe_job("u3", "Invalid")
    metrics.observe_job("u3", None)
    families = {f.name: f for f in text_string_to_metric_families(metrics.exposition().decode())}
    assert {
        "btj_operator_reconcile_duration_seconds",
        "btj_operator_reconcile_errors",
        "btj_operator_jobs",
        "btj_operator_build_info",
    } <= set(families)
    jobs = {s.labels["phase"]: s.value for s in families["btj_operator_jobs"].samples}
    assert jobs["Running"] == 1 and jobs["Succeeded"] == 1 and jobs["Invalid"] == 0 and jobs["Pending"] == 0
    errors = {
        s.labels["reason"]: s.value
        for s in families["btj_operator_reconcile_errors"].samples
        if s.name.endswith("_total")
    }
    assert errors == {"InvalidSpec": 1.0}


def test_two_metric_sets_do_not_collide() -> None:
    OperatorMetrics()
    OperatorMetrics()  # each has its own registry: no "Duplicated timeseries"


def test_permissions_are_least_privilege() -> None:
    verbs = {verb for p in PERMISSIONS for verb in p.verbs}
    assert "*" not in verbs
    # Children go by owner-reference garbage collection. The deletes: a child whose worker ended on a
    # permanent error (its GPUs are freed instead of held by retries), and a trainer pod stuck Terminating
    # on a lost node (stuck_pods.py).
    deletable = {(p.api_group, p.resource) for p in PERMISSIONS if "delete" in p.verbs}
    assert deletable == {
        ("kubeflow.org", "pytorchjobs"),
        ("sagemaker.amazonaws.com", "hyperpodpytorchjobs"),
        ("", "pods"),
    }
    assert all(p.resource != "*" and p.api_group != "*" for p in PERMISSIONS)
    assert granted("kubeflow.org", "pytorchjobs", "create")
    assert not granted("kubeflow.org", "pytorchjobs", "update")
    assert not granted("training.blackwell.dev", "blackwelltrainingjobs", "update"), "never writes spec"


def test_api_error_classification() -> None:
    assert ApiError(503, "ServiceUnavailable", "").retryable
    assert ApiError(0, "ReadTimeoutError", "").retryable
    assert ApiError(409, "Conflict", "").retryable
    assert not ApiError(422, "Invalid", "").retryable
    assert ApiError(0, "x", "").metric_reason == "ApiUnreachable"
    assert resource_path("v1", "configmaps", "ns", "c") == "/api/v1/namespaces/ns/configmaps/c"
    assert resource_path("kubeflow.org/v1", "pytorchjobs", "ns", "j", "status") == (
        "/apis/kubeflow.org/v1/namespaces/ns/pytorchjobs/j/status"
    )
    assert resource_path("v1", "nodes", None) == "/api/v1/nodes"
