"""A child deleted by hand: re-created while its BTJ runs, only reported once the BTJ has finished."""

from __future__ import annotations

import logging
from typing import Any, cast

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from blackwell_operator.discovery.capacity import NodeCapacityReader
from blackwell_operator.handlers.api import KubeApi
from blackwell_operator.handlers.context import OperatorContext
from blackwell_operator.handlers.reconcile import Reconciler
from blackwell_operator.handlers.resync import resync_interval
from blackwell_operator.lifecycle.child_mirror import deleted_child_changes
from blackwell_operator.lifecycle.convergence import wants_child_back
from blackwell_operator.lifecycle.status_patch import status_patch
from blackwell_operator.lifecycle.writers import CHILD_WATCHER
from blackwell_operator.metrics import OperatorMetrics
from blackwell_operator.testing.emulator import (
    HYPERPOD_RESOURCE,
    PYTORCHJOB_RESOURCE,
    Fault,
    HardenedEmulator,
)
from tests.operator.harness import (
    HYPERPODJOBS,
    NAMESPACE,
    PYTORCHJOBS,
    Cluster,
    btj,
    from_operator,
    running_operator,
    wait_for,
)
from tests.ports import free_port

pytestmark = pytest.mark.integration

CHECKPOINTS = "/fsx/checkpoints/resume-me"
FSX = [{"name": "fsx", "claimName": "fsx-claim", "mountPath": "/fsx"}]
RUNNING = {
    "conditions": [{"type": "Running", "status": "True", "reason": "PyTorchJobRunning", "message": "running"}]
}
SUCCEEDED = {
    "conditions": [
        {"type": "Succeeded", "status": "True", "reason": "PyTorchJobSucceeded", "message": "done"}
    ]
}


def child_uid(cluster: Cluster, name: str) -> str | None:
    job = cluster.job(name)
    return None if job is None else str(job["metadata"]["uid"])


def child_created(cluster: Cluster, name: str) -> dict[str, Any]:
    """The ChildCreated condition, {} while there is none."""
    return cluster.condition(name, "ChildCreated") or {}


def live_children(cluster: Cluster) -> int:
    return len(cluster.k.live_objects(PYTORCHJOB_RESOURCE, NAMESPACE))


def reasons(cluster: Cluster, name: str) -> list[str]:
    return [e["reason"] for e in cluster.events(name)]


async def test_a_deleted_child_of_a_running_job_is_recreated(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()
    monkeypatch.setenv("BTJ_METRICS_BIND", f"127.0.0.1:{port}")
    training = {"sequenceLength": 8192, "steps": 1000, "checkpoint": {"path": CHECKPOINTS}}
    async with running_operator(cluster), aiohttp.ClientSession() as http:
        await cluster.apply(btj("phoenix", training=training, volumes=FSX))
        await wait_for(lambda: cluster.condition("phoenix", "ChildCreated"), what="ChildCreated")
        await cluster.set_child_status("phoenix", RUNNING)
        await wait_for(lambda: cluster.status("phoenix").get("phase") == "Running", what="phase Running")
        first = child_uid(cluster, "phoenix")
        config_map = cluster.config_map("phoenix-plan")
        assert first and config_map is not None

        await cluster.delete_child("phoenix")
        await wait_for(
            lambda: (
                cluster.status("phoenix")["child"]["uid"] not in (None, first)
                and child_created(cluster, "phoenix").get("status") == "True"
            ),
            what="the re-created child recorded",
        )
        second = child_uid(cluster, "phoenix")
        assert second not in (None, first) and cluster.status("phoenix")["child"]["uid"] == second
        # The new child is followed like the first one.
        await cluster.set_child_status("phoenix", RUNNING)
        await wait_for(lambda: cluster.status("phoenix").get("phase") == "Running", what="Running again")
        await wait_for(lambda: "ChildRecreated" in reasons(cluster, "phoenix"), what="the Event")
        await cluster.settle("phoenix")
        async with http.get(f"http://127.0.0.1:{port}/metrics") as response:
            exposition = await response.text()

    assert "btj_operator_children_recreated_total 1.0" in exposition.splitlines()
    assert live_children(cluster) == 1 and cluster.creates("pytorchjobs") == 2
    assert child_created(cluster, "phoenix").get("reason") == "Created"
    # Same plan: the ConfigMap the first child mounted is reused as it was.
    assert (cluster.config_map("phoenix-plan") or {}).get("data") == config_map["data"]
    (event,) = [e for e in cluster.events("phoenix") if e["reason"] == "ChildRecreated"]
    assert event["type"] == "Normal"
    assert "PyTorchJob phoenix" in event["message"]
    assert f"training resumes from its last checkpoint in {CHECKPOINTS}" in event["message"]


async def test_a_deleted_child_of_a_succeeded_job_is_only_reported(cluster: Cluster) -> None:
    async with running_operator(cluster):
        await cluster.apply(btj("done"))
        await wait_for(lambda: cluster.condition("done", "ChildCreated"), what="ChildCreated")
        await cluster.set_child_status("done", SUCCEEDED)
        await wait_for(lambda: cluster.status("done").get("phase") == "Succeeded", what="phase Succeeded")
        first = child_uid(cluster, "done")

        await cluster.delete_child("done")
        await wait_for(
            lambda: child_created(cluster, "done").get("reason") == "ChildDeleted", what="ChildDeleted"
        )
        await cluster.settle("done")

    condition = child_created(cluster, "done")
    assert condition["status"] == "False"
    assert condition["message"] == (
        "PyTorchJob done was deleted; the job had finished, so it is not re-created."
    )
    assert cluster.job("done") is None and cluster.creates("pytorchjobs") == 1
    status = cluster.status("done")
    assert status["phase"] == "Succeeded" and status["child"]["uid"] == first
    assert "ChildRecreated" not in reasons(cluster, "done")


async def recreated_after_refusals(cluster: Cluster, name: str, status: int, times: int) -> Fault:
    """Apply BTJ `name`, delete its child while the API refuses the next `times` creates with `status`, and
    wait until the re-created child is recorded; the fault is returned for its count."""
    await cluster.apply(btj(name))
    await wait_for(lambda: child_created(cluster, name).get("status") == "True", what="ChildCreated")
    first = cluster.status(name)["child"]["uid"]
    fault = cluster.k.inject_fault("post", "pytorchjobs", status, times=times)
    await cluster.delete_child(name)
    await wait_for(
        lambda: (
            cluster.status(name)["child"]["uid"] != first
            and child_created(cluster, name).get("status") == "True"
        ),
        what="the re-created child recorded",
        timeout=30,
    )
    return fault


async def test_a_failed_recreate_is_retried(cluster: Cluster) -> None:
    # Kopf does not retry event handlers; recreate-child retries the reconcile path itself.
    async with running_operator(cluster):
        fault = await recreated_after_refusals(cluster, "retry", 503, times=2)
        await wait_for(lambda: "ChildRecreated" in reasons(cluster, "retry"), what="the Event")
        await cluster.settle("retry")
    assert fault.times == 0
    assert cluster.creates("pytorchjobs") == 4, "the first create, two refused, the re-create"
    assert live_children(cluster) == 1
    assert cluster.status("retry")["child"]["uid"] == child_uid(cluster, "retry")


async def test_a_recreate_refused_for_a_while_is_retried_on_a_timer(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An admission webhook refuses the re-create (422: not retryable, recreate-child gives up at once) and
    # the BTJ then changes no more: only the resync loop brings the child back.
    monkeypatch.setenv("BTJ_CHILD_RETRY_INTERVAL_S", "1")
    async with running_operator(cluster):
        fault = await recreated_after_refusals(cluster, "webhook", 422, times=3)
        await cluster.settle("webhook")
    assert fault.times == 0
    assert live_children(cluster) == 1
    assert cluster.status("webhook")["child"]["uid"] == child_uid(cluster, "webhook")


def test_the_resync_loop_leaves_a_btj_whose_reconcile_is_in_progress_alone(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Kopf's handlers and the resync loop run in different threads: while one reconciles, the loop's pass
    # does nothing (two creates would both succeed from the caller's view: a 409 is adopted).
    ctx = OperatorContext(
        api=cast(KubeApi, None), capacity=cast(NodeCapacityReader, None), metrics=OperatorMetrics()
    )
    body = {"metadata": {"uid": "u-1", "name": "busy", "namespace": NAMESPACE}, "spec": {}}
    logger = logging.getLogger("test-recreate-lock")
    lock = ctx.recreate_lock("u-1")
    with lock, caplog.at_level(logging.DEBUG, logger="test-recreate-lock"):
        Reconciler(ctx).reconcile_now(body, logger=logger, attempts=1, wait=False)
    assert [r.getMessage() for r in caplog.records] == [
        "A reconcile of this BlackwellTrainingJob is already in progress"
    ]
    assert ctx.recreate_lock("u-1") is lock and not lock.locked()


def test_the_child_retry_interval_is_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BTJ_CHILD_RETRY_INTERVAL_S", "soon")
    with pytest.raises(ValueError, match=r"BTJ_CHILD_RETRY_INTERVAL_S='soon'.*Fix"):
        resync_interval()
    monkeypatch.setenv("BTJ_CHILD_RETRY_INTERVAL_S", "0")
    with pytest.raises(ValueError, match="must be positive"):
        resync_interval()
    monkeypatch.delenv("BTJ_CHILD_RETRY_INTERVAL_S")
    assert resync_interval() == 60.0


async def test_a_deleted_hyperpod_job_is_recreated_too(cluster: Cluster) -> None:
    async with running_operator(cluster):
        await cluster.apply(btj("hp", backend="HyperPodPyTorchJob"))
        await wait_for(lambda: child_created(cluster, "hp").get("status") == "True", what="ChildCreated")
        first = cluster.status("hp")["child"]["uid"]
        await cluster.delete_child("hp", collection=HYPERPODJOBS)
        await wait_for(
            lambda: (
                cluster.status("hp")["child"]["uid"] != first
                and child_created(cluster, "hp").get("status") == "True"
            ),
            what="the re-created HyperPodPyTorchJob recorded",
        )
        await wait_for(lambda: "ChildRecreated" in reasons(cluster, "hp"), what="the Event")
        await cluster.settle("hp")
    job = cluster.job("hp", HYPERPOD_RESOURCE)
    assert job is not None and job["metadata"]["uid"] == cluster.status("hp")["child"]["uid"]
    assert cluster.creates("hyperpodpytorchjobs") == 2
    (event,) = [e for e in cluster.events("hp") if e["reason"] == "ChildRecreated"]
    assert "HyperPodPyTorchJob hp" in event["message"]


async def test_a_child_deleted_after_dry_run_was_turned_on_is_not_recreated(cluster: Cluster) -> None:
    async with running_operator(cluster):
        await cluster.apply(btj("paused"))
        await wait_for(lambda: child_created(cluster, "paused").get("status") == "True", what="ChildCreated")
        await cluster.patch_spec("paused", {"dryRun": True})
        await wait_for(lambda: child_created(cluster, "paused").get("reason") == "DryRun", what="dry run")
        await cluster.delete_child("paused")
        await wait_for(
            lambda: any(
                condition_of(w).get("reason") == "ChildDeleted" for w in status_writes(cluster, "paused")
            ),
            what="the deletion reported",
        )
        # The child watcher may be told twice (Terminating under the final-status finalizer, then DELETED),
        # and each ChildDeleted it writes is answered by a reconcile that says DryRun again: wait for the
        # state the BTJ comes to rest in, then let every event seen so far go through.
        await wait_for(
            lambda: (
                cluster.job("paused") is None and child_created(cluster, "paused").get("reason") == "DryRun"
            ),
            what="the dry run said again with the child gone",
        )
        await cluster.settle("paused")
    assert cluster.job("paused") is None and cluster.creates("pytorchjobs") == 1
    assert cluster.status("paused")["phase"] == "Planned"


async def test_a_restart_does_not_rerun_a_finished_job_whose_child_is_gone(cluster: Cluster) -> None:
    # The child finished and was deleted while no operator ran: no DELETED event ever reaches one.
    await cluster.apply(btj("finished"))
    await cluster.set_btj_status("finished", recorded("finished", "Succeeded", uid="gone-while-down"))
    async with running_operator(cluster):
        await wait_for(lambda: cluster.condition("finished", "ChildCreated"), what="ChildCreated")
        await cluster.settle("finished")
    condition = child_created(cluster, "finished")
    assert condition["status"] == "False" and condition["reason"] == "ChildDeleted"
    assert "not re-created" in condition["message"]
    assert cluster.creates("pytorchjobs") == 0 and cluster.status("finished")["phase"] == "Succeeded"


async def test_a_restart_recreates_the_missing_child_of_a_running_job(cluster: Cluster) -> None:
    await cluster.apply(btj("lost"))
    await cluster.set_btj_status("lost", recorded("lost", "Running", uid="gone-while-down"))
    async with running_operator(cluster):
        await wait_for(
            lambda: child_created(cluster, "lost").get("status") == "True", what="ChildCreated True"
        )
        await wait_for(lambda: "ChildRecreated" in reasons(cluster, "lost"), what="the Event")
        await cluster.settle("lost")
    assert cluster.creates("pytorchjobs") == 1 and live_children(cluster) == 1
    assert cluster.status("lost")["child"]["uid"] == child_uid(cluster, "lost")
    assert cluster.status("lost")["phase"] == "Pending"
    (event,) = [e for e in cluster.events("lost") if e["reason"] == "ChildRecreated"]
    # The example sets no checkpoint folder: the Event says so instead of promising a resume.
    assert "spec.training.checkpoint.path is not set" in event["message"]
    assert "Created" not in reasons(cluster, "lost")


async def test_a_stale_deletion_report_creates_no_duplicate(cluster: Cluster) -> None:
    # The BTJ says its child was deleted, but a child of the same name exists again (re-created by an
    # earlier run, or the report is stale): it is taken as it is.
    created = await cluster.apply(btj("twice"))
    await cluster._json("POST", PYTORCHJOBS, owned_job("twice", created["metadata"]["uid"]))
    existing = child_uid(cluster, "twice")
    status = recorded("twice", "Running", uid="an-older-child")
    status["conditions"] = [
        {
            "type": "ChildCreated",
            "status": "False",
            "reason": "ChildDeleted",
            "message": "PyTorchJob twice was deleted; re-creating it.",
            "lastTransitionTime": "2026-11-30T00:00:00Z",
        }
    ]
    await cluster.set_btj_status("twice", status)
    async with running_operator(cluster):
        await wait_for(
            lambda: child_created(cluster, "twice").get("status") == "True", what="ChildCreated True"
        )
        await cluster.settle("twice")
    assert cluster.creates("pytorchjobs") == 1, "only the test's own create"
    assert child_created(cluster, "twice").get("reason") == "Exists"
    assert cluster.status("twice")["child"]["uid"] == existing
    assert "ChildRecreated" not in reasons(cluster, "twice")


async def test_a_child_deleted_before_reconcile_records_it_is_still_recreated(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The race: reconcile creates the child, the user deletes it and the child watcher reports that, and only
    # then does reconcile write status from its copy of the (now deleted) child. That write must keep the
    # report, or the BTJ would point at a child that is gone and nothing would bring it back.
    original = HardenedEmulator._handle_one
    raced: list[str] = []

    async def create_then_delete(emulator: HardenedEmulator, request: Any) -> Any:
        response = await original(emulator, request)
        if (
            not raced
            and request.method.value == "POST"
            and request.resource is not None
            and request.resource.plural == "pytorchjobs"
            and from_operator(request)
        ):
            raced.append(str(child_uid(cluster, "racy")))
            await cluster.delete_child("racy")
            await wait_for(
                lambda: child_created(cluster, "racy").get("reason") == "ChildDeleted", what="the report"
            )
        return response  # only now does the operator learn that its create succeeded

    monkeypatch.setattr(HardenedEmulator, "_handle_one", create_then_delete)
    async with running_operator(cluster):
        await cluster.apply(btj("racy"))
        await wait_for(
            lambda: (
                cluster.status("racy")["child"]["uid"] not in (None, *raced)
                and child_created(cluster, "racy").get("status") == "True"
            ),
            what="the re-created child recorded",
        )
        await wait_for(lambda: "ChildRecreated" in reasons(cluster, "racy"), what="the Event")
        await cluster.settle("racy")
    assert raced, "the hook deleted the first child"
    # No status written after the report claims that the deleted child exists.
    writes = status_writes(cluster, "racy")
    reported = next(i for i, w in enumerate(writes) if condition_of(w).get("reason") == "ChildDeleted")
    for written in writes[reported:]:
        claims = condition_of(written).get("status") == "True"
        assert not (claims and (written.get("child") or {}).get("uid") == raced[0]), written
    assert cluster.status("racy")["child"]["uid"] == child_uid(cluster, "racy")
    assert cluster.creates("pytorchjobs") == 2 and live_children(cluster) == 1
    assert reasons(cluster, "racy").count("ChildRecreated") == 1


async def test_a_recreated_child_that_runs_before_reconcile_records_it_is_followed(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The race the soak met under CPU load: reconcile re-creates a deleted child, the training operator marks
    # the new child Running and its event reaches the child watcher, and only then does reconcile write
    # status.child from its creation-time copy (no status yet). The watcher must take the new child as the
    # one on record (the recorded one is gone), and reconcile's write must keep the phase it reported: else
    # the BTJ says Pending for ever over a running child, with no event left to correct it.
    original = HardenedEmulator._handle_one
    first: list[str] = []
    seen: list[bool] = []

    async def run_before_the_answer(emulator: HardenedEmulator, request: Any) -> Any:
        response = await original(emulator, request)
        if (
            first
            and not seen
            and request.method.value == "POST"
            and request.resource is not None
            and request.resource.plural == "pytorchjobs"
            and from_operator(request)
        ):
            second = child_uid(cluster, "quick")
            await cluster.set_child_status("quick", RUNNING)
            try:  # bounded: without the watcher's record the test fails below, not here
                await wait_for(
                    lambda: (
                        cluster.status("quick").get("phase") == "Running"
                        and cluster.status("quick")["child"]["uid"] == second
                    ),
                    timeout=10.0,
                    what="the watcher's record of the new child",
                )
                seen.append(True)
            except AssertionError:
                seen.append(False)
        return response  # only now does reconcile learn that its create succeeded, and write status

    monkeypatch.setattr(HardenedEmulator, "_handle_one", run_before_the_answer)
    async with running_operator(cluster):
        await cluster.apply(btj("quick"))
        await wait_for(lambda: cluster.condition("quick", "ChildCreated"), what="ChildCreated")
        await cluster.set_child_status("quick", RUNNING)
        await wait_for(lambda: cluster.status("quick").get("phase") == "Running", what="phase Running")
        first.append(str(child_uid(cluster, "quick")))
        await cluster.delete_child("quick")
        await wait_for(
            lambda: (
                cluster.status("quick")["child"]["uid"] not in (None, *first)
                and child_created(cluster, "quick").get("reason") == "Created"
            ),
            what="the re-created child recorded by reconcile",
        )
        await cluster.settle("quick")
        status = cluster.status("quick")
    assert status["phase"] == "Running", status  # the stuck state: Pending over a running child
    assert seen == [True], "the child watcher recorded the new child's phase before reconcile's write"
    assert status["child"]["uid"] == child_uid(cluster, "quick") and status["child"].get("configMap")
    assert child_created(cluster, "quick").get("status") == "True"
    assert cluster.creates("pytorchjobs") == 2 and live_children(cluster) == 1
    assert reasons(cluster, "quick").count("ChildRecreated") == 1


def status_writes(cluster: Cluster, name: str) -> list[dict[str, Any]]:
    """BTJ `name`'s status after each PATCH of its /status, in the order the API server took them."""
    statuses = []
    for r in cluster.k.requests:
        if not (
            r.method.value == "PATCH"
            and r.resource is not None
            and r.resource.plural == "blackwelltrainingjobs"
            and r.subresource == "status"
            and r.name == name
        ):
            continue
        # The emulator stores each accepted write as one JSON-patch "replace" of the whole object.
        for op in r.data if isinstance(r.data, list) else []:
            if op.get("op") == "replace" and op.get("path") == "":
                statuses.append(dict(op["value"].get("status") or {}))
    return statuses


def condition_of(status: dict[str, Any], type_: str = "ChildCreated") -> dict[str, Any]:
    return next((dict(c) for c in status.get("conditions") or [] if c.get("type") == type_), {})


def recorded(name: str, phase: str, *, uid: str) -> dict[str, Any]:
    """A status an earlier operator run left: a phase and a child reference."""
    return {
        "phase": phase,
        "observedGeneration": 1,
        "child": {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": name, "uid": uid},
    }


def owned_job(name: str, owner_uid: str) -> dict[str, Any]:
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {
            "name": name,
            "labels": {"app.kubernetes.io/managed-by": "blackwell-operator"},
            "ownerReferences": [
                {
                    "apiVersion": "training.blackwell.dev/v1alpha1",
                    "kind": "BlackwellTrainingJob",
                    "name": name,
                    "uid": owner_uid,
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {},
    }


# status.child as the operator records it (the status is read as the models read it).
RECORDED_CHILD = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "x", "uid": "u1"}
CHILD_DELETED_CONDITION = {
    "type": "ChildCreated",
    "status": "False",
    "reason": "ChildDeleted",
    "lastTransitionTime": "2026-11-30T00:00:00Z",
}


def deleted_report(phase: str, **metadata: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "x", **metadata},
        "status": {"phase": phase, "child": RECORDED_CHILD, "conditions": [CHILD_DELETED_CONDITION]},
    }


@pytest.mark.parametrize(
    ("btj_object", "wanted"),
    [
        (deleted_report("Running"), True),
        (deleted_report("Pending"), True),
        (deleted_report("Succeeded"), False),
        (deleted_report("Failed"), False),
        (deleted_report("Running", deletionTimestamp="2026-11-30T00:00:00Z"), False),
        ({"metadata": {"name": "x"}, "status": {"phase": "Running", "child": {"uid": "u1"}}}, False),
    ],
    ids=["running", "pending", "succeeded", "failed", "being-deleted", "child-present"],
)
def test_which_btjs_want_their_child_back(btj_object: dict[str, Any], wanted: bool) -> None:
    assert wants_child_back(btj_object) is wanted


def test_the_recreation_counter_is_exported_from_the_start() -> None:
    metrics = OperatorMetrics()
    families = {f.name: f for f in text_string_to_metric_families(metrics.exposition().decode())}
    (sample,) = [s for s in families["btj_operator_children_recreated"].samples if s.name.endswith("_total")]
    assert sample.value == 0
    metrics.children_recreated.inc()
    assert b"btj_operator_children_recreated_total 1.0" in metrics.exposition()


@pytest.mark.parametrize(
    ("child_status", "phase", "wanted"),
    [(SUCCEEDED, "Succeeded", False), (RUNNING, "Running", True)],
    ids=["finished-child", "running-child"],
)
def test_a_child_deleted_with_its_final_status_finishes_the_btj(
    child_status: dict[str, Any], phase: str, wanted: bool
) -> None:
    # ttlSecondsAfterFinished: 0 deletes a job the moment it finishes; Kopf may fold that last status
    # update into the DELETED event. The deleted object's own status must then finish the BTJ, else
    # recreate-child would run the finished training again.
    btj_object = {
        "metadata": {"name": "x", "uid": "b1", "generation": 1},
        "status": {"phase": "Running", "child": RECORDED_CHILD, "observedGeneration": 1},
    }
    child = {"kind": "PyTorchJob", "metadata": {"name": "x", "uid": "u1"}, "status": child_status}
    change = deleted_child_changes(btj_object, child, generation=1, now="2026-11-30T00:00:00Z")
    changes = status_patch(change, btj_object["status"], CHILD_WATCHER)
    after = {**btj_object, "status": {**btj_object["status"], **changes}}
    assert after["status"]["phase"] == phase
    assert wants_child_back(after) is wanted
    assert ("not re-created" in changes["message"]) is not wanted


def test_a_deleted_btj_s_recreate_lock_is_dropped() -> None:
    ctx = OperatorContext(
        api=cast(KubeApi, None), capacity=cast(NodeCapacityReader, None), metrics=OperatorMetrics()
    )
    held, idle = ctx.recreate_lock("held"), ctx.recreate_lock("idle")
    with held:
        ctx.forget_btj("held")  # a re-create in progress keeps its lock until it ends
        ctx.forget_btj("idle")
        assert ctx.recreate_lock("held") is held
    assert ctx.recreate_lock("idle") is not idle  # a fresh lock: the old entry was dropped
