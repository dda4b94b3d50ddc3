"""The one status serializer: unset vs None, conditions, the plan's merge patch, owned keys, tolerant reads.

Pure tests of lifecycle.status_patch, lifecycle.status_read and lifecycle.writers, the ownership table in
docs/operator.md checked against the declarations, and the real operator under KopfRunner on a BTJ whose
stored status the models cannot read.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import pytest

from blackwell_operator.lifecycle.conditions import set_condition
from blackwell_operator.lifecycle.failures import PERMANENT_ERROR_REASON, failure_changes, worker_failure
from blackwell_operator.lifecycle.message import (
    FAILURE_SEPARATOR,
    set_message,
    status_message,
    summary_message,
)
from blackwell_operator.lifecycle.patch import apply_merge_patch, plan_document
from blackwell_operator.lifecycle.status_patch import OwnershipError, changes_nothing, status_patch
from blackwell_operator.lifecycle.status_read import read_status
from blackwell_operator.lifecycle.writers import (
    CHILD_WATCHER,
    MEASURE_LOOP,
    POD_WATCHER,
    RECONCILE,
    WRITERS,
)
from blackwell_operator.models.spec import BlackwellTrainingJobSpec
from blackwell_operator.models.status import (
    BlackwellTrainingJobStatus,
    ConditionType,
    JobProgress,
    MeasuredThroughput,
    Phase,
    PlanChange,
    StatusChange,
    WorkerFailure,
)
from blackwell_operator.planner import plan_job
from blackwell_trainer.plan.config import Plan
from tests.operator.harness import Cluster, btj, running_operator, wait_for
from tests.support.oom import oom_message
from tests.support.pods import T1, container, pod, pod_status, terminated, verified

NOW = "2026-12-01T12:00:00Z"
LATER = "2026-12-01T12:05:00Z"
ROOT = Path(__file__).resolve().parents[2]


def _plan(**tuning: Any) -> Plan:
    return plan_job(BlackwellTrainingJobSpec.model_validate(btj("w", tuning=tuning)["spec"]))


# ----- the serializer --------------------------------------------------------------------------------------


def test_unset_leaves_a_key_alone_and_none_deletes_it() -> None:
    stored = {"phase": "Running", "message": "PyTorchJob w is Running", "precision": "bf16"}
    assert status_patch(StatusChange(), stored, RECONCILE) == {}
    patch = status_patch(StatusChange(message="m", headline="m", precision=None), stored, RECONCILE)
    assert patch == {"message": "m", "headline": "m", "precision": None}
    assert apply_merge_patch(stored, patch) == {"phase": "Running", "message": "m", "headline": "m"}
    phase = status_patch(StatusChange(phase=Phase.RESTARTING), stored, RECONCILE)
    assert phase == {"phase": "Restarting"}, "enums as their wire value"


def test_conditions_are_the_whole_list_with_the_transition_rule() -> None:
    conds = set_condition([], ConditionType.PLANNED, "True", "Planned", "p", generation=1, now=NOW)
    patch = status_patch(StatusChange(conditions=conds), {}, RECONCILE)
    assert patch == {
        "conditions": [
            {
                "type": "Planned",
                "status": "True",
                "reason": "Planned",
                "message": "p",
                "lastTransitionTime": NOW,
                "observedGeneration": 1,
            }
        ]
    }
    stored = {"conditions": patch["conditions"]}
    typed = read_status(stored).status.conditions
    same = set_condition(typed, ConditionType.PLANNED, "True", "Replanned", "q", generation=2, now=LATER)
    flipped = set_condition(
        typed, ConditionType.PLANNED, "False", "InvalidSpec", "x", generation=2, now=LATER
    )
    kept = status_patch(StatusChange(conditions=same), stored, RECONCILE)["conditions"][0]
    assert kept["lastTransitionTime"] == NOW and kept["reason"] == "Replanned"
    moved = status_patch(StatusChange(conditions=flipped), stored, RECONCILE)["conditions"][0]
    assert moved["lastTransitionTime"] == LATER
    without = set_condition([], "Running", "False", "Pending", "p", generation=None, now=NOW)
    assert (
        "observedGeneration"
        not in status_patch(StatusChange(conditions=without), {}, RECONCILE)["conditions"][0]
    )


def test_the_plan_is_sent_as_the_merge_patch_from_the_stored_one() -> None:
    plan, other = _plan(), _plan(microBatchSize=1)
    document = plan_document(plan.to_json())
    first = status_patch(StatusChange(plan=plan), {}, RECONCILE)
    assert first == {"plan": document}
    assert status_patch(StatusChange(plan=plan), {"plan": document}, RECONCILE) == {}, "equal: not sent"
    diff = status_patch(StatusChange(plan=other), {"plan": document}, RECONCILE)["plan"]
    assert diff != plan_document(other.to_json()), "only what changed"
    assert apply_merge_patch(document, diff) == plan_document(other.to_json())
    assert status_patch(StatusChange(plan=None), {"plan": document}, RECONCILE) == {"plan": None}


def test_an_object_replaces_the_stored_one_whole() -> None:
    stored = {
        "progress": {"step": 10, "totalSteps": 100, "percent": 10.0, "eta": NOW, "remaining": "3m"},
        "measured": {"tokensPerSecondPerGpu": 10.0, "modelFlopsUtilization": 0.4, "observedAt": NOW},
    }
    change = StatusChange(
        progress=JobProgress(step=20, total_steps=100, percent=20.0),
        measured=MeasuredThroughput(tokens_per_second_per_gpu=12.0, observed_at=LATER),
    )
    patch = status_patch(change, stored, MEASURE_LOOP)
    assert patch == {
        "progress": {"step": 20, "totalSteps": 100, "percent": 20.0, "eta": None, "remaining": None},
        "measured": {"tokensPerSecondPerGpu": 12.0, "observedAt": LATER, "modelFlopsUtilization": None},
    }
    assert apply_merge_patch(stored, patch) == {
        "progress": {"step": 20, "totalSteps": 100, "percent": 20.0},
        "measured": {"tokensPerSecondPerGpu": 12.0, "observedAt": LATER},
    }
    assert changes_nothing(status_patch(change, apply_merge_patch(stored, patch), MEASURE_LOOP), {**patch})


def test_list_entries_carry_no_nulls() -> None:
    plan = _plan()
    entry = PlanChange(at=NOW, generation=1, reason="OutOfMemory", failed=plan.chosen, failed_child_uid=None)
    (sent,) = status_patch(StatusChange(plan_history=[entry]), {}, POD_WATCHER)["planHistory"]
    assert "failedChildUid" not in sent and "replacement" not in sent
    assert PlanChange.model_validate(sent) == entry


def test_nothing_to_write_is_told() -> None:
    stored = {"phase": "Running", "message": "m"}
    assert changes_nothing({}, stored)
    assert changes_nothing({"phase": "Running", "headline": None}, stored)
    assert not changes_nothing({"phase": "Restarting"}, stored)
    assert not changes_nothing({"message": None}, stored)


def test_the_change_model_has_every_status_key() -> None:
    status_keys = {(f.alias or n) for n, f in BlackwellTrainingJobStatus.model_fields.items()}
    change_keys = {(f.alias or n) for n, f in StatusChange.model_fields.items()}
    assert status_keys == change_keys
    assert all(f.default is None for f in StatusChange.model_fields.values()), "all optional"


# ----- ownership -------------------------------------------------------------------------------------------


def test_a_writer_may_not_change_a_key_it_does_not_own() -> None:
    with pytest.raises(OwnershipError, match=r"the measure loop changed phase, which it does not own"):
        status_patch(StatusChange(phase=Phase.FAILED), {}, MEASURE_LOOP)
    with pytest.raises(OwnershipError, match=r"the child watcher changed backend"):
        status_patch(StatusChange(backend="PyTorchJob"), {}, CHILD_WATCHER)
    with pytest.raises(OwnershipError, match=r"observedGeneration"):
        status_patch(StatusChange(observed_generation=2), {}, POD_WATCHER)


def test_message_and_headline_are_written_together() -> None:
    with pytest.raises(OwnershipError, match=r"one of message and headline without the other"):
        status_patch(StatusChange(message="m"), {}, RECONCILE)
    with pytest.raises(OwnershipError, match=r"set_message"):
        status_patch(StatusChange(headline="h"), {}, CHILD_WATCHER)
    change = set_message(StatusChange(phase=Phase.FAILED), "Failed: x", Phase.FAILED)
    assert status_patch(change, {}, POD_WATCHER) == {
        "phase": "Failed",
        "headline": "Failed: x",
        "message": "Failed: x",
    }


def test_a_writer_may_pass_through_conditions_it_does_not_own_but_not_change_them() -> None:
    created = set_condition([], ConditionType.CHILD_CREATED, "True", "Created", "made", generation=1, now=NOW)
    stored = {"conditions": status_patch(StatusChange(conditions=created), {}, RECONCILE)["conditions"]}
    typed = read_status(stored).status.conditions
    failed = set_condition(
        typed, ConditionType.FAILED, "True", PERMANENT_ERROR_REASON, "x", generation=1, now=NOW
    )
    assert len(status_patch(StatusChange(conditions=failed), stored, POD_WATCHER)["conditions"]) == 2
    deleted = set_condition(
        typed, ConditionType.CHILD_CREATED, "False", "ChildDeleted", "g", generation=1, now=NOW
    )
    with pytest.raises(OwnershipError, match=r"condition ChildCreated"):
        status_patch(StatusChange(conditions=deleted), stored, POD_WATCHER)
    with pytest.raises(OwnershipError, match=r"condition ChildCreated"):
        status_patch(StatusChange(conditions=[]), stored, MEASURE_LOOP)


def _table(text: str) -> dict[str, tuple[set[str], set[str]]]:
    """docs/operator.md's ownership table: writer -> (keys, condition types)."""
    section = text.split("## Who writes which status key", 1)[1].split("\n## ", 1)[0]
    owned: dict[str, tuple[set[str], set[str]]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not cells[0].startswith(("`", "condition")):
            continue
        names = set(re.findall(r"`([A-Za-z]+)`", cells[0]))
        for writer in (w.strip() for w in cells[1].split(",")):
            keys, conditions = owned.setdefault(writer, (set(), set()))
            (conditions if cells[0].startswith("condition") else keys).update(names)
    return owned


def test_the_ownership_table_in_the_docs_matches_the_declarations() -> None:
    documented = _table((ROOT / "docs" / "operator.md").read_text())
    declared = {w.name: (set(w.keys), {str(c) for c in w.conditions}) for w in WRITERS}
    assert documented == declared
    keys = set().union(*(w.keys for w in WRITERS))
    status_keys = {(f.alias or n) for n, f in BlackwellTrainingJobStatus.model_fields.items()} - {
        "conditions"
    }
    assert keys == status_keys, "every status key has a writer, and every owned key is a status key"
    assert set().union(*(w.conditions for w in WRITERS)) == set(ConditionType), "every condition type"


# ----- the tolerant read -----------------------------------------------------------------------------------

UNREADABLE = {
    "phase": "Running",
    "message": "PyTorchJob w is Running",
    "oldKey": 1,  # a key of an older CRD
    "plan": {"modelName": 7},
    "conditions": [
        {"type": "Legacy", "status": "Maybe", "reason": "x", "lastTransitionTime": NOW},
        {
            "type": "Running",
            "status": "True",
            "reason": "Running",
            "message": "up",
            "lastTransitionTime": NOW,
        },
    ],
    "planHistory": [{"at": NOW}],
}


def test_an_unreadable_status_is_read_for_what_validates() -> None:
    read = read_status(UNREADABLE)
    assert read.status.phase == Phase.RUNNING and read.status.message == "PyTorchJob w is Running"
    assert read.status.plan is None and read.status.plan_history == []
    assert [c.type for c in read.status.conditions] == ["Running"]
    assert [c["type"] for c in read.unreadable_conditions] == ["Legacy"]
    assert {p.split(":")[0] for p in read.problems} == {
        "status.oldKey",
        "status.plan",
        "status.conditions[Legacy]",
        "status.planHistory[0]",
    }
    assert read_status(None).status == BlackwellTrainingJobStatus()
    assert read_status({"phase": "Running"}).problems == ()


def test_the_serializer_keeps_an_unreadable_condition_it_was_not_asked_to_change() -> None:
    conds = read_status(UNREADABLE).status.conditions
    changed = set_condition(
        conds, ConditionType.RUNNING, "False", "Restarting", "again", generation=1, now=LATER
    )
    sent = status_patch(StatusChange(conditions=changed), UNREADABLE, CHILD_WATCHER)["conditions"]
    assert [c["type"] for c in sent] == ["Running", "Legacy"]
    assert sent[1] == UNREADABLE["conditions"][0], "kept as it was"


def test_an_out_of_memory_run_with_an_unreadable_plan_stops_instead_of_crashing() -> None:
    message = oom_message(_plan())
    ended = container(state={"terminated": terminated(1, "Error", T1, message)})
    worker = {**pod("w-worker-0"), "status": pod_status(ended)}
    body = btj("w")
    body["metadata"].update(uid="u-btj", generation=1, creationTimestamp="2026-11-30T07:00:00Z")
    body["status"] = {
        "phase": "Running",
        "child": {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "w", "uid": "u-job"},
        "plan": {"modelName": 7},
    }
    failure = worker_failure(worker)
    assert failure is not None and failure.get("outOfMemory")
    change, new = failure_changes(body, worker, failure, now=NOW, found=verified(body))
    assert change is not None and new
    patch = status_patch(change, body["status"], POD_WATCHER)
    assert patch["phase"] == "Failed" and "plan" not in patch
    assert patch["message"].startswith("Failed: a worker ended on a permanent error")


# ----- status.message --------------------------------------------------------------------------------------


def test_the_message_is_the_headline_and_the_failure_that_explains_it() -> None:
    headline = summary_message(Phase.RESTARTING, "PyTorchJob", "w", "restarting pods")
    assert headline == "PyTorchJob w is Restarting: restarting pods"
    assert summary_message(Phase.PENDING, None, None) == "Pending"
    failure = WorkerFailure(
        pod="w-worker-0", container="pytorch", exit_code=1, reason="Error", message="boom"
    )
    assert status_message(headline, "Restarting", failure) == (
        f"{headline}{FAILURE_SEPARATOR}pod w-worker-0 exit 1 (Error): boom"
    )
    assert status_message(headline, "Running", failure) == headline
    assert status_message(headline, "Failed", None) == headline


# ----- the real operator -----------------------------------------------------------------------------------


@pytest.mark.integration
async def test_a_btj_with_an_unreadable_status_is_still_mirrored_and_logged_once(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    # Kopf's per-object logger, which the watchers log with (`btj demo` raises the `kopf` level in-process).
    caplog.set_level(logging.WARNING, logger="kopf.objects")
    async with running_operator(cluster):
        await cluster.apply(btj("w"))
        await wait_for(lambda: cluster.job("w"), what="the PyTorchJob")
        await wait_for(lambda: cluster.condition("w", "ChildCreated"), what="ChildCreated")
        legacy = {"type": "Legacy", "status": "Maybe", "reason": "x", "lastTransitionTime": NOW}
        conditions = [*cluster.status("w")["conditions"], legacy]
        await cluster.set_btj_status("w", {"conditions": conditions, "planHistory": [{"at": NOW}]})
        running = {
            "conditions": [{"type": "Running", "status": "True", "reason": "Running", "message": "up"}]
        }
        await cluster.set_child_status("w", running)
        await wait_for(lambda: cluster.status("w").get("phase") == "Running", what="phase Running")
        await cluster.set_child_status(
            "w", {"conditions": [{**running["conditions"][0], "message": "still up"}]}
        )
        await wait_for(lambda: "still up" in cluster.status("w").get("message", ""), what="the second mirror")
        status = cluster.status("w")
        assert legacy in status["conditions"], "the unreadable condition is kept"
        assert status["message"] == "PyTorchJob w is Running: still up"
    said = [r.getMessage() for r in caplog.records if "Unreadable status" in r.getMessage()]
    assert any("status.conditions[Legacy]" in line for line in said)
    assert sum("status.conditions[Legacy]" in line for line in said) == 1, "once per BTJ and problem"


@pytest.mark.integration
async def test_a_stored_plan_that_does_not_validate_is_planned_anew_not_retried_for_ever(
    cluster: Cluster,
) -> None:
    # An older operator's (or a hand's) status.plan: its cluster correction no longer reads. The re-create
    # after a hand deletion, in the same generation, must plan anew instead of failing every pass.
    async with running_operator(cluster):
        await cluster.apply(btj("w"))
        await wait_for(lambda: cluster.condition("w", "ChildCreated"), what="ChildCreated")
        first = cluster.status("w")["child"]["uid"]
        broken = {"clusterCorrection": {"instanceType": "ml.p6-b200.48xlarge", "tokensFactor": "fast"}}
        await cluster.set_btj_status("w", {"plan": broken})
        await cluster.delete_child("w")
        await wait_for(
            lambda: (
                cluster.status("w")["child"]["uid"] != first
                and (cluster.condition("w", "ChildCreated") or {}).get("status") == "True"
            ),
            what="the re-created child recorded",
        )
        assert Plan.model_validate(cluster.status("w")["plan"]).cluster_correction is None
