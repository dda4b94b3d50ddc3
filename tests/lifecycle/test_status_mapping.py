"""Unit tests of the pure status logic: child conditions -> phase, metav1.Condition bookkeeping."""

from __future__ import annotations

from typing import Any

import pytest

from blackwell_operator.lifecycle.conditions import set_condition
from blackwell_operator.lifecycle.patch import merge_patch_to, plan_document
from blackwell_operator.lifecycle.phase import (
    can_patch_in_place,
    child_conditions,
    child_message,
    child_phase,
)
from blackwell_operator.models.status import Condition, Phase

T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z"


def _raw(conds: list[Condition]) -> list[dict[str, Any]]:
    """Typed conditions as the status carries them."""
    return [c.model_dump(by_alias=True, exclude_unset=True) for c in conds]


def cond(type_: str, status: str = "True", message: str = "") -> dict[str, Any]:
    return {
        "type": type_,
        "status": status,
        "reason": f"PyTorchJob{type_}",
        "message": message,
        "lastUpdateTime": T0,
        "lastTransitionTime": T0,
    }


@pytest.mark.parametrize(
    ("conditions", "phase"),
    [
        ([], Phase.PENDING),
        ([cond("Created")], Phase.PENDING),
        ([cond("Created"), cond("Suspended")], Phase.QUEUED),
        ([cond("Created"), cond("Suspended", "False"), cond("Running")], Phase.RUNNING),
        ([cond("Created"), cond("Running", "False"), cond("Restarting")], Phase.RESTARTING),
        ([cond("Created"), cond("Restarting", "False"), cond("Running")], Phase.RUNNING),
        ([cond("Created"), cond("Running", "False"), cond("Succeeded")], Phase.SUCCEEDED),
        ([cond("Created"), cond("Running", "False"), cond("Failed")], Phase.FAILED),
        # First match wins (docs/reference/hyperpod-pytorchjob.md §1.4): Failed before Succeeded before
        # Suspended ...
        ([cond("Succeeded"), cond("Failed")], Phase.FAILED),
        ([cond("Suspended"), cond("Succeeded")], Phase.SUCCEEDED),
        ([cond("Running"), cond("Suspended")], Phase.QUEUED),
        ([cond("Running"), cond("Restarting")], Phase.RESTARTING),
        # HyperPodPyTorchJob's success names.
        ([cond("Completed")], Phase.SUCCEEDED),
        ([cond("Complete")], Phase.SUCCEEDED),
    ],
)
def test_child_phase(conditions: list[dict[str, Any]], phase: Phase) -> None:
    assert child_phase({"conditions": conditions}) == phase


def test_a_re_appended_condition_counts_as_its_latest_copy() -> None:
    # The training operator re-appends a changed condition: the later entry wins.
    status = {"conditions": [cond("Running"), cond("Running", "False"), cond("Succeeded")]}
    assert child_phase(status) == Phase.SUCCEEDED
    assert child_phase(None) == Phase.PENDING


def test_child_message_is_the_latest_true_condition() -> None:
    status = {
        "conditions": [
            cond("Created", message="made"),
            cond("Running", message="go"),
            cond("Restarting", "False", message="old"),
        ]
    }
    assert child_message(status) == "go"
    assert child_message({}) == ""


def test_set_condition_moves_transition_time_only_on_a_flip() -> None:
    conds = set_condition([], "Running", "False", "Pending", "not yet", generation=1, now=T0)
    assert _raw(conds) == [
        {
            "type": "Running",
            "status": "False",
            "reason": "Pending",
            "message": "not yet",
            "lastTransitionTime": T0,
            "observedGeneration": 1,
        }
    ]
    same = set_condition(conds, "Running", "False", "Suspended", "queued", generation=2, now=T1)
    assert same[0].last_transition_time == T0 and same[0].reason == "Suspended"
    assert same[0].observed_generation == 2
    flipped = set_condition(same, "Running", "True", "Running", "go", generation=2, now=T1)
    assert flipped[0].last_transition_time == T1
    assert conds[0].status == "False", "the input list is not mutated"
    for item in _raw(flipped):
        Condition.model_validate(item)  # the metav1.Condition shape of the status model


def test_child_conditions_cover_all_four_types() -> None:
    phase, conds = child_conditions(
        [], {"conditions": [cond("Created"), cond("Suspended")]}, generation=3, now=T0, queue_name="q"
    )
    by_type = {c["type"]: c for c in _raw(conds)}
    assert phase == Phase.QUEUED
    # The four child conditions, and KueueManaged since the spec names a queue (test_kueue_condition.py).
    assert set(by_type) == {"Admitted", "Running", "Succeeded", "Failed", "KueueManaged"}
    assert by_type["Admitted"]["status"] == "False" and by_type["Admitted"]["reason"] == "Suspended"
    phase, conds = child_conditions(
        conds,
        {"conditions": [cond("Created"), cond("Suspended", "False"), cond("Running", message="up")]},
        generation=3,
        now=T1,
        queue_name="q",
    )
    by_type = {c["type"]: c for c in _raw(conds)}
    assert phase == Phase.RUNNING
    assert by_type["Admitted"] == {**by_type["Admitted"], "status": "True", "lastTransitionTime": T1}
    assert "queue q" in by_type["Admitted"]["message"]
    assert by_type["Running"]["message"] == "up"
    assert by_type["Succeeded"]["lastTransitionTime"] == T0, "unchanged conditions keep their time"
    assert all(c["observedGeneration"] == 3 for c in _raw(conds))


def test_without_any_report_admission_is_unknown() -> None:
    phase, conds = child_conditions([], {}, generation=1, now=T0)
    assert phase == Phase.PENDING
    assert {c["type"]: c["status"] for c in _raw(conds)}["Admitted"] == "Unknown"


@pytest.mark.parametrize(
    ("status", "patchable"),
    [
        ({}, True),
        ({"conditions": [cond("Suspended")]}, True),
        ({"conditions": [cond("Created")]}, False),
        ({"startTime": T0}, False),
        ({"conditions": [cond("Running")]}, False),
        ({"conditions": [cond("Succeeded")]}, False),
    ],
)
def test_only_unstarted_jobs_may_change_shape(status: dict[str, Any], patchable: bool) -> None:
    assert can_patch_in_place(status) is patchable


def test_merge_patch_to_turns_old_into_new() -> None:
    old = {"a": 1, "b": {"c": 2, "d": 3}, "e": [1]}
    new = {"a": 1, "b": {"c": 4}, "e": [2], "f": "x"}
    assert merge_patch_to(old, new) == {"b": {"c": 4, "d": None}, "e": [2], "f": "x"}
    assert merge_patch_to(None, new) == new


def test_plan_document_drops_nulls_only() -> None:
    assert plan_document('{"a": null, "b": {"c": null, "d": 0}, "e": [{"f": null}]}') == {
        "b": {"d": 0},
        "e": [{}],
    }
