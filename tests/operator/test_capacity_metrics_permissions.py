"""Unit tests: node capacity counting, OperatorMetrics, PERMISSIONS, the operator's error reasons."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from blackwell_operator.discovery import Capacity, NodeCapacityReader, count_capacity
from blackwell_operator.discovery.capacity import parse_quantity, shortfall
from blackwell_operator.handlers.api import ApiError, resource_path
from blackwell_operator.lifecycle.capacity import capacity_condition
from blackwell_operator.lifecycle.conditions import ConditionChange
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
    assert capacity_condition(Capacity(B200, 8, 2), 4) == ConditionChange(
        "CapacityAvailable",
        "False",
        "InsufficientNodes",
        "2 of 8 ml.p6-b200.48xlarge nodes schedulable; 4 needed. The job is created; its workers wait until "
        "enough nodes are healthy.",
    )
    sufficient, unreadable = capacity_condition(Capacity(B200, 8, 8, free=8), 4), capacity_condition(None, 4)
    assert (sufficient.status, sufficient.reason) == ("True", "Sufficient")
    # Free GPUs not read: enough by allocatable only, and the reason says so (test_free_gpus.py).
    assert capacity_condition(Capacity(B200, 8, 8), 4).reason == "SufficientAllocatable"
    assert (unreadable.status, unreadable.reason) == ("Unknown", "NodesUnreadable")


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
    # on a lost node (lifecycle/stuck_pods.py), and the plan ConfigMap when its job's create is refused or its
    # finished job is gone, and a TrainJob's TrainingRuntime likewise (nothing made for a job outlives it).
    # The RBAC rules spelled out on purpose (the chart grants these names), not from render.kinds.
    deletable = {(p.api_group, p.resource) for p in PERMISSIONS if "delete" in p.verbs}
    assert deletable == {
        ("kubeflow.org", "pytorchjobs"),
        ("sagemaker.amazonaws.com", "hyperpodpytorchjobs"),
        ("trainer.kubeflow.org", "trainjobs"),
        ("trainer.kubeflow.org", "trainingruntimes"),
        ("", "pods"),
        ("", "configmaps"),
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


def _with_allocatable(name: str, **allocatable: str) -> dict[str, Any]:
    body = node(name)
    body["status"] = {"allocatable": allocatable}
    return body


FULL = {"nvidia.com/gpu": "8", "vpc.amazonaws.com/efa": "8", "hugepages-2Mi": "5120Mi", "memory": "1900Gi"}
REQUESTS = {"nvidia.com/gpu": 8, "vpc.amazonaws.com/efa": 8, "hugepages-2Mi": "5120Mi", "memory": "1722Gi"}


def test_quantities_parse_as_kubernetes_writes_them() -> None:
    assert [parse_quantity(q) for q in ("8", "5120Mi", "1.5Gi", "500m", "2k", "2e3", 7)] == [
        8,
        5120 * 2**20,
        1.5 * 2**30,
        0.5,
        2000,
        2000,
        7,
    ]


def test_a_quantity_kubernetes_does_not_know_is_not_held_against_the_node() -> None:
    with pytest.raises(ValueError, match="5XB"):
        parse_quantity("5XB")
    odd = _with_allocatable("odd", **{**FULL, "memory": "5XB"})
    assert shortfall(odd, REQUESTS) is None
    # The other resources are still checked.
    no_efa = _with_allocatable("no-efa", **{**FULL, "memory": "5XB", "vpc.amazonaws.com/efa": "0"})
    assert (shortfall(no_efa, REQUESTS) or "").startswith("vpc.amazonaws.com/efa: 0 allocatable < 8")


def test_a_node_whose_allocatable_cannot_hold_a_trainer_pod_does_not_count() -> None:
    no_efa = {**FULL, "vpc.amazonaws.com/efa": "0"}
    nodes = [
        _with_allocatable("ok", **FULL),
        _with_allocatable("no-efa", **no_efa),
        node("fresh"),  # no allocatable published yet: not held against it
    ]
    capacity = count_capacity(nodes, B200, REQUESTS)
    assert (capacity.schedulable, capacity.fitting) == (3, 2)
    assert capacity.why_not.startswith("vpc.amazonaws.com/efa: 0 allocatable < 8 requested; is the EFA")
    assert capacity_condition(capacity, 2).status == "True"
    condition = capacity_condition(capacity, 3)
    assert (condition.status, condition.reason) == ("False", "InsufficientAllocatable")
    assert "2 of them with room for a trainer pod (vpc.amazonaws.com/efa: 0 allocatable" in condition.message
    no_hugepages = {k: v for k, v in FULL.items() if k != "hugepages-2Mi"}
    (why,) = {count_capacity([_with_allocatable("h", **no_hugepages)], B200, REQUESTS).why_not}
    odd = _with_allocatable("odd", **{**FULL, "memory": "lots"})  # never blocks a job on a parse
    assert count_capacity([odd], B200, REQUESTS).fitting == 1
    assert why.startswith("hugepages-2Mi: 0 allocatable < 5120Mi requested; the nodes need 2 MiB hugepages")
