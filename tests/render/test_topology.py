"""spec.cluster.topology: Kueue's podset topology annotation on every backend's worker pod template."""

from __future__ import annotations

import re
from typing import Any

import pytest
from pydantic import ValidationError

from blackwell_operator.models.spec import BlackwellTrainingJobSpec
from blackwell_operator.render import render_children
from blackwell_operator.render.labels import KUEUE_PREFERRED_TOPOLOGY, KUEUE_REQUIRED_TOPOLOGY
from tests.render.test_children import pod_from_template
from tests.support.k8s_schema import kubernetes_errors
from tests.support.plans import plan_for

LAYER_3 = "topology.k8s.aws/network-node-layer-3"
QUEUE = "hyperpod-ns-team-a-localqueue"
BACKENDS = ("PyTorchJob", "HyperPodPyTorchJob", "TrainJob")


def spec_of(backend: str, **fields: Any) -> BlackwellTrainingJobSpec:
    return BlackwellTrainingJobSpec.model_validate(
        {"model": {"preset": "llama3.1-8b"}, "backend": backend, "queueName": QUEUE, **fields}
    )


def pod_templates(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every worker pod template the children carry, whatever the backend."""
    *_, job = objects
    if job["kind"] == "PyTorchJob":
        return [r["template"] for r in job["spec"]["pytorchReplicaSpecs"].values()]
    if job["kind"] == "HyperPodPyTorchJob":
        return [r["template"] for r in job["spec"]["replicaSpecs"]]
    runtime = objects[1]
    return [r["template"]["spec"]["template"] for r in runtime["spec"]["template"]["spec"]["replicatedJobs"]]


def render(spec: BlackwellTrainingJobSpec) -> list[dict[str, Any]]:
    return render_children("job", "hyperpod-ns-team-a", spec, plan_for(spec, "job"))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("mode", "key", "other"),
    [
        ("Required", KUEUE_REQUIRED_TOPOLOGY, KUEUE_PREFERRED_TOPOLOGY),
        ("Preferred", KUEUE_PREFERRED_TOPOLOGY, KUEUE_REQUIRED_TOPOLOGY),
    ],
)
def test_every_backend_s_pod_template_carries_the_annotation(
    backend: str, mode: str, key: str, other: str
) -> None:
    objects = render(spec_of(backend, cluster={"nodes": 4, "topology": {"level": LAYER_3, "mode": mode}}))
    templates = pod_templates(objects)
    assert templates
    for template in templates:
        annotations = template["metadata"]["annotations"]
        assert annotations[key] == LAYER_3 and other not in annotations
        assert kubernetes_errors(pod_from_template(objects[-1], template)) is None
    # Kueue reads it from the pod template (the PodSet), not from the job object.
    assert key not in (objects[-1]["metadata"].get("annotations") or {})


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_topology_no_annotation(backend: str) -> None:
    for template in pod_templates(render(spec_of(backend, cluster={"nodes": 4}))):
        annotations = template["metadata"]["annotations"]
        assert KUEUE_REQUIRED_TOPOLOGY not in annotations and KUEUE_PREFERRED_TOPOLOGY not in annotations


def test_preferred_is_the_default_mode() -> None:
    spec = spec_of("PyTorchJob", cluster={"nodes": 2, "topology": {"level": LAYER_3}})
    assert spec.cluster.topology is not None and spec.cluster.topology.mode == "Preferred"


def test_topology_needs_a_queue_and_a_label_key() -> None:
    with pytest.raises(ValidationError, match=re.escape("spec.cluster.topology needs spec.queueName")):
        BlackwellTrainingJobSpec.model_validate(
            {"model": {"preset": "llama3.1-8b"}, "cluster": {"topology": {"level": LAYER_3}}}
        )
    with pytest.raises(ValidationError, match=re.escape("is not a node label key. Fix: ")):
        spec_of("TrainJob", cluster={"topology": {"level": "layer 3"}})
    with pytest.raises(ValidationError):
        spec_of("TrainJob", cluster={"topology": {"level": LAYER_3, "mode": "Strict"}})
