"""Unit tests of the child decision (lifecycle/child_apply.py): each outcome from what a pass read, no API."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import pytest

from blackwell_operator.lifecycle.child_apply import (
    APPLIED,
    CannotChange,
    Create,
    Creation,
    Effects,
    FinishedChildGone,
    NameConflict,
    Notice,
    Outcome,
    PatchInPlace,
    PreviousDeleting,
    UpToDate,
    Wanted,
    decide,
    label_patch,
    refusal,
    resume_note,
    supporting_patch,
)
from blackwell_operator.lifecycle.child_record import FINAL_STATUS_FINALIZER, spec_changed
from blackwell_operator.lifecycle.conditions import ConditionChange
from blackwell_operator.models.spec import Backend
from blackwell_operator.models.status import ConditionType
from blackwell_operator.render.kinds import JOB_KINDS, ChildKind
from blackwell_operator.render.labels import PROPAGATED_ANNOTATION, RENDER_HASH_ANNOTATION

OWNER, OTHER, OLD, NEW = "btj-uid", "someone-else", "old-child-uid", "new-child-uid"
PYTORCH, TRAINJOB = JOB_KINDS[Backend.PYTORCH_JOB], JOB_KINDS[Backend.TRAIN_JOB]
SUMMARY = "llama on 2x8 B200: bf16, micro-batch 2"
NOTE = resume_note("s3://bucket/ckpt")
T0 = "2026-01-01T00:00:00Z"


def rendered(kind: ChildKind, digest: str = "h1", trainer: int = 2) -> dict[str, Any]:
    """A rendered job as the renderer stamps it (hash annotation, labels, the finalizer added)."""
    return {
        "apiVersion": kind.api_version,
        "kind": kind.kind,
        "metadata": {
            "name": "llama",
            "namespace": "ml",
            "labels": {"app.kubernetes.io/name": "blackwell-trainer"},
            "annotations": {RENDER_HASH_ANNOTATION: digest},
            "finalizers": [FINAL_STATUS_FINALIZER],
            "ownerReferences": [{"uid": OWNER}],
        },
        "spec": {"runtimeRef": {"name": "llama"}, "trainer": {"numNodes": trainer}},
    }


def in_cluster(
    job: dict[str, Any],
    *,
    owner: str = OWNER,
    held: bool = True,
    deleting: bool = False,
    status: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """`job` as the API server has it: a uid, a resourceVersion, maybe Terminating, maybe a status."""
    found = copy.deepcopy(job)
    meta = found["metadata"]
    meta.update(uid=OLD, resourceVersion="7", ownerReferences=[{"uid": owner}])
    meta["finalizers"] = [FINAL_STATUS_FINALIZER] if held else []
    if deleting:
        meta["deletionTimestamp"] = T0
    if status is not None:
        found["status"] = status
    return found


def wanted(kind: ChildKind = PYTORCH, **job: Any) -> Wanted:
    return Wanted(
        kind=kind,
        job=rendered(kind, **job),
        config_map="llama-plan",
        owner_uid=OWNER,
        generation=2,
        plan_summary=SUMMARY,
        resume_note=NOTE,
    )


def child_created(status: str, reason: str, generation: int | None = None) -> dict[str, Any]:
    cond = {
        "type": ConditionType.CHILD_CREATED,
        "status": status,
        "reason": reason,
        "message": "",
        "lastTransitionTime": T0,
    }
    return cond if generation is None else {**cond, "observedGeneration": generation}


def btj_status(
    phase: str = "Running", generation: int | None = 2, deleted: bool = False, **more: Any
) -> dict[str, Any]:
    """A BTJ's status that records child OLD."""
    child = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "llama", "uid": OLD}
    status: dict[str, Any] = {"phase": phase, "child": child}
    if generation is not None:
        status["observedGeneration"] = generation
    status["conditions"] = [
        child_created("False", "ChildDeleted") if deleted else child_created("True", "Exists")
    ]
    return {**status, **more}


RUNNING = {"conditions": [{"type": "Running", "status": "True"}], "startTime": T0}
SUCCEEDED = {"conditions": [{"type": "Succeeded", "status": "True"}], "startTime": T0}
SUSPENDED = {"conditions": [{"type": "Suspended", "status": "True"}]}
# A valid configuration (the status is read as the models read it: an invalid entry is left out).
CANDIDATE = {
    "precision": "bf16",
    "precisionRecipe": "none",
    "activationCheckpointing": "none",
    "microBatchSize": 1,
    "gradientAccumulationSteps": 1,
    "sharding": "full",
    "shardDegree": 8,
    "replicateDegree": 1,
}
OOM_REPLAN = [
    {
        "at": T0,
        "generation": 2,
        "reason": "OutOfMemory",
        "failed": CANDIDATE,
        "replacement": CANDIDATE,
        "failedChildUid": OLD,
    }
]
FOUND = ConditionChange(
    ConditionType.CHILD_CREATED, "True", "Exists", "PyTorchJob llama and ConfigMap llama-plan"
)
FOUND_TRAINJOB = ConditionChange(
    ConditionType.CHILD_CREATED, "True", "Exists", "TrainJob llama and ConfigMap llama-plan"
)
NOT_RECREATED = "PyTorchJob llama was deleted; the job had finished, so it is not re-created."
SHAPE = "its shape cannot change in place. Fix: delete and re-create the BlackwellTrainingJob (it resumes "
SHAPE += "from its checkpoint) to apply this spec"


def cannot(kind: str, phase: str, reason: str, *, hold: bool = False) -> CannotChange:
    message = f"{kind} llama is {phase}; {SHAPE}"
    found = FOUND_TRAINJOB if kind == "TrainJob" else FOUND
    return CannotChange(
        hold,
        found,
        reason=reason,
        message=message,
        effects=Effects(
            (ConditionChange(ConditionType.SPEC_APPLIED, "False", reason, message),),
            (Notice(reason, message, warning=True, once=ConditionType.SPEC_APPLIED),),
            write_plan=False,
        ),
    )


PATCHED = Effects(
    (
        ConditionChange(
            ConditionType.SPEC_APPLIED, "True", "Patched", "The job had not started; it was updated in place."
        ),
    ),
    (Notice("Updated", "Updated PyTorchJob llama to the new plan (it had not started)"),),
)
TRAINJOB_PATCHED = Effects(
    PATCHED.conditions, (Notice("Updated", "Updated TrainJob llama to the new plan (it had not started)"),)
)


def metadata_patch(digest: str) -> dict[str, Any]:
    return {
        "labels": {"app.kubernetes.io/name": "blackwell-trainer"},
        "annotations": {RENDER_HASH_ANNOTATION: digest},
    }


CASES: list[tuple[str, Wanted, dict[str, Any] | None, dict[str, Any], Outcome]] = [
    (
        "a child of another owner under the name",
        wanted(),
        in_cluster(rendered(PYTORCH), owner=OTHER),
        btj_status(),
        NameConflict(
            "a PyTorchJob named llama exists and is not owned by this BlackwellTrainingJob. "
            "Fix: delete it, or rename the BlackwellTrainingJob"
        ),
    ),
    (
        "a child of another owner, Terminating: still a conflict, never released",
        wanted(),
        in_cluster(rendered(PYTORCH), owner=OTHER, deleting=True),
        btj_status(deleted=True),
        NameConflict(
            "a PyTorchJob named llama exists and is not owned by this BlackwellTrainingJob. "
            "Fix: delete it, or rename the BlackwellTrainingJob"
        ),
    ),
    (
        "the previous child Terminating, its deletion recorded: the missing release is made",
        wanted(),
        in_cluster(rendered(PYTORCH), deleting=True),
        btj_status(deleted=True),
        PreviousDeleting(release=True, message="the previous PyTorchJob llama is still being deleted"),
    ),
    (
        "the previous child Terminating, its deletion not recorded yet: the watcher's to release",
        wanted(),
        in_cluster(rendered(PYTORCH), deleting=True),
        btj_status(),
        PreviousDeleting(release=False, message="the previous PyTorchJob llama is still being deleted"),
    ),
    (
        "the previous child Terminating, the BTJ finished: its end is recorded, release it",
        wanted(),
        in_cluster(rendered(PYTORCH), deleting=True),
        btj_status(phase="Succeeded"),
        PreviousDeleting(release=True, message="the previous PyTorchJob llama is still being deleted"),
    ),
    (
        "the previous child Terminating, recorded, without the finalizer: nothing to release",
        wanted(),
        in_cluster(rendered(PYTORCH), deleting=True, held=False),
        btj_status(deleted=True),
        PreviousDeleting(release=False, message="the previous PyTorchJob llama is still being deleted"),
    ),
    (
        "a finished BTJ's child gone, the spec unchanged: not re-created",
        wanted(),
        None,
        btj_status(phase="Succeeded", deleted=True),
        FinishedChildGone(
            Effects((ConditionChange(ConditionType.CHILD_CREATED, "False", "ChildDeleted", NOT_RECREATED),))
        ),
    ),
    (
        "a failed BTJ's child gone, the generation only on ChildCreated (a job over in its first pass)",
        wanted(),
        None,
        btj_status(phase="Failed", generation=None) | {"conditions": [child_created("True", "Exists", 2)]},
        FinishedChildGone(
            Effects((ConditionChange(ConditionType.CHILD_CREATED, "False", "ChildDeleted", NOT_RECREATED),))
        ),
    ),
    (
        "a finished BTJ's child gone, no generation recorded anywhere: not run again on a guess",
        wanted(),
        None,
        btj_status(phase="Succeeded", generation=None),
        FinishedChildGone(
            Effects((ConditionChange(ConditionType.CHILD_CREATED, "False", "ChildDeleted", NOT_RECREATED),))
        ),
    ),
    (
        "a finished BTJ's child gone, the spec edited after its deletion was recorded: a new job",
        wanted(),
        None,
        btj_status(phase="Succeeded", generation=1)
        | {"conditions": [child_created("False", "ChildDeleted", 1)]},
        Create(wanted(), OLD, Creation.AFTER_DELETION),
    ),
    (
        "a finished BTJ's child gone, the spec edited before its deletion was recorded (the operator was "
        "down): not run again",
        wanted(),
        None,
        btj_status(phase="Succeeded", generation=1)
        | {"conditions": [child_created("False", "ChildDeleted", 2)]},
        FinishedChildGone(
            Effects((ConditionChange(ConditionType.CHILD_CREATED, "False", "ChildDeleted", NOT_RECREATED),))
        ),
    ),
    (
        "a finished BTJ's child gone, edited while down, its deletion not recorded yet: not run again",
        wanted(),
        None,
        btj_status(phase="Succeeded", generation=1),
        FinishedChildGone(
            Effects((ConditionChange(ConditionType.CHILD_CREATED, "False", "ChildDeleted", NOT_RECREATED),))
        ),
    ),
    (
        "no child and none recorded: the first create",
        wanted(),
        None,
        {},
        Create(wanted(), None, Creation.FIRST),
    ),
    (
        "the recorded child deleted while it ran: re-created",
        wanted(),
        None,
        btj_status(deleted=True),
        Create(wanted(), OLD, Creation.AFTER_DELETION),
    ),
    (
        "the recorded child ran out of memory and was re-planned: re-created with the new plan",
        wanted(),
        None,
        btj_status(phase="Restarting", planHistory=OOM_REPLAN),
        Create(wanted(), OLD, Creation.AFTER_OUT_OF_MEMORY),
    ),
    (
        "a history entry for another child is no re-plan of this one",
        wanted(),
        None,
        btj_status(deleted=True, planHistory=[{**OOM_REPLAN[0], "failedChildUid": "older"}]),
        Create(wanted(), OLD, Creation.AFTER_DELETION),
    ),
    (
        "the child holds this render",
        wanted(),
        in_cluster(rendered(PYTORCH), status=RUNNING),
        btj_status(),
        UpToDate(False, FOUND),
    ),
    (
        "the child holds this render but not the finalizer (an older operator made it)",
        wanted(),
        in_cluster(rendered(PYTORCH), held=False, status=RUNNING),
        btj_status(),
        UpToDate(True, FOUND),
    ),
    (
        "a new render, the child has no status yet: patched in place, spec and all",
        wanted(digest="h2"),
        in_cluster(rendered(PYTORCH)),
        btj_status(phase="Pending"),
        PatchInPlace(
            False,
            FOUND,
            patch={"metadata": metadata_patch("h2"), "spec": rendered(PYTORCH)["spec"]},
            effects=PATCHED,
        ),
    ),
    (
        "a new render, the child suspended in a queue: patched in place, the finalizer added first",
        wanted(digest="h2"),
        in_cluster(rendered(PYTORCH), held=False, status=SUSPENDED),
        btj_status(phase="Queued"),
        PatchInPlace(
            True,
            FOUND,
            patch={"metadata": metadata_patch("h2"), "spec": rendered(PYTORCH)["spec"]},
            effects=PATCHED,
        ),
    ),
    (
        "a new render, the child running: left alone",
        wanted(digest="h2"),
        in_cluster(rendered(PYTORCH), status=RUNNING),
        btj_status(),
        cannot("PyTorchJob", "Running", "RunningJobImmutable"),
    ),
    (
        "a new render, the child started (startTime) but no condition yet: left alone",
        wanted(digest="h2"),
        in_cluster(rendered(PYTORCH), held=False, status={"startTime": T0}),
        btj_status(phase="Pending"),
        cannot("PyTorchJob", "Pending", "RunningJobImmutable", hold=True),
    ),
    (
        "a new render, the job finished: left alone",
        wanted(digest="h2"),
        in_cluster(rendered(PYTORCH), status=SUCCEEDED),
        btj_status(phase="Succeeded"),
        cannot("PyTorchJob", "Succeeded", "JobFinished"),
    ),
    (
        "a TrainJob not started whose node count changed: its spec cannot change",
        wanted(TRAINJOB, digest="h2", trainer=4),
        in_cluster(rendered(TRAINJOB)),
        btj_status(phase="Pending"),
        cannot("TrainJob", "Pending", "TrainJobImmutable"),
    ),
    (
        "a TrainJob suspended whose node count changed: its spec cannot change",
        wanted(TRAINJOB, digest="h2", trainer=4),
        in_cluster(rendered(TRAINJOB), status=SUSPENDED),
        btj_status(phase="Queued"),
        cannot("TrainJob", "Queued", "TrainJobImmutable"),
    ),
    (
        "a TrainJob not started, only its runtime changed: its metadata patched, never its spec",
        wanted(TRAINJOB, digest="h2"),
        in_cluster(rendered(TRAINJOB)),
        btj_status(phase="Pending"),
        PatchInPlace(
            False, FOUND_TRAINJOB, patch={"metadata": metadata_patch("h2")}, effects=TRAINJOB_PATCHED
        ),
    ),
]


@pytest.mark.parametrize(
    ("wanted_", "existing", "status", "expected"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_the_decision(
    wanted_: Wanted, existing: dict[str, Any] | None, status: dict[str, Any], expected: Outcome
) -> None:
    before = copy.deepcopy((wanted_, existing, status))
    assert decide(wanted_, existing, status) == expected
    assert (wanted_, existing, status) == before  # what was read is left as it was


def test_a_first_create_posts_created_once_made_and_nothing_when_found() -> None:
    outcome = Create(wanted(), None, Creation.FIRST)
    made = ConditionChange(
        ConditionType.CHILD_CREATED, "True", "Created", "PyTorchJob llama and ConfigMap llama-plan"
    )
    assert outcome.made(True, NEW) == Effects(
        (made, APPLIED), (Notice("Created", f"Created PyTorchJob llama: {SUMMARY}"),)
    )
    # A 409 on the create found the job made already (a lost answer, a restart): no second Event.
    assert outcome.made(False, NEW) == Effects((FOUND, APPLIED))


def test_a_recreation_names_why_the_generation_and_the_checkpoint() -> None:
    deleted = Create(wanted(), OLD, Creation.AFTER_DELETION).made(True, NEW)
    assert deleted.recreated
    assert deleted.events == (
        Notice(
            "ChildRecreated",
            "Re-created PyTorchJob llama (the previous one was deleted before the job finished) from the "
            "current spec, generation 2; training resumes from its last checkpoint in s3://bucket/ckpt",
        ),
    )
    replanned = Create(wanted(), OLD, Creation.AFTER_OUT_OF_MEMORY).made(True, NEW)
    assert replanned.recreated
    assert replanned.events[0].message.startswith(
        f"Re-created PyTorchJob llama (the previous one ran out of GPU memory; re-planned: {SUMMARY}) from "
    )
    # Found after a 409, or the very child recorded: not a re-creation, nothing counted.
    assert not Create(wanted(), OLD, Creation.AFTER_DELETION).made(False, OLD).recreated
    same = Create(wanted(), OLD, Creation.AFTER_DELETION).made(True, OLD)
    assert not same.recreated
    assert [n.reason for n in same.events] == ["Created"]


def test_a_recreation_without_a_checkpoint_says_training_starts_again() -> None:
    assert (
        resume_note(None) == "spec.training.checkpoint.path is not set, so training starts again from step 0"
    )


@pytest.mark.parametrize(
    ("status", "changed"),
    [
        ({"observedGeneration": 2}, False),
        ({"observedGeneration": 1}, True),
        ({"conditions": [child_created("True", "Exists", 1)]}, True),
        ({"conditions": [child_created("True", "Exists", 2)]}, False),
        ({}, False),
    ],
)
def test_spec_changed_reads_the_generation_reconcile_or_the_watcher_recorded(
    status: dict[str, Any], changed: bool
) -> None:
    assert spec_changed(2, status) is changed


def test_a_supporting_object_is_patched_only_when_its_render_changed() -> None:
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "llama-plan",
            "annotations": {RENDER_HASH_ANNOTATION: "h2"},
            "labels": {"a": "b"},
        },
        "data": {"plan.json": "{}"},
    }
    same = copy.deepcopy(config_map)
    assert supporting_patch(same, config_map) is None
    older = copy.deepcopy(config_map)
    older["metadata"]["annotations"][RENDER_HASH_ANNOTATION] = "h1"
    assert supporting_patch(older, config_map) == {
        "metadata": {"labels": {"a": "b"}, "annotations": {RENDER_HASH_ANNOTATION: "h2"}},
        "data": {"plan.json": "{}"},
    }


@pytest.mark.parametrize(
    ("creating", "condition", "reason"),
    [
        (True, ConditionType.CHILD_CREATED, "CreateRefused"),
        (False, ConditionType.SPEC_APPLIED, "PatchRefused"),
    ],
)
def test_a_refusal_names_the_call_the_server_s_words_and_the_fix(
    creating: bool, condition: str, reason: str
) -> None:
    error = "422 Invalid: admission webhook denied the request"
    assert refusal("the create of PyTorchJob llama", creating, error) == ConditionChange(
        condition,
        "False",
        reason,
        f"the API server refused the create of PyTorchJob llama: {error}. Fix the cause (an admission "
        "webhook, RBAC, a quota) or the spec; the operator tries again with backoff (at most every "
        "BTJ_CHILD_RETRY_INTERVAL_S, 60 s by default)",
    )


def labelled(job: dict[str, Any], labels: dict[str, str], record: str | None) -> dict[str, Any]:
    """`job` with these labels besides ours, and the record of the BTJ's keys it was given."""
    out = copy.deepcopy(job)
    out["metadata"]["labels"].update(labels)
    if record is not None:
        out["metadata"]["annotations"][PROPAGATED_ANNOTATION] = record
    return out


def test_a_label_patch_sets_changes_and_removes_only_what_the_btj_gave() -> None:
    child = in_cluster(labelled(rendered(PYTORCH), {"team": "a", "stale": "1", "theirs": "x"}, "stale,team"))
    edited = labelled(rendered(PYTORCH), {"team": "b", "cost-center": "7"}, "cost-center,team")
    assert label_patch(child, edited) == {
        "metadata": {
            "annotations": {PROPAGATED_ANNOTATION: "cost-center,team"},
            # "theirs" was never the BTJ's (another controller's): it stays.
            "labels": {"team": "b", "cost-center": "7", "stale": None},
        }
    }
    assert label_patch(edited, edited) is None
    # The last of the BTJ's labels removed: the record goes too.
    assert label_patch(edited, rendered(PYTORCH)) == {
        "metadata": {
            "annotations": {PROPAGATED_ANNOTATION: None},
            "labels": {"cost-center": None, "team": None},
        }
    }


@pytest.mark.parametrize(
    ("status", "digest", "outcome"),
    [(RUNNING, "h1", UpToDate), (RUNNING, "h2", CannotChange), (SUCCEEDED, "h2", CannotChange)],
)
def test_a_child_that_exists_takes_the_btj_s_labels_whatever_its_phase(
    status: dict[str, Any], digest: str, outcome: type
) -> None:
    """A running or finished job cannot take a new render, but its labels are metadata: they follow."""
    child = in_cluster(labelled(rendered(PYTORCH), {"team": "a"}, "team"), status=status)
    wanted_now = wanted(digest=digest)
    wanted_now = replace(wanted_now, job=labelled(dict(wanted_now.job), {"team": "b"}, "team"))
    decision = decide(wanted_now, child, btj_status())
    assert isinstance(decision, outcome)
    assert decision.relabel == {
        "metadata": {"annotations": {PROPAGATED_ANNOTATION: "team"}, "labels": {"team": "b"}}
    }
    unchanged = decide(wanted(digest=digest), in_cluster(rendered(PYTORCH), status=status), btj_status())
    assert isinstance(unchanged, outcome) and unchanged.relabel is None


def test_a_supporting_object_of_a_new_render_drops_a_removed_label_too() -> None:
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "llama-plan", "annotations": {RENDER_HASH_ANNOTATION: "h2"}, "labels": {}},
        "data": {"plan.json": "{}"},
    }
    older = labelled(config_map, {"team": "a"}, "team")
    older["metadata"]["annotations"][RENDER_HASH_ANNOTATION] = "h1"
    assert supporting_patch(older, config_map) == {
        "metadata": {
            "labels": {"team": None},
            "annotations": {RENDER_HASH_ANNOTATION: "h2", PROPAGATED_ANNOTATION: None},
        },
        "data": {"plan.json": "{}"},
    }
    # The same render, a label removed from the BTJ: only the labels are patched.
    assert supporting_patch(labelled(config_map, {"team": "a"}, "team"), config_map) == {
        "metadata": {"annotations": {PROPAGATED_ANNOTATION: None}, "labels": {"team": None}}
    }


def test_a_child_an_earlier_version_stamped_with_the_hash_that_counted_labels_is_up_to_date() -> None:
    """Before the render hash left the BTJ's labels out, it counted them: such a child (here "h0") holds
    this render; it is not a change a running job cannot take, and it is stamped with today's hash."""
    child = in_cluster(labelled(rendered(PYTORCH, digest="h0"), {"team": "a"}, None), status=RUNNING)
    now = replace(wanted(), job=labelled(dict(wanted().job), {"team": "a"}, "team"), earlier_hash="h0")
    assert decide(now, child, btj_status()) == UpToDate(
        False,
        FOUND,
        {"metadata": {"annotations": {PROPAGATED_ANNOTATION: "team", RENDER_HASH_ANNOTATION: "h1"}}},
    )
    assert isinstance(decide(replace(now, earlier_hash="h9"), child, btj_status()), CannotChange)
