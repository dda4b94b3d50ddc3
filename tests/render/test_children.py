"""Rendered children against both PyTorchJob CRDs, the training webhook rules and built-in schemas."""

from __future__ import annotations

import itertools
from typing import Any

import jsonschema
import pytest
import yaml

from blackwell_operator.models import BlackwellTrainingJob, BlackwellTrainingJobSpec
from blackwell_operator.models.spec import InstanceType
from blackwell_operator.render import render_children
from tests.render.webhook import webhook_errors
from tests.support.crd_manifests import good_manifests
from tests.support.k8s_schema import (
    PYTORCHJOB_CRDS,
    SCHEMA_MISSING,
    crd_open_api_schema,
    kubernetes_errors,
    load_crd,
    schema_errors,
    strict_validator,
)
from tests.support.plans import plan_for

NAMESPACE = "hyperpod-ns-team-a"
# A TrainJob child (ConfigMap, TrainingRuntime, TrainJob) is checked, with its pod template, against the
# Kubeflow Trainer v2.3.0 CRDs in test_trainjob.py, for every case here.


@pytest.fixture(scope="module", params=sorted(PYTORCHJOB_CRDS))
def pytorchjob_validator(request: pytest.FixtureRequest) -> jsonschema.Draft4Validator:
    path = PYTORCHJOB_CRDS[request.param]
    if not path.is_file():
        pytest.skip(f"{path} {SCHEMA_MISSING}")
    crd = load_crd(path)
    return strict_validator(crd_open_api_schema(crd, "v1"), api_version="kubeflow.org/v1", kind="PyTorchJob")


def spec_of(**overrides: Any) -> BlackwellTrainingJobSpec:
    return BlackwellTrainingJobSpec.model_validate({"model": {"preset": "llama3.1-8b"}, **overrides})


MATRIX = {
    f"{instance.name.lower()}-{nodes}n-queue{int(queue)}-resume{int(resume)}": spec_of(
        cluster={"instanceType": instance.value, "nodes": nodes},
        **(
            {"queueName": "hyperpod-ns-team-a-localqueue", "priorityClass": "training-priority"}
            if queue
            else {}
        ),
        autoResume=resume,
    )
    for instance, nodes, queue, resume in itertools.product(
        InstanceType, (1, 8), (False, True), (False, True)
    )
}


def example_specs() -> dict[str, tuple[str, BlackwellTrainingJobSpec]]:
    """Every good example manifest, parsed."""
    parsed = {}
    for case, manifest in good_manifests().items():
        job = BlackwellTrainingJob.model_validate(manifest)
        parsed[case] = (job.metadata.name, job.spec)
    return parsed


EXAMPLES = example_specs()
CASES = {**{k: ("job", v) for k, v in MATRIX.items()}, **EXAMPLES}


def render(name: str, spec: BlackwellTrainingJobSpec) -> list[dict[str, Any]]:
    return render_children(name, NAMESPACE, spec, plan_for(spec, name))


def pod_from_template(job: dict[str, Any], template: dict[str, Any]) -> dict[str, Any]:
    """The pod the training operator would create from a template (name and namespace added)."""
    metadata = {"name": f"{job['metadata']['name']}-worker-0", "namespace": NAMESPACE, **template["metadata"]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": template["spec"]}


# The cases each check applies to, so that no cell is generated only to be skipped: a TrainJob child is
# checked in test_trainjob.py, and a HyperPodPyTorchJob has no public CRD to validate against
# (docs/reference/hyperpod-pytorchjob.md, open question 1).
PYTORCHJOB_CASES = sorted(case for case, (_, spec) in CASES.items() if spec.backend.value == "PyTorchJob")
NOT_TRAINJOB_CASES = sorted(case for case, (_, spec) in CASES.items() if spec.backend.value != "TrainJob")


@pytest.mark.parametrize("case", PYTORCHJOB_CASES)
def test_pytorchjob_validates_against_the_crd(
    case: str, pytorchjob_validator: jsonschema.Draft4Validator
) -> None:
    name, spec = CASES[case]
    _, job = render(name, spec)
    assert schema_errors(pytorchjob_validator, job) == []


@pytest.mark.parametrize("case", NOT_TRAINJOB_CASES)
def test_children_pass_the_webhook_and_builtin_schemas(case: str) -> None:
    name, spec = CASES[case]
    config_map, job = render(name, spec)
    assert kubernetes_errors(config_map) is None
    if job["kind"] == "PyTorchJob":
        assert webhook_errors(job) == []
        templates = [r["template"] for r in job["spec"]["pytorchReplicaSpecs"].values()]
    else:
        templates = [r["template"] for r in job["spec"]["replicaSpecs"]]
    for template in templates:
        assert kubernetes_errors(pod_from_template(job, template)) is None


def test_the_webhook_checks_catch_bad_jobs() -> None:
    _, job = render("job", spec_of())
    worker = job["spec"]["pytorchReplicaSpecs"]["Worker"]
    bad = yaml.safe_load(yaml.safe_dump(job))
    bad["metadata"]["name"] = "Job_1"
    bad["spec"]["pytorchReplicaSpecs"] = {"Chief": worker, "Master": {**worker, "replicas": 2}}
    bad["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["name"] = "trainer"
    errors = " | ".join(webhook_errors(bad))
    for text in (
        "DNS-1035",
        "only Master and Worker",
        "exactly one container named pytorch",
        "Master.replicas must be 1",
        "elasticPolicy needs a Worker",
    ):
        assert text in errors


def test_strict_pytorchjob_schema_rejects_unknown_fields(
    pytorchjob_validator: jsonschema.Draft4Validator,
) -> None:
    _, job = render("job", spec_of())
    job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["imagee"] = "x"
    job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = "one"
    errors = " | ".join(schema_errors(pytorchjob_validator, job))
    assert "imagee" in errors and "'one'" in errors
