"""lifecycle/outcome.py: one reconcile pass's outcome as a status change and its Events, without a cluster."""

from __future__ import annotations

from dataclasses import replace
from functools import cache
from typing import Any

import pytest

from blackwell_operator.lifecycle import outcome as outcomes
from blackwell_operator.lifecycle.child_apply import Notice
from blackwell_operator.lifecycle.child_record import CHILD_DELETED, runs_again
from blackwell_operator.lifecycle.conditions import ConditionChange
from blackwell_operator.lifecycle.outcome import PassOutcome, SeenChild, events_to_post, status_change
from blackwell_operator.lifecycle.status_read import read_status
from blackwell_operator.models.spec import Backend
from blackwell_operator.models.status import BlackwellTrainingJobStatus, ConditionType, Phase
from blackwell_operator.planner import plan_job
from blackwell_operator.render.kinds import JOB_KINDS
from blackwell_trainer.plan.config import Plan
from tests.support.specs import make_spec

NOW = "2026-12-01T10:00:00Z"
BEFORE = "2026-12-01T09:00:00Z"
KIND = JOB_KINDS[Backend.PYTORCH_JOB]
RUNNING_CHILD = {"conditions": [{"type": "Running", "status": "True", "lastTransitionTime": BEFORE}]}


@cache
def _plan() -> Plan:
    return plan_job(make_spec())


def _stored(**status: Any) -> BlackwellTrainingJobStatus:
    return read_status(status).status


def _condition(type_: str, status: str, reason: str, message: str, generation: int = 1) -> dict[str, Any]:
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": BEFORE,
        "observedGeneration": generation,
    }


def _child(uid: str, status: dict[str, Any] | None = None) -> SeenChild:
    obj: dict[str, Any] = {"metadata": {"name": "w", "uid": uid}}
    if status is not None:
        obj["status"] = status
    return SeenChild(KIND, obj, "w-plan")


def _recorded(uid: str) -> dict[str, Any]:
    return {"apiVersion": KIND.api_version, "kind": KIND.kind, "name": "w", "uid": uid}


def test_an_event_is_posted_once_per_cause() -> None:
    refused = ConditionChange(ConditionType.SPEC_APPLIED, "False", "RunningJobImmutable", "cannot change")
    notice = Notice("RunningJobImmutable", "cannot change", warning=True, once=ConditionType.SPEC_APPLIED)
    created = Notice("Created", "Created PyTorchJob w")  # an action: each time it is made
    outcome = PassOutcome(1).adding(refused, events=(notice, created))
    said = _condition(ConditionType.SPEC_APPLIED, "False", "RunningJobImmutable", "cannot change")
    assert events_to_post(outcome, _stored()) == (notice, created)
    assert events_to_post(outcome, _stored(conditions=[said])) == (created,)
    # The same words for another generation are a new cause; other words for this one, too.
    assert events_to_post(replace(outcome, generation=2), _stored(conditions=[said])) == (notice, created)
    other = {**said, "message": "cannot change either"}
    assert events_to_post(outcome, _stored(conditions=[other])) == (notice, created)


def test_an_invalid_spec_leaves_a_running_job_and_says_why() -> None:
    invalid = outcomes.invalid(2, "InvalidSpec", "spec.model.preset: unknown")
    assert invalid.error == "InvalidSpec"
    running = _stored(
        phase="Running", child=_recorded("u1"), plan=_plan().model_dump(mode="json", by_alias=True)
    )
    change = status_change(invalid, running, NOW)
    assert "phase" not in change.model_fields_set and "plan" not in change.model_fields_set
    assert change.conditions is not None
    by_type = {c.type: c for c in change.conditions}
    assert (
        by_type[ConditionType.PLANNED].reason == by_type[ConditionType.SPEC_APPLIED].reason == "InvalidSpec"
    )
    # No job: the BTJ is Invalid, its plan and what verified it are gone.
    verified = _condition(ConditionType.PLAN_VERIFIED, "True", "Measured", "all measured")
    fresh = status_change(invalid, _stored(conditions=[verified]), NOW)
    assert fresh.phase == Phase.INVALID and fresh.plan is None and "plan" in fresh.model_fields_set
    assert fresh.message == fresh.headline == "spec.model.preset: unknown"
    assert fresh.conditions is not None
    assert [c.type for c in fresh.conditions] == [ConditionType.PLANNED]


def _planned() -> PassOutcome:
    return outcomes.planned(_plan(), 1, replanned=False, nodes=None, aws=None, needed=1, queue_name=None)


def test_a_child_seen_first_gives_the_phase_and_later_the_watcher_keeps_it() -> None:
    seen = replace(_planned(), child=_child("u1", RUNNING_CHILD))
    first = status_change(seen, _stored(), NOW)
    assert first.phase == Phase.RUNNING and first.child is not None and first.child.uid == "u1"
    assert first.headline is not None and first.headline.startswith("PyTorchJob w is Running")
    known = status_change(seen, _stored(phase="Restarting", child=_recorded("u1")), NOW)
    assert "phase" not in known.model_fields_set  # the child watcher's newer phase stays


def test_a_new_child_drops_the_previous_child_s_failure() -> None:
    failure = {"pod": "w-worker-0", "container": "pytorch", "exitCode": 1}
    stored = _stored(phase="Failed", child=_recorded("old"), lastFailure=failure)
    change = status_change(replace(_planned(), child=_child("new")), stored, NOW)
    assert (
        "lastFailure" in change.model_dump(by_alias=True, exclude_unset=True) and change.last_failure is None
    )
    same = status_change(replace(_planned(), child=_child("old")), stored, NOW)
    assert "last_failure" not in same.model_fields_set


def test_a_child_the_watcher_saw_deleted_keeps_that_report() -> None:
    gone = _condition(ConditionType.CHILD_CREATED, "False", "ChildDeleted", "PyTorchJob w was deleted.")
    stored = _stored(phase="Running", child=_recorded("u1"), conditions=[gone])
    created = ConditionChange(ConditionType.CHILD_CREATED, "True", "Exists", "PyTorchJob w")
    change = status_change(replace(_planned(), child=_child("u1")).adding(created), stored, NOW)
    assert change.conditions is not None
    (child_created,) = [c for c in change.conditions if c.type == ConditionType.CHILD_CREATED]
    assert child_created.reason == "ChildDeleted"


@pytest.mark.parametrize("write_plan", [True, False])
def test_a_plan_that_does_not_describe_the_job_is_not_written(write_plan: bool) -> None:
    stored_plan = _plan().model_copy(update={"model_name": "what-runs"})
    stored = _stored(phase="Running", plan=stored_plan.model_dump(mode="json", by_alias=True))
    change = status_change(replace(_planned(), write_plan=write_plan), stored, NOW)
    assert ("plan" in change.model_fields_set) is write_plan
    # Without a stored plan the new one is written either way: the status must say what was planned.
    assert (
        "plan" in status_change(replace(_planned(), write_plan=write_plan), _stored(), NOW).model_fields_set
    )


def test_the_stopping_exits_say_why_once_and_count_the_error() -> None:
    waiting = outcomes.no_job_api(_planned(), "no job API is served")
    assert waiting.phase == Phase.PENDING and waiting.requeue is not None
    assert waiting.requeue.after_s == outcomes.NO_JOB_API_RETRY_S
    conflict = outcomes.name_conflict(replace(_planned(), write_plan=False), "a PyTorchJob named w exists")
    assert (conflict.phase, conflict.error, conflict.write_plan) == (Phase.FAILED, "ChildNameConflict", True)
    patch = ConditionChange(ConditionType.SPEC_APPLIED, "False", "PatchRefused", "refused")
    refused = outcomes.refused(_planned(), patch)
    assert (refused.phase, refused.write_plan, refused.error) == (None, False, "PatchRefused")
    create = ConditionChange(ConditionType.CHILD_CREATED, "False", "CreateRefused", "refused")
    assert outcomes.refused(_planned(), create).phase == Phase.PENDING
    for stopped, cause in ((waiting, "NoJobApi"), (conflict, "ChildNameConflict"), (refused, "PatchRefused")):
        (warning,) = [n for n in stopped.events if n.reason == cause]
        assert warning.warning and warning.once is not None


def test_a_finished_child_s_deletion_is_stamped_with_the_generation_it_is_written_at() -> None:
    # A pass of generation 1 records the finished child gone while the spec was edited to 2: the edit came
    # before the record, so it must not read as one made after it (child_record.runs_again).
    gone = ConditionChange(ConditionType.CHILD_CREATED, "False", CHILD_DELETED, "not re-created")
    outcome = PassOutcome(1).adding(gone)
    stored = _stored(phase="Succeeded", child=_recorded("u1"))
    change = status_change(outcome, stored, NOW, current_generation=2)
    written = {**stored.model_dump(by_alias=True, exclude_none=True), "conditions": change.conditions}
    assert not runs_again(2, written)
    # A record already stored (the child watcher's) keeps its generation: an edit after it still runs.
    recorded = _condition(ConditionType.CHILD_CREATED, "False", CHILD_DELETED, "not re-created", generation=1)
    before = _stored(phase="Succeeded", child=_recorded("u1"), conditions=[recorded])
    again = status_change(outcome, before, NOW, current_generation=2)
    assert runs_again(2, {"phase": "Succeeded", "conditions": again.conditions})


@pytest.mark.parametrize(
    ("bases", "words"),
    [
        (["measured", "measured"], "; predicted 1"),
        (["measured", "modelled"], "; predicted (modelled, not measured) 1"),
        (["modelled", "unverified"], "; predicted (modelled, trainer path unverified) 1"),
        ([], "; predicted (basis unknown: an older planner's plan) 1"),
    ],
)
def test_the_summary_says_what_the_prediction_rests_on(bases: list[str], words: str) -> None:
    # Issue 39: Planned's message and the Created Event are pasted into capacity requests.
    from blackwell_trainer.plan.config import Basis, ChoiceProvenance

    provenance = [ChoiceProvenance(choice=f"c{i}", value="v", basis=Basis(b)) for i, b in enumerate(bases)]
    plan = _plan().model_copy(update={"provenance": provenance}, deep=True)
    plan.predicted.tokens_per_second_per_gpu = 1234.0
    assert words in outcomes.plan_summary(plan)
