"""Whether a pod is what its job's controller makes (lifecycle/pod_origin.py): pure, on the jobs the operator
renders. The end-to-end cases (a copied controller reference, a re-parented pod) are in
tests/operator/test_forged_pods.py."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from blackwell_operator.lifecycle.pod_origin import created_after, job_templates, made_from
from blackwell_operator.models.spec import Backend, BlackwellTrainingJobSpec
from blackwell_operator.render import render_children
from blackwell_operator.render.labels import JOB_NAME_LABEL
from tests.support.manifests import NAMESPACE, btj
from tests.support.plans import plan_for

BACKENDS = [b for b in Backend if b != Backend.AUTO]


def render_for(backend: Backend) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The child job the operator renders for a BTJ of `backend`, and its TrainingRuntime (TrainJob)."""
    spec = BlackwellTrainingJobSpec.model_validate(btj("w", backend=backend.value)["spec"])
    *rest, job = render_children("w", NAMESPACE, spec, plan_for(spec, "w"))
    runtime = next((o for o in rest if o["kind"] == "TrainingRuntime"), None)
    return job, runtime


def _pod_from(template: dict[str, Any], **labels: str) -> dict[str, Any]:
    """A pod as a controller makes it: the template deep-copied, its own labels added, env appended."""
    made = copy.deepcopy(template)
    made["metadata"]["labels"].update({"training.kubeflow.org/replica-type": "worker", **labels})
    made["spec"]["containers"][0].setdefault("env", []).append({"name": "RANK", "value": "0"})
    return made


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_pod_made_from_each_backend_s_template_is_recognised(backend: Backend) -> None:
    job, runtime = render_for(backend)
    (template,) = job_templates(job, runtime)
    assert made_from(_pod_from(template), [template])
    other = _pod_from(template)
    other["spec"]["containers"][0]["image"] = "docker.io/library/busybox:1.36"
    assert not made_from(other, [template])
    renamed = _pod_from(template)
    renamed["spec"]["containers"][0]["name"] = "sidecar"
    assert not made_from(renamed, [template]), "the trainer container is found by its name"
    # An extra container (a sidecar a webhook injects) changes nothing.
    extra = _pod_from(template)
    extra["spec"]["containers"].append({"name": "istio-proxy", "image": "istio/proxyv2"})
    assert made_from(extra, [template])
    # The operator's labels are kept by every controller: another job's name there is not this job's pod.
    assert not made_from(_pod_from(template, **{JOB_NAME_LABEL: "other"}), [template])


def test_a_job_without_its_template_makes_nothing() -> None:
    job, _ = render_for(Backend.TRAIN_JOB)
    assert job_templates(job, None) == []  # the TrainingRuntime could not be read
    assert not made_from({"spec": {"containers": []}}, [])


def test_the_creation_time_counts_at_one_second_resolution() -> None:
    job = {"metadata": {"creationTimestamp": "2026-12-01T11:00:00Z"}}

    def pod(at: str | None) -> dict[str, Any]:
        return {"metadata": {"creationTimestamp": at} if at else {}}

    assert created_after(pod("2026-12-01T11:00:00Z"), [job]), "the same second: equal counts"
    assert created_after(pod("2026-12-01T11:00:01Z"), [job])
    assert not created_after(pod("2026-12-01T10:59:59Z"), [job])
    assert not created_after(pod(None), [job]), "no creation time proves nothing"
    assert not created_after(pod("2026-12-01T11:00:01Z"), [{"metadata": {}}])


@pytest.mark.parametrize(
    ("pod_image", "template_image", "same"),
    [
        # Digest pinning by an image-signature webhook (Kyverno verifyImages mutateDigest): the same image.
        ("registry.example.com/t/trainer:0.1.0@sha256:ab12", "registry.example.com/t/trainer:0.1.0", True),
        ("registry.example.com/t/trainer@sha256:ab12", "registry.example.com/t/trainer:0.1.0", True),
        ("reg.example.com/t/trainer:0.1.0@sha256:ab12", "reg.example.com/t/trainer@sha256:ab12", True),
        # Docker Hub's names spelled out in full.
        ("docker.io/library/busybox:1.36", "busybox:1.36", True),
        ("index.docker.io/org/img", "org/img:latest", True),
        ("localhost:5000/trainer:1", "localhost:5000/trainer:1", True),
        # Another tag, another digest, another registry (a mirror, or someone else's image): not the same.
        ("registry.example.com/t/trainer:0.2.0@sha256:ab12", "registry.example.com/t/trainer:0.1.0", False),
        ("registry.example.com/t/trainer@sha256:cd34", "registry.example.com/t/trainer@sha256:ab12", False),
        ("evil.example.com/t/trainer:0.1.0", "registry.example.com/t/trainer:0.1.0", False),
        ("registry.example.com/t/trainer", "registry.example.com/t/trainer:0.1.0", False),
    ],
)
def test_an_image_pinned_to_its_digest_is_the_template_s_image(
    pod_image: str, template_image: str, same: bool
) -> None:
    job, runtime = render_for(Backend.PYTORCH_JOB)
    (template,) = job_templates(job, runtime)
    template = copy.deepcopy(template)
    template["spec"]["containers"][0]["image"] = template_image
    pod = _pod_from(template)
    pod["spec"]["containers"][0]["image"] = pod_image
    assert made_from(pod, [template]) is same
