"""The emulated cluster and the controller stand-ins `btj demo` uses: nodes as HyperPod publishes them,
placement as the scheduler decides it."""

from __future__ import annotations

from typing import Any

import pytest

from blackwell_operator.discovery.capacity import count_capacity
from blackwell_operator.models.spec import BlackwellTrainingJobSpec
from blackwell_operator.render import render_children
from blackwell_operator.testing.cluster import allocatable, emulated_cluster, hyperpod_node
from blackwell_operator.testing.controllers import ControllerStandIn, place, workers_of
from tests.operator.harness import B200, NAMESPACE
from tests.support.plans import plan_for

P5 = "ml.p5.48xlarge"


def job(nodes: int = 2, instance_type: str = B200, backend: str = "PyTorchJob") -> dict[str, Any]:
    spec = BlackwellTrainingJobSpec.model_validate(
        {
            "model": {"preset": "llama3.1-8b"},
            "cluster": {"instanceType": instance_type, "nodes": nodes},
            "backend": backend,
        }
    )
    return render_children("job", NAMESPACE, spec, plan_for(spec, "job"))[-1]


def workers(nodes: int = 2, backend: str = "PyTorchJob") -> Any:
    """The workers of a job; a TrainJob's come with its TrainingRuntime."""
    spec = BlackwellTrainingJobSpec.model_validate(
        {"model": {"preset": "llama3.1-8b"}, "cluster": {"nodes": nodes}, "backend": backend}
    )
    children = render_children("job", NAMESPACE, spec, plan_for(spec, "job"))
    return workers_of(children[-1], children[1] if backend == "TrainJob" else None)


def nodes(count: int, instance_type: str = B200, **overrides: str) -> list[dict[str, Any]]:
    resources = {**allocatable(instance_type), **overrides}
    return [hyperpod_node(f"n{i}", instance_type, resources=resources) for i in range(count)]


@pytest.mark.parametrize("instance_type", [B200, P5, "ml.p5en.48xlarge"])
def test_an_emulated_node_holds_exactly_one_trainer_pod(instance_type: str) -> None:
    workers = workers_of(job(instance_type=instance_type))
    capacity = count_capacity(nodes(3, instance_type), instance_type, workers.requests)
    assert capacity.fitting == 3, capacity.why_not
    assert int(allocatable(instance_type)["nvidia.com/gpu"]) == workers.requests["nvidia.com/gpu"] == 8


async def test_the_emulated_cluster_keeps_the_nodes_allocatable() -> None:
    async with emulated_cluster(NAMESPACE, nodes(2)) as k:
        stored = k.live_objects("v1/nodes")
        assert [n["status"]["allocatable"] for n in stored] == [allocatable(B200)] * 2
        assert k.get_object("v1/namespaces", None, NAMESPACE) is not None


@pytest.mark.parametrize("backend", ["PyTorchJob", "HyperPodPyTorchJob", "TrainJob"])
def test_workers_fit_one_per_node(backend: str) -> None:
    placement = place(workers(4, backend), nodes(5))
    assert placement.complete and placement.nodes == ("n0", "n1", "n2", "n3")


def test_too_few_nodes_leave_workers_pending_with_the_schedulers_reason() -> None:
    placement = place(workers_of(job(4)), nodes(3) + nodes(2, P5))
    assert not placement.complete and len(placement.nodes) == 3
    assert placement.why_not == (
        "0/5 nodes are available: 2 node(s) didn't match Pod's node affinity/selector, "
        "3 node(s) didn't match pod anti-affinity rules (taken by this job)."
    )


def test_a_node_without_the_efa_device_plugin_holds_no_worker() -> None:
    placement = place(workers_of(job(2)), nodes(2, **{"vpc.amazonaws.com/efa": "0"}))
    assert placement.nodes == ()
    assert placement.why_not == "0/2 nodes are available: 2 Insufficient vpc.amazonaws.com/efa."


def test_a_node_that_publishes_no_allocatable_holds_no_worker() -> None:
    bare = [hyperpod_node("fresh", B200)]
    why = place(workers_of(job(1)), bare).why_not
    assert why == "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."


def test_an_unhealthy_or_cordoned_node_is_not_used() -> None:
    sick = hyperpod_node("sick", B200, health="Unschedulable", resources=allocatable(B200))
    cordoned = hyperpod_node("cordoned", B200, resources=allocatable(B200))
    cordoned["spec"] = {"unschedulable": True}
    placement = place(workers_of(job(1)), [sick, cordoned])
    assert placement.nodes == ()
    assert "2 node(s) didn't match Pod's node affinity/selector" in placement.why_not


def test_a_trainjob_without_its_runtime_is_refused_in_one_line() -> None:
    with pytest.raises(ValueError, match="TrainingRuntime of TrainJob job is missing"):
        workers_of(job(backend="TrainJob"))


def test_another_kind_is_refused_in_one_line() -> None:
    with pytest.raises(ValueError, match="cannot play the controller of a JAXJob"):
        workers_of({"kind": "JAXJob", "spec": {}})


async def test_a_job_whose_service_account_is_missing_gets_no_pods() -> None:
    spec = BlackwellTrainingJobSpec.model_validate(
        {"model": {"preset": "llama3.1-8b"}, "serviceAccountName": "training-s3"}
    )
    _, child = render_children("job", NAMESPACE, spec, plan_for(spec, "job"))
    child["metadata"]["uid"] = "u"
    async with emulated_cluster(NAMESPACE, nodes(2)) as k:
        stand_in = ControllerStandIn(k, child, steps=10)
        moves, waits = stand_in.moves(nodes(2))
        assert [m.expect for m in moves] == ["Pending"]
        assert "serviceaccount 'training-s3' does not exist in namespace" in waits
        moves, waits = stand_in.moves(nodes(2), service_accounts={"default", "training-s3"})
        assert waits == "" and [m.expect for m in moves] == ["Pending", "Running", "Succeeded"]
