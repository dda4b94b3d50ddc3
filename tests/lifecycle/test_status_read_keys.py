"""A few keys of a stored status read alone (status_read.read_keys) read as they do in the whole status."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from blackwell_operator.lifecycle.convergence import needs_reconcile, wants_child_back
from blackwell_operator.lifecycle.status_read import read_keys, read_status
from blackwell_operator.models.spec import BlackwellTrainingJobSpec
from blackwell_operator.planner import plan_job

NOW = "2026-12-02T00:00:00Z"
KEYS = ("observedGeneration", "conditions", "child", "phase", "message")
FIELDS = {"observedGeneration": "observed_generation", "conditions": "conditions", "child": "child"}


def _plan() -> dict[str, Any]:
    spec = BlackwellTrainingJobSpec.model_validate(
        {"model": {"preset": "llama3.2-1b"}, "cluster": {"instanceType": "ml.p5en.48xlarge", "nodes": 1}}
    )
    return plan_job(spec, job_name="a").model_dump(by_alias=True, mode="json", exclude_none=True)


def _condition(type_: str, status: str, reason: str) -> dict[str, Any]:
    return {"type": type_, "status": status, "reason": reason, "lastTransitionTime": NOW}


READABLE: dict[str, Any] = {
    "observedGeneration": 2,
    "phase": "Running",
    "message": "up",
    "child": {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "a", "uid": "c1"},
    "conditions": [_condition("ChildCreated", "False", "ChildDeleted"), _condition("Running", "True", "Up")],
}
STATUSES = [
    None,
    {},
    {**READABLE, "plan": _plan()},
    {**READABLE, "plan": {"modelName": 7}},  # an unreadable plan
    {**READABLE, "oldKey": 1},  # a key of an older CRD
    {**READABLE, "phase": "Sideways"},
    {**READABLE, "conditions": [*READABLE["conditions"], _condition("Legacy", "Maybe", "x")]},
    {**READABLE, "child": {"kind": 1}},
    {**READABLE, "observedGeneration": "two"},
]


@pytest.mark.parametrize("raw", STATUSES)
def test_each_key_reads_alone_as_in_the_whole(raw: dict[str, Any] | None) -> None:
    whole = read_status(raw).status
    for size in (1, 2, 4):
        for keys in itertools.combinations(KEYS, size):
            alone = read_keys(raw, *keys).status
            for key in keys:
                field = FIELDS.get(key, key)
                assert getattr(alone, field) == getattr(whole, field), (keys, key)
            if "conditions" in keys:  # what the serializer keeps of a condition it cannot read
                assert read_keys(raw, *keys).unreadable_conditions == read_status(raw).unreadable_conditions


@pytest.mark.parametrize("raw", STATUSES)
@pytest.mark.parametrize("generation", [1, 2])
def test_the_convergence_checks_read_the_same(raw: dict[str, Any] | None, generation: int) -> None:
    btj = {"metadata": {"generation": generation}, "status": raw}
    typed = read_status(raw).status.model_dump(by_alias=True)
    whole = {"metadata": {"generation": generation}, "status": typed}
    assert needs_reconcile(btj) == needs_reconcile(whole)
    assert wants_child_back(btj) == wants_child_back(whole)
