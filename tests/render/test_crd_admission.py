"""Manifests against the CRD as the API server would judge them: schema, defaults, CEL (cel-python)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from pydantic import ValidationError

from blackwell_operator.models import BlackwellTrainingJob
from blackwell_operator.render.crd import generate_crd
from tests.support.crd_manifests import bad_manifests, good_manifests
from tests.support.k8s_schema import admit, btj_schema_and_validator

SCHEMA, VALIDATOR = btj_schema_and_validator(generate_crd())
GOOD = good_manifests()
BAD = bad_manifests()

ARCHITECTURE = {
    "hiddenSize": 2048,
    "numLayers": 16,
    "numAttentionHeads": 32,
    "numKeyValueHeads": 8,
    "intermediateSize": 8192,
    "vocabSize": 128256,
}


def manifest(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "training.blackwell.dev/v1alpha1",
        "kind": "BlackwellTrainingJob",
        "metadata": {"name": "job", "namespace": "hyperpod-ns-team-a"},
        "spec": {"model": {"preset": "llama3.1-8b"}, **spec},
    }


VARIANTS = {
    "architecture": manifest(model={"architecture": ARCHITECTURE}),
    "head-dim-explicit": manifest(
        model={"architecture": {**ARCHITECTURE, "hiddenSize": 2000, "headDim": 64}}
    ),
    "pinned-knobs": manifest(
        tuning={
            "precision": "mxfp8",
            "activationCheckpointing": "selective",
            "microBatchSize": 4,
            "sharding": "hybrid",
            "contextParallel": 2,
            "memoryHeadroom": 0.1,
        }
    ),
    "shards": manifest(training={"dataset": {"kind": "shards", "uri": "s3://bucket/tokens/"}}),
    "everything": manifest(
        cluster={"instanceType": "ml.p5en.48xlarge", "nodes": 8, "gpusPerNode": 8},
        backend="HyperPodPyTorchJob",
        queueName="hyperpod-ns-team-a-localqueue",
        priorityClass="training-priority",
        autoResume=True,
        maxRetries=5,
        ttlSecondsAfterFinished=86400,
        tolerations=[
            {"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"},
            {"operator": "Exists"},
        ],
        env=[{"name": "NCCL_DEBUG", "value": "INFO"}],
        dryRun=True,
    ),
    "nulls-are-pruned": manifest(cluster={"gpusPerNode": None}, queueName=None),
}


@pytest.mark.parametrize("case", sorted({**GOOD, **VARIANTS}))
def test_good_manifests_are_admitted(case: str) -> None:
    obj = {**GOOD, **VARIANTS}[case]
    assert admit(SCHEMA, VALIDATOR, obj) == []
    BlackwellTrainingJob.model_validate(obj)  # and the operator's models agree


def test_examples_were_found() -> None:
    assert "embedded-default" in GOOD


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_manifests_are_rejected_with_the_field_named(case: str) -> None:
    obj, expected, models_reject = BAD[case]
    errors = admit(SCHEMA, VALIDATOR, obj)
    assert errors, f"{case}: admitted"
    assert any(expected in error for error in errors), errors
    if models_reject:
        with pytest.raises(ValidationError):
            BlackwellTrainingJob.model_validate(obj)


def test_there_are_bad_manifests() -> None:
    assert len(BAD) >= 15


def test_defaults_are_applied_by_the_schema() -> None:
    from blackwell_operator.admission.openapi import apply_defaults

    obj = apply_defaults(SCHEMA, copy.deepcopy(manifest()))
    spec = obj["spec"]
    assert spec["cluster"] == {"instanceType": "ml.p6-b200.48xlarge", "nodes": 1}
    assert spec["tuning"]["precision"] == "auto" and spec["tuning"]["microBatchSize"] == "auto"
    assert spec["training"]["dataset"]["kind"] == "synthetic"
    assert spec["backend"] == "PyTorchJob" and spec["maxRetries"] == 3
    # The operator's models give the same defaults.
    parsed = BlackwellTrainingJob.model_validate(manifest()).spec.model_dump(by_alias=True, mode="json")
    assert parsed["cluster"]["instanceType"] == spec["cluster"]["instanceType"]
    assert parsed["tuning"]["memoryHeadroom"] == spec["tuning"]["memoryHeadroom"]


IMMUTABLE: dict[str, tuple[dict[str, Any], str]] = {
    "instance-type": (
        {"cluster": {"instanceType": "ml.p5.48xlarge"}},
        "spec.cluster.instanceType is immutable",
    ),
    "backend": ({"backend": "HyperPodPyTorchJob"}, "spec.backend is immutable"),
    "model": ({"model": {"preset": "llama3.1-70b"}}, "spec.model is immutable"),
}


@pytest.mark.parametrize("case", sorted(IMMUTABLE))
def test_immutable_fields_cannot_change_on_update(case: str) -> None:
    change, message = IMMUTABLE[case]
    old = manifest()
    new = manifest(**change) if "model" not in change else {**manifest(), "spec": {**change}}
    assert admit(SCHEMA, VALIDATOR, new) == [], "a create with the new value is fine"
    errors = admit(SCHEMA, VALIDATOR, new, old=old)
    assert any(message in error for error in errors), errors


def test_mutable_fields_and_defaulted_equivalents_may_change() -> None:
    old = manifest()
    new = manifest(cluster={"instanceType": "ml.p6-b200.48xlarge", "nodes": 4}, tuning={"precision": "bf16"})
    assert admit(SCHEMA, VALIDATOR, new, old=old) == []


def test_crd_validator_is_strict_about_unknown_fields() -> None:
    assert isinstance(VALIDATOR, jsonschema.Draft4Validator)
    errors = admit(SCHEMA, VALIDATOR, manifest(cluster={"nodes": 2, "gpu": 8}))
    assert any("gpu" in error for error in errors)


def test_bad_dir_is_next_to_this_file() -> None:
    assert (Path(__file__).parent / "bad").is_dir()


@pytest.mark.parametrize(
    ("tuning", "cluster", "expected"),
    [
        ({"microBatchSize": 0}, {}, "must be 'auto', or an integer from 1 to 1024"),
        ({"microBatchSize": "big"}, {}, "must be 'auto', or an integer from 1 to 1024"),
        ({"contextParallel": 128}, {}, "must be 'auto', or an integer from 1 to 64"),
        ({}, {"gpusPerNode": 16}, "spec.cluster.gpusPerNode must be at most 8"),
    ],
)
def test_cel_rules_alone_reject_what_the_schema_also_rejects(
    tuning: dict[str, Any], cluster: dict[str, Any], expected: str
) -> None:
    # The schema catches these first; the CEL rules are the backstop with a clearer message.
    from blackwell_operator.admission.openapi import apply_defaults
    from tests.support.k8s_schema import cel_errors

    obj = apply_defaults(SCHEMA, manifest(tuning=tuning, cluster=cluster))
    assert any(expected in error for error in cel_errors(SCHEMA, obj))
    assert cel_errors(SCHEMA, apply_defaults(SCHEMA, manifest(tuning={"microBatchSize": 8}))) == []


@pytest.mark.parametrize("name", ["job", "a", "llama3-8b", "8b", "Job", "a.b", "a-", "x" * 51, "x" * 52])
def test_cli_name_check_agrees_with_the_cel_rules(name: str) -> None:
    from blackwell_operator.render.names import name_problem

    obj = manifest()
    obj["metadata"]["name"] = name
    assert (admit(SCHEMA, VALIDATOR, obj) == []) == (name_problem(name) is None)
