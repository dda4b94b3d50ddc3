"""Status as the operator writes it fits the CRD's status schema: nothing rejected, nothing pruned."""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonschema
import pytest

from blackwell_operator.models import BlackwellTrainingJob, BlackwellTrainingJobStatus
from blackwell_operator.render.crd import generate_crd
from tests.support.crd_manifests import good_manifests
from tests.support.k8s_schema import crd_open_api_schema, schema_errors, to_json_schema
from tests.support.plans import plan_for

STATUS_SCHEMA = crd_open_api_schema(generate_crd(), "v1alpha1")["properties"]["status"]


def strict_everywhere(schema: dict[str, Any]) -> dict[str, Any]:
    """The status schema with preserve-unknown-fields removed, so an undeclared field is an error."""
    copied = copy.deepcopy(schema)

    def strip(node: Any) -> None:
        if isinstance(node, dict):
            node.pop("x-kubernetes-preserve-unknown-fields", None)
            for value in node.values():
                strip(value)
        elif isinstance(node, list):
            for value in node:
                strip(value)

    strip(copied)
    return copied


VALIDATOR = jsonschema.Draft4Validator(to_json_schema(strict_everywhere(STATUS_SCHEMA)))


def status_for(manifest: dict[str, Any]) -> dict[str, Any]:
    job = BlackwellTrainingJob.model_validate(manifest)
    plan = plan_for(job.spec, job.metadata.name)
    status = BlackwellTrainingJobStatus.model_validate(
        {
            "phase": "Running",
            "observedGeneration": 3,
            "message": "PyTorchJob job is running",
            "conditions": [
                {
                    "type": "Planned",
                    "status": "True",
                    "reason": "Planned",
                    "message": "ok",
                    "lastTransitionTime": "2026-11-29T22:00:00Z",
                    "observedGeneration": 3,
                }
            ],
            "plan": json.loads(plan.to_json()),
            "child": {
                "apiVersion": "kubeflow.org/v1",
                "kind": "PyTorchJob",
                "name": "job",
                "uid": "u-1",
                "configMap": "job-plan",
            },
            "measured": {
                "tokensPerSecondPerGpu": 1234.5,
                "modelFlopsUtilization": 0.41,
                "observedAt": "2026-11-29T22:05:00Z",
            },
            "precision": plan.chosen.precision.value,
            "microBatchSize": plan.chosen.micro_batch_size,
            "activationCheckpointing": plan.chosen.activation_checkpointing.value,
        }
    )
    dumped: dict[str, Any] = status.model_dump(by_alias=True, mode="json", exclude_none=True)
    return dumped


@pytest.mark.parametrize("case", sorted(good_manifests()))
def test_full_status_validates_strictly(case: str) -> None:
    status = status_for(good_manifests()[case])
    assert status["plan"]["alternatives"], "the plan carries runners-up"
    assert schema_errors(VALIDATOR, status) == []


def test_an_undeclared_status_field_would_be_caught() -> None:
    status = status_for(good_manifests()["embedded-default"])
    status["plan"]["newField"] = 1
    status["bogus"] = True
    errors = " | ".join(schema_errors(VALIDATOR, status))
    assert "newField" in errors and "bogus" in errors


def test_the_real_plan_is_preserved_not_pruned() -> None:
    assert STATUS_SCHEMA["properties"]["plan"]["x-kubernetes-preserve-unknown-fields"] is True
