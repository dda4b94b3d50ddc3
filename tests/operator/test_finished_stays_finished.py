"""A finished BTJ stays finished whatever was edited while its finished child existed, with the operator up
or down; an edit made after the finished child was recorded gone runs it again (child_record.runs_again).
The real operator under KopfRunner against KMock."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from blackwell_operator.handlers.child_calls import ChildCalls
from blackwell_operator.testing.emulator import HardenedEmulator
from tests.operator.harness import PYTORCHJOBS, Cluster, btj, from_operator, running_operator, wait_for
from tests.support.pods import job_condition

pytestmark = pytest.mark.integration

SUCCEEDED = {
    "conditions": [job_condition("Created"), job_condition("Running", "False"), job_condition("Succeeded")]
}
RUNNING = {"conditions": [job_condition("Created"), job_condition("Running")]}
EDIT = {"training": {"sequenceLength": 8192, "steps": 1200}}


def _child_created(cluster: Cluster, name: str) -> dict[str, Any]:
    return cluster.condition(name, "ChildCreated") or {}


async def _succeeded(cluster: Cluster, name: str) -> str:
    """Apply BTJ `name`, report its child Succeeded, wait for the BTJ; the child's uid."""
    await cluster.apply(btj(name))
    job = await wait_for(lambda: cluster.job(name), what=f"{name}'s PyTorchJob")
    await cluster.set_child_status(name, SUCCEEDED)
    await wait_for(lambda: cluster.status(name).get("phase") == "Succeeded", what=f"{name} Succeeded")
    return str(job["metadata"]["uid"])


async def test_edited_while_down_then_the_finished_child_deleted_runs_nothing(cluster: Cluster) -> None:
    async with running_operator(cluster):
        uid = await _succeeded(cluster, "w")
    # The operator is down: the spec is edited, then the finished child deleted (by hand, or its TTL).
    await cluster.patch_spec("w", EDIT)
    await cluster.delete_child("w")
    assert (cluster.job("w") or {}).get("metadata", {}).get("deletionTimestamp"), "held by its finalizer"
    async with running_operator(cluster):
        await wait_for(lambda: cluster.job("w") is None, what="the finished child released")
        await wait_for(
            lambda: _child_created(cluster, "w").get("reason") == "ChildDeleted", what="ChildDeleted"
        )
        await cluster.settle("w")
    status = cluster.status("w")
    assert cluster.creates("pytorchjobs") == 1, "no new child"
    assert status["phase"] == "Succeeded" and status["child"]["uid"] == uid
    assert "not re-created" in _child_created(cluster, "w")["message"]


async def test_a_pass_that_read_the_spec_before_an_edit_does_not_run_the_finished_job_again(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A pass (here the resume at a restart) reads the finished BTJ at generation 1. Before it reads the
    # child, the spec is edited and the finished child deleted (its TTL), and the child watcher records the
    # deletion at generation 2. The pass's older generation must not read as an edit made after the
    # deletion: it would re-create the child, from the old spec.
    async with running_operator(cluster):
        uid = await _succeeded(cluster, "w")
    original = ChildCalls.read
    armed, held, resumed = [True], threading.Event(), threading.Event()

    def read_after_the_edit(calls: ChildCalls, kind: Any, job_path: str, name: str) -> Any:
        if armed:
            armed.clear()
            held.set()
            resumed.wait(30)
        return original(calls, kind, job_path, name)

    monkeypatch.setattr(ChildCalls, "read", read_after_the_edit)
    async with running_operator(cluster):
        await wait_for(held.is_set, what="the resume pass at its read of the child")
        await cluster.patch_spec("w", EDIT)
        await cluster.delete_child("w")
        await wait_for(lambda: cluster.job("w") is None, what="the finished child released")
        await wait_for(
            lambda: _child_created(cluster, "w").get("reason") == "ChildDeleted", what="ChildDeleted"
        )
        resumed.set()
        await cluster.settle("w")  # the resume pass and the edit's pass are done
    status = cluster.status("w")
    assert cluster.creates("pytorchjobs") == 1, "no new child"
    assert status["phase"] == "Succeeded" and status["child"]["uid"] == uid
    assert _child_created(cluster, "w")["observedGeneration"] == 2


async def test_edited_while_up_then_the_finished_child_deleted_runs_nothing(cluster: Cluster) -> None:
    async with running_operator(cluster):
        await _succeeded(cluster, "w")
        await cluster.patch_spec("w", EDIT)
        await wait_for(
            lambda: (cluster.condition("w", "SpecApplied") or {}).get("reason") == "JobFinished",
            what="the edit refused for a finished job",
        )
        await cluster.delete_child("w")
        await wait_for(
            lambda: _child_created(cluster, "w").get("reason") == "ChildDeleted", what="ChildDeleted"
        )
        await cluster.settle("w")
    assert cluster.creates("pytorchjobs") == 1 and cluster.job("w") is None
    assert cluster.status("w")["phase"] == "Succeeded"


async def test_an_edit_after_the_finished_child_is_gone_runs_the_new_spec(cluster: Cluster) -> None:
    async with running_operator(cluster):
        await _succeeded(cluster, "w")
        await cluster.delete_child("w")
        await wait_for(
            lambda: _child_created(cluster, "w").get("reason") == "ChildDeleted", what="ChildDeleted"
        )
        await cluster.settle("w")
        assert cluster.creates("pytorchjobs") == 1
        await cluster.patch_spec("w", EDIT)  # asking for more steps of a finished job: a new run
        await wait_for(lambda: cluster.job("w"), what="a new PyTorchJob for the edited spec")
        await cluster.settle("w")
    assert cluster.creates("pytorchjobs") == 2


def plan_reads(requests: list[Any]) -> int:
    """The operator's reads of brief's plan ConfigMap among `requests`."""
    return sum(
        1
        for r in requests
        if r.method.value == "GET"
        and r.resource is not None
        and r.resource.plural == "configmaps"
        and r.name == "brief-plan"
        and from_operator(r)
    )


async def test_a_job_that_finishes_and_goes_during_a_pass_leaves_no_plan_behind(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The soak's finishing job under load: a pass (here the resume at a restart) reads the running child;
    # before it goes on, the job succeeds and is deleted (ttlSecondsAfterFinished: 0) and the child watcher
    # records the end and drops the plan ConfigMap. The pass must not make the ConfigMap again for a job that
    # is gone: nothing would ever delete it, and the BTJ would keep an orphan.
    async with running_operator(cluster):
        await cluster.apply(btj("brief"))
        await wait_for(lambda: cluster.job("brief"), what="the PyTorchJob")
        await cluster.set_child_status("brief", RUNNING)
        await wait_for(lambda: cluster.status("brief").get("phase") == "Running", what="phase Running")
    assert cluster.config_map("brief-plan") is not None
    original = HardenedEmulator._handle_one
    armed, finished, served = [True], [], []

    async def finish_during_the_read(emulator: HardenedEmulator, request: Any) -> Any:
        served.append(request)
        response = await original(emulator, request)
        if (
            armed
            and request.method.value == "GET"
            and request.resource is not None
            and request.resource.plural == "pytorchjobs"
            and request.name == "brief"
            and from_operator(request)
        ):
            armed.clear()
            await cluster.set_child_status("brief", SUCCEEDED)
            since = len(served)
            await cluster.delete_child("brief")
            try:  # bounded; the assertions below say what went wrong
                # The watcher drops the plan on the job's going and again on its DELETED event: both seen.
                await wait_for(
                    lambda: (
                        cluster.job("brief") is None
                        and cluster.config_map("brief-plan") is None
                        and plan_reads(served[since:]) >= 2
                    ),
                    timeout=10.0,
                    what="the end recorded and the plan dropped",
                )
                finished.append(True)
            except AssertionError:
                finished.append(False)
        return response  # the pass goes on from its copy of the running child

    monkeypatch.setattr(HardenedEmulator, "_handle_one", finish_during_the_read)
    async with running_operator(cluster):
        await wait_for(lambda: finished, what="the pass's read of the child")
        await wait_for(lambda: cluster.status("brief").get("phase") == "Succeeded", what="Succeeded")
        await cluster.settle("brief")
    assert finished == [True], "the watcher recorded the end and dropped the plan during the pass"
    assert cluster.config_map("brief-plan") is None, "the pass made the finished job's plan again"
    assert cluster.job("brief") is None and cluster.creates("pytorchjobs") == 1


async def test_a_child_gone_between_the_release_read_and_patch_is_released_quietly(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Another release (the reconcile's, a restart's) lands between this release's read and its patch: the
    # patch meets a 404. The child is gone, which is what a release is for: no error line (the soak counts
    # every operator ERROR line as a failure, and met this one).
    original = HardenedEmulator._handle_one
    armed, raced = [True], []

    async def release_first(emulator: HardenedEmulator, request: Any) -> Any:
        response = await original(emulator, request)
        job = cluster.job("quiet")
        if (
            armed
            and request.method.value == "GET"
            and request.resource is not None
            and request.resource.plural == "pytorchjobs"
            and request.name == "quiet"
            and from_operator(request)
            and job is not None
            and job["metadata"].get("deletionTimestamp")
        ):
            armed.clear()
            await cluster._json(
                "PATCH",
                f"{PYTORCHJOBS}/quiet",
                {"metadata": {"finalizers": []}},
                "application/merge-patch+json",
            )
            raced.append(cluster.job("quiet") is None)
        return response  # the operator's patch of the finalizers then finds no object

    monkeypatch.setattr(HardenedEmulator, "_handle_one", release_first)
    async with running_operator(cluster):
        await _succeeded(cluster, "quiet")
        await cluster.delete_child("quiet")
        await wait_for(lambda: raced, what="the release's read of the child")
        await wait_for(
            lambda: _child_created(cluster, "quiet").get("reason") == "ChildDeleted", what="ChildDeleted"
        )
        await cluster.settle("quiet")
    assert raced == [True], "the test's own release deleted the child first"
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert not [m for m in errors if "Cannot release" in m], errors
    assert cluster.status("quiet")["phase"] == "Succeeded" and cluster.job("quiet") is None
