"""lifecycle/child_mirror.py and convergence.py: a child's status on its BTJ, and what the resync loop
reconciles for, without a cluster."""

from __future__ import annotations

from typing import Any

import pytest

from blackwell_operator.lifecycle.child_mirror import mirror, owner_reference, phase_event
from blackwell_operator.lifecycle.convergence import needs_reconcile, wants_child_back
from blackwell_operator.lifecycle.status_patch import status_patch
from blackwell_operator.lifecycle.writers import CHILD_WATCHER
from blackwell_operator.models.status import ConditionType, Phase

NOW = "2026-12-01T10:00:00Z"
T0 = "2026-12-01T09:00:00Z"
RECORDED = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "w", "uid": "c1"}


def _btj(uid: str = "b1", generation: int = 1, **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "w", "uid": uid, "generation": generation}, "spec": {}, "status": status}


def _child(uid: str = "c1", *conditions: str, owner: str = "b1") -> dict[str, Any]:
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {
            "name": "w",
            "uid": uid,
            "ownerReferences": [
                {"kind": "BlackwellTrainingJob", "name": "w", "uid": owner, "controller": True}
            ],
        },
        "status": {
            "conditions": [{"type": c, "status": "True", "lastTransitionTime": T0} for c in conditions]
        },
    }


def _condition(type_: str, status: str, reason: str) -> dict[str, Any]:
    return {"type": type_, "status": status, "reason": reason, "message": "", "lastTransitionTime": T0}


def test_a_phase_change_is_mirrored_with_one_event() -> None:
    result = mirror(_btj(phase="Pending", child=RECORDED), _child("c1", "Running"), going=False, now=NOW)
    assert result.change is not None and result.change.phase == Phase.RUNNING
    assert (result.before, result.after) == (Phase.PENDING, Phase.RUNNING)
    event = phase_event(result, _child("c1", "Running"))
    assert event is not None and (event.reason, event.warning) == ("Running", False)
    again = mirror(_btj(phase="Running", child=RECORDED), _child("c1", "Running"), going=False, now=NOW)
    assert phase_event(again, _child("c1", "Running")) is None  # no transition, no Event
    failed = mirror(_btj(phase="Running", child=RECORDED), _child("c1", "Failed"), going=False, now=NOW)
    event = phase_event(failed, _child("c1", "Failed"))
    assert event is not None and (event.reason, event.warning) == ("Failed", True)


def test_a_child_of_another_btj_or_child_changes_nothing() -> None:
    assert mirror(_btj(uid="b2"), _child(), going=False, now=NOW).change is None  # a predecessor's child
    other = {**RECORDED, "uid": "c0"}
    assert mirror(_btj(child=other), _child("c1", "Running"), going=False, now=NOW).change is None
    assert owner_reference({"metadata": {"ownerReferences": [{"kind": "Deployment", "uid": "x"}]}}) is None


def test_a_child_stopped_by_the_operator_does_not_speak_for_the_btj() -> None:
    permanent = {**_condition(ConditionType.FAILED, "True", "PermanentError")}
    btj = _btj(phase="Failed", child=RECORDED, conditions=[permanent])
    assert mirror(btj, _child("c1", "Restarting"), going=False, now=NOW).change is None


def test_a_child_seen_before_reconcile_recorded_it_is_named() -> None:
    result = mirror(_btj(phase="Pending"), _child("c1", "Running"), going=False, now=NOW)
    assert result.change is not None and result.change.child is not None
    assert result.change.child.uid == "c1"


def _deleted_report() -> dict[str, Any]:
    """A BTJ whose recorded child c1 the watcher saw deleted (re-creation under way)."""
    deleted = _condition(ConditionType.CHILD_CREATED, "False", "ChildDeleted")
    return _btj(phase="Running", observedGeneration=1, child=RECORDED, conditions=[deleted])


def _applied(btj: dict[str, Any], change: Any) -> dict[str, Any]:
    """The BTJ with a mirror's change written (the keys these tests look at)."""
    status = dict(btj["status"])
    if change.child is not None:
        status["child"] = change.child.model_dump(by_alias=True, exclude_none=True)
    if change.conditions is not None:
        status["conditions"] = [c.model_dump(by_alias=True, exclude_none=True) for c in change.conditions]
    if change.phase is not None:
        status["phase"] = change.phase.value
    return {**btj, "status": status}


def test_a_replacement_child_that_reports_before_reconcile_recorded_it_is_recorded() -> None:
    # The soak's stuck state: c2 re-created in place of the deleted c1 runs before reconcile writes status.
    # Ignored (the recorded uid is c1), reconcile would then write c2's creation-time phase (Pending) for
    # ever, no later event of c2 correcting it.
    result = mirror(_deleted_report(), _child("c2", "Running"), going=False, now=NOW)
    assert result.change is not None and result.change.phase == Phase.RUNNING
    assert result.change.child is not None and result.change.child.uid == "c2"
    assert result.change.conditions is not None
    assert not [c for c in result.change.conditions if c.type == ConditionType.CHILD_CREATED]
    after = _applied(_deleted_report(), result.change)
    assert not wants_child_back(after)  # the deletion report is over: nothing re-creates c2
    assert needs_reconcile(after) == "no child recorded"  # until reconcile says ChildCreated itself
    # c2's next phase is followed like a recorded child's; c1's late event still changes nothing.
    assert mirror(after, _child("c2", "Succeeded"), going=False, now=NOW).change is not None
    assert mirror(after, _child("c1", "Running"), going=False, now=NOW).change is None


def test_a_replacement_child_that_reports_first_drops_the_deleted_child_s_failure() -> None:
    # A permanent error failed the job and deleted c1; a spec change made c2, which reports (Pending) before
    # reconcile's status write. That write then sees c2 already recorded (not a new child) and would keep
    # c1's lastFailure for ever: the write that names c2 drops it.
    failure = {"pod": "w-worker-0", "container": "pytorch", "exitCode": 1, "message": "error: permanent"}
    btj = _deleted_report()
    btj["status"].update(phase="Failed", lastFailure=failure)
    result = mirror(btj, _child("c2"), going=False, now=NOW)
    assert result.change is not None and result.change.child is not None
    patch = status_patch(result.change, btj["status"], CHILD_WATCHER)
    assert "lastFailure" in patch and patch["lastFailure"] is None
    assert "permanent" not in patch["message"]
    # The recorded child's own phases keep its failure (the pod watcher's to change).
    recorded = _btj(phase="Restarting", child=RECORDED, lastFailure=failure)
    same = mirror(recorded, _child("c1", "Restarting"), going=False, now=NOW)
    assert same.change is not None and "lastFailure" not in status_patch(
        same.change, recorded["status"], CHILD_WATCHER
    )


def test_a_replacement_child_deleted_before_reconcile_recorded_it_is_named_deleted() -> None:
    result = mirror(_deleted_report(), _child("c2"), going=True, now=NOW)
    assert result.change is not None and result.change.child is not None
    assert result.change.child.uid == "c2"  # reconcile's write of c2 then keeps the report
    after = _applied(_deleted_report(), result.change)
    assert wants_child_back(after) and not result.finished


def test_a_replan_s_successor_that_finished_before_it_was_recorded_finishes_the_btj() -> None:
    # c1 ran out of memory and was replaced (the re-plan's record names c1); c2 finished and went before
    # reconcile recorded it. Its end is the job's (only c1's end was not): never run again.
    candidate = {
        "precision": "bf16",
        "precisionRecipe": "none",
        "activationCheckpointing": "none",
        "microBatchSize": 1,
        "gradientAccumulationSteps": 1,
        "sharding": "full",
        "shardDegree": 8,
        "replicateDegree": 1,
    }
    replan = {"at": T0, "generation": 1, "reason": "OutOfMemory", "failed": candidate}
    btj = _deleted_report()
    btj["status"]["planHistory"] = [{**replan, "replacement": candidate, "failedChildUid": "c1"}]
    result = mirror(btj, _child("c2", "Succeeded"), going=True, now=NOW)
    assert result.finished and result.change is not None and result.change.phase == Phase.SUCCEEDED
    assert result.change.child is not None and result.change.child.uid == "c2"


@pytest.mark.parametrize(
    ("phase", "child_conditions", "finished", "words"),
    [
        ("Running", (), False, "re-creating it"),
        ("Running", ("Succeeded",), True, "the job had finished"),  # its own final status finishes it
        ("Succeeded", (), True, "the job had finished"),
    ],
)
def test_a_deletion_is_reported_and_says_whether_the_child_comes_back(
    phase: str, child_conditions: tuple[str, ...], finished: bool, words: str
) -> None:
    result = mirror(_btj(phase=phase, child=RECORDED), _child("c1", *child_conditions), going=True, now=NOW)
    assert result.change is not None and result.finished is finished
    assert result.change.message is not None and words in result.change.message
    assert result.change.conditions is not None
    (created,) = [c for c in result.change.conditions if c.type == ConditionType.CHILD_CREATED]
    assert (created.status, created.reason) == ("False", "ChildDeleted")


def test_convergence_says_why_a_btj_is_reconciled_again() -> None:
    created = _condition(ConditionType.CHILD_CREATED, "True", "Created")
    assert needs_reconcile(_btj(observedGeneration=1, conditions=[created], child=RECORDED)) is None
    assert needs_reconcile(_btj(generation=2, observedGeneration=1)) == "its spec has not been reconciled"
    refused = _condition(ConditionType.CHILD_CREATED, "False", "CreateRefused")
    assert "refused its child (CreateRefused)" in str(
        needs_reconcile(_btj(observedGeneration=1, conditions=[refused]))
    )
    assert needs_reconcile(_btj(observedGeneration=1)) == "no child recorded"
    assert needs_reconcile(_btj(observedGeneration=1, phase="Invalid")) is None
    deleted = _condition(ConditionType.CHILD_CREATED, "False", "ChildDeleted")
    gone = _btj(observedGeneration=1, phase="Running", child=RECORDED, conditions=[deleted])
    assert wants_child_back(gone) and needs_reconcile(gone) == "its child was deleted before the job finished"
    assert not wants_child_back({**gone, "status": {**gone["status"], "phase": "Succeeded"}})
