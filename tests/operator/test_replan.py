"""A trainer pod that ran out of GPU memory gets its BTJ re-planned with a learned correction and a new
child, never the same plan again; after spec.tuning.maxReplans re-plans the BTJ fails naming what to
change. The real operator under KopfRunner against the KMock API server, for every backend."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from blackwell_operator.lifecycle.failures import PERMANENT_ERROR_REASON, worker_failure
from blackwell_operator.lifecycle.replan import WHAT_TO_CHANGE, correction_of, replan_changes
from blackwell_operator.lifecycle.status_patch import status_patch
from blackwell_operator.lifecycle.writers import POD_WATCHER
from blackwell_operator.models.status import PLAN_HISTORY_LIMIT
from blackwell_operator.planner.correction import family_key
from blackwell_operator.testing.emulator import HYPERPOD_RESOURCE, PYTORCHJOB_RESOURCE, TRAINJOB_RESOURCE
from blackwell_trainer.plan.config import Candidate, OomResult, Plan
from tests.operator.harness import Cluster, btj, running_operator, wait_for
from tests.operator.test_trainjob_lifecycle import node_job, trainer_pod
from tests.ports import free_port
from tests.support.oom import oom_message
from tests.support.pods import T1, T2, T3, container, pod, pod_status, terminated

# metav1.Time the pure functions stamp their conditions and history with (the clock is passed in).
NOW = "2026-12-01T12:00:00Z"

RESOURCES = {
    "PyTorchJob": PYTORCHJOB_RESOURCE,
    "HyperPodPyTorchJob": HYPERPOD_RESOURCE,
    "TrainJob": TRAINJOB_RESOURCE,
}


def _plan(cluster: Cluster, name: str = "w") -> Plan:
    return Plan.model_validate(cluster.status(name)["plan"])


def _events(cluster: Cluster, reason: str, name: str = "w") -> list[dict[str, Any]]:
    return [e for e in cluster.events(name) if e.get("reason") == reason]


async def _oom_pod(cluster: Cluster, backend: str, name: str, pod_name: str, finished: str) -> None:
    """A worker of the current child whose trainer container ended on the OOM result of the current plan."""
    message = oom_message(_plan(cluster, name))
    if backend == "TrainJob":
        ended = container(state={"terminated": terminated(1, "Error", finished, message)}, name="node")
        owner = await node_job(cluster, name, f"{name}-{pod_name}")
        manifest = trainer_pod(pod_name, name, name, owner)
    else:
        ended = container(state={"terminated": terminated(1, "Error", finished, message)})
        manifest = pod(pod_name, name, owner=cluster.job(name, RESOURCES[backend]))
    await cluster.add_pod(manifest, pod_status(ended))


async def _new_child(cluster: Cluster, backend: str, old_uid: str, name: str = "w") -> dict[str, Any]:
    def created() -> dict[str, Any] | None:
        job = cluster.job(name, RESOURCES[backend])
        return job if job is not None and job["metadata"]["uid"] != old_uid else None

    child: dict[str, Any] = await wait_for(created, what=f"a new {backend}")
    await wait_for(lambda: (cluster.status(name).get("child") or {}).get("uid") == child["metadata"]["uid"])
    return child


async def _replanned_status(cluster: Cluster, replans: int, name: str = "w") -> None:
    """Waits for the status write of the pass that planned the new child after the `replans`-th re-plan:
    the pod watcher's write (the re-plan's own Planned message) comes first, the pass's follows."""
    learned = f"memory corrected after {replans} out-of-memory run"

    def written() -> bool:
        status = cluster.status(name)
        planned = cluster.condition(name, "Planned") or {}
        return (
            len(status.get("planHistory") or []) == replans
            and (status.get("memoryCorrection") or {}).get("replans") == replans
            and planned.get("reason") == "Replanned"
            and learned in planned.get("message", "")
        )

    await wait_for(written, what=f"the status of re-plan {replans}")


def _chosen_in_config_map(cluster: Cluster, name: str = "w") -> Candidate:
    config_map = cluster.config_map(f"{name}-plan")
    assert config_map is not None
    text = config_map["data"]["plan.json"]
    return Plan.model_validate_json(text).chosen


# ----- the pure part ---------------------------------------------------------------------------------------


def test_the_oom_result_line_is_read_from_the_whole_termination_message() -> None:
    from blackwell_operator.models.spec import BlackwellTrainingJobSpec
    from blackwell_operator.planner import plan_job

    plan = plan_job(BlackwellTrainingJobSpec.model_validate(btj("w")["spec"]))
    message = oom_message(plan)
    ended = container(state={"terminated": terminated(1, "Error", T1, message)})
    failure = worker_failure({**pod("w-worker-0"), "status": pod_status(ended)})
    assert failure is not None
    assert failure["message"] == message.splitlines()[0]  # lastFailure.message stays the first line
    assert OomResult.model_validate(failure["outOfMemory"]) == OomResult.find(message)


# status.lastFailure of an out-of-memory worker (its outOfMemory part is what `result` says).
_WORKER_FAILURE = {"pod": "w-worker-0", "container": "pytorch", "exitCode": 1, "reason": "Error"}


def test_the_history_is_bounded_and_the_correction_belongs_to_its_generation() -> None:
    from blackwell_operator.models.spec import BlackwellTrainingJobSpec
    from blackwell_operator.planner import plan_job

    body = btj("w", tuning={"maxReplans": 10})
    body["metadata"].update(uid="u-btj", generation=4)
    plan = plan_job(BlackwellTrainingJobSpec.model_validate(body["spec"]))
    old = {"at": T1, "generation": 1, "reason": "OutOfMemory", "failed": plan.chosen.model_dump(mode="json")}
    body["status"] = {
        "phase": "Running",
        "observedGeneration": 4,
        "plan": plan.model_dump(by_alias=True, mode="json"),
        "child": {"kind": "PyTorchJob", "name": "w", "uid": "u-job"},
        "planHistory": [old] * PLAN_HISTORY_LIMIT,
    }
    result = OomResult.find(oom_message(plan))
    assert result is not None
    change, entry = replan_changes(
        body, _WORKER_FAILURE, result, failed_reason=PERMANENT_ERROR_REASON, now=NOW
    )
    changes = status_patch(change, body["status"], POD_WATCHER)
    assert len(changes["planHistory"]) == PLAN_HISTORY_LIMIT
    assert changes["planHistory"][-1]["failedChildUid"] == "u-job" and entry.replacement is not None
    assert changes["memoryCorrection"]["generation"] == 4
    assert correction_of({**body, "status": changes}) is not None
    # A spec edit that keeps what it was learned for (model, instance type, nodes, sequence, precision,
    # image) keeps it, rebased onto the new generation; one that changes any of them drops it.
    body["metadata"]["generation"] = 5
    body["spec"]["training"] = {**body["spec"]["training"], "steps": 1200}
    kept = correction_of({**body, "status": changes})
    assert kept is not None and kept.generation == 5 and kept.replans == 1 and kept.excluded
    for field, value in (
        ("training", {**body["spec"]["training"], "sequenceLength": 4096}),
        ("cluster", {**body["spec"]["cluster"], "nodes": 4}),
        ("model", {"preset": "llama3.2-3b"}),
        ("tuning", {"maxReplans": 10, "precision": "bf16"}),
        ("image", "ghcr.io/blackwell-dev/blackwell-trainer:0.2.0"),
    ):
        edited = {**body, "spec": {**body["spec"], field: value}, "status": changes}
        assert correction_of(edited) is None, f"spec.{field} changed: learned for another job"
    pinned = {**body, "spec": {**body["spec"], "tuning": {"maxReplans": 10, "microBatchSize": 2}}}
    assert correction_of({**pinned, "status": changes}) is not None, "a micro-batch pin keeps it"


# ----- the real operator -----------------------------------------------------------------------------------


@pytest.mark.integration
async def test_oom_re_plans_twice_with_new_children_then_fails_naming_what_to_change(
    cluster: Cluster,
) -> None:
    async with running_operator(cluster):
        await cluster.apply(btj("w"))
        first_child = await wait_for(lambda: cluster.job("w"), what="the PyTorchJob")
        await wait_for(lambda: cluster.condition("w", "ChildCreated"), what="ChildCreated")
        first = _plan(cluster)

        # 1: the first plan runs out of memory -> a smaller plan, a new child, the history, the Events.
        await _oom_pod(cluster, "PyTorchJob", "w", "w-worker-0", T1)
        second_child = await _new_child(cluster, "PyTorchJob", first_child["metadata"]["uid"])
        # The child watcher can record the new child before the re-planning pass writes its status.
        await _replanned_status(cluster, 1)
        status = cluster.status("w")
        second = _plan(cluster)
        assert second.chosen != first.chosen
        if family_key(second.chosen) == family_key(first.chosen):
            assert second.chosen.micro_batch_size < first.chosen.micro_batch_size
        assert _chosen_in_config_map(cluster) == second.chosen  # the new child mounts the new plan
        (change,) = status["planHistory"]
        assert change["reason"] == "OutOfMemory"
        assert Candidate.model_validate(change["failed"]) == first.chosen
        assert Candidate.model_validate(change["replacement"]) == second.chosen
        assert change["failedChildUid"] == first_child["metadata"]["uid"]
        assert status["memoryCorrection"]["replans"] == 1
        assert status["memoryCorrection"]["activationScale"] > 1.0
        assert "lastFailure" not in status, "the old child's failure is not the new one's"
        assert cluster.condition("w", "Planned")["reason"] == "Replanned"
        assert "memory corrected after 1 out-of-memory run" in cluster.condition("w", "Planned")["message"]
        (replanned,) = await wait_for(lambda: _events(cluster, "Replanned"), what="the Replanned Event")
        assert (
            replanned["type"] == "Warning"
            and "Re-planning (1 of 2): CUDA out of memory" in replanned["message"]
        )
        (recreated,) = await wait_for(lambda: _events(cluster, "ChildRecreated"), what="ChildRecreated")
        assert "ran out of GPU memory; re-planned" in recreated["message"]

        # 2: the second plan runs out too -> a third plan, neither of the failed ones.
        await _oom_pod(cluster, "PyTorchJob", "w", "w-worker-1", T2)
        third_child = await _new_child(cluster, "PyTorchJob", second_child["metadata"]["uid"])
        await _replanned_status(cluster, 2)
        third = _plan(cluster)
        assert third.chosen not in (first.chosen, second.chosen)
        status = cluster.status("w")
        assert [Candidate.model_validate(c["failed"]) for c in status["planHistory"]] == [
            first.chosen,
            second.chosen,
        ]
        assert status["memoryCorrection"]["replans"] == 2
        assert len(status["memoryCorrection"]["excluded"]) == 2

        # 3: re-plans spent (maxReplans 2) -> Failed, naming what to change; the child is deleted.
        await _oom_pod(cluster, "PyTorchJob", "w", "w-worker-0", T3)
        await wait_for(lambda: cluster.status("w").get("phase") == "Failed", what="phase Failed")
        await wait_for(lambda: cluster.job("w") is None, what="the third child deleted")
        failed = cluster.condition("w", "Failed")
        assert failed is not None and failed["reason"] == PERMANENT_ERROR_REASON
        assert "after 2 re-plans (spec.tuning.maxReplans 2)" in failed["message"]
        assert WHAT_TO_CHANGE in failed["message"]
        assert len(cluster.status("w")["planHistory"]) == 3
        assert cluster.status("w")["planHistory"][-1].get("replacement") is None
        await cluster.settle("w")
        assert cluster.job("w") is None and cluster.status("w")["phase"] == "Failed"
        assert third_child["metadata"]["uid"] != first_child["metadata"]["uid"]
    assert cluster.creates("pytorchjobs") == 3
    assert len(_events(cluster, "Replanned")) == 2


@pytest.mark.integration
async def test_the_correction_survives_an_operator_restart(cluster: Cluster) -> None:
    async with running_operator(cluster):
        await cluster.apply(btj("w"))
        child = await wait_for(lambda: cluster.job("w"), what="the PyTorchJob")
        await wait_for(lambda: cluster.condition("w", "ChildCreated"), what="ChildCreated")
        await _oom_pod(cluster, "PyTorchJob", "w", "w-worker-0", T1)
        replaced = await _new_child(cluster, "PyTorchJob", child["metadata"]["uid"])
        await cluster.settle("w")
        replanned = _plan(cluster).chosen
    # A new operator process resumes the BTJ: it plans with the stored correction, so the child it finds
    # matches (no SpecApplied False, no patch), and the plan stays the corrected one.
    async with running_operator(cluster):
        await cluster.settle("w")
        await wait_for(lambda: cluster.condition("w", "SpecApplied"), what="SpecApplied")
        assert cluster.condition("w", "SpecApplied")["status"] == "True"
        assert _plan(cluster).chosen == replanned
        job = cluster.job("w")
        assert job is not None and job["metadata"]["uid"] == replaced["metadata"]["uid"]
    assert cluster.creates("pytorchjobs") == 2


@pytest.mark.integration
async def test_an_edit_and_a_hand_deletion_keep_the_correction_and_the_budget(cluster: Cluster) -> None:
    async with running_operator(cluster):
        await cluster.apply(btj("w"))
        child = await wait_for(lambda: cluster.job("w"), what="the PyTorchJob")
        await wait_for(lambda: cluster.condition("w", "ChildCreated"), what="ChildCreated")
        failed = _plan(cluster).chosen
        await _oom_pod(cluster, "PyTorchJob", "w", "w-worker-0", T1)
        replaced = await _new_child(cluster, "PyTorchJob", child["metadata"]["uid"])
        await cluster.settle("w")
        # An edit that does not change what the correction was learned for, then a hand deletion.
        await cluster.patch_spec("w", {"training": {"sequenceLength": 8192, "steps": 1200}})
        await wait_for(lambda: cluster.status("w").get("observedGeneration") == 2, what="the edit reconciled")
        await cluster.delete_child("w")
        await _new_child(cluster, "PyTorchJob", replaced["metadata"]["uid"])
        await cluster.settle("w")
        status = cluster.status("w")
    chosen = _chosen_in_config_map(cluster)
    assert chosen != failed, "the configuration that ran out of memory is not run again"
    assert chosen == _plan(cluster).chosen and cluster.condition("w", "Planned")["reason"] == "Replanned"
    correction = status["memoryCorrection"]
    assert correction["replans"] == 1, "the re-plan budget is kept, not started over"
    assert correction["excluded"] and len(status["planHistory"]) == 1
    assert cluster.creates("pytorchjobs") == 3


@pytest.mark.integration
@pytest.mark.parametrize("backend", ["HyperPodPyTorchJob", "TrainJob"])
async def test_every_backend_gets_a_re_planned_child(
    cluster: Cluster, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()
    monkeypatch.setenv("BTJ_METRICS_BIND", f"127.0.0.1:{port}")
    async with running_operator(cluster), aiohttp.ClientSession() as http:
        await cluster.apply(btj("w", backend=backend))
        child = await wait_for(lambda: cluster.job("w", RESOURCES[backend]), what=f"the {backend}")
        await wait_for(lambda: cluster.condition("w", "ChildCreated"), what="ChildCreated")
        first = _plan(cluster)
        await _oom_pod(cluster, backend, "w", "w-worker-0", T1)
        await _new_child(cluster, backend, child["metadata"]["uid"])
        assert _plan(cluster).chosen != first.chosen
        assert _chosen_in_config_map(cluster) == _plan(cluster).chosen
        assert cluster.status("w")["planHistory"][0]["failedChildUid"] == child["metadata"]["uid"]
        await wait_for(lambda: _events(cluster, "Replanned"), what="the Replanned Event")
        async with http.get(f"http://127.0.0.1:{port}/metrics") as response:
            text = await response.text()
        (family,) = [f for f in text_string_to_metric_families(text) if f.name == "btj_operator_replans"]
        assert [s.value for s in family.samples if s.name == "btj_operator_replans_total"] == [1.0]
