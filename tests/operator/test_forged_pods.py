"""A pod that merely looks like a trainer changes nothing: only pods whose controllers lead, uid by uid, to
the BTJ's own child count (lifecycle/ownership.py). The real operator under KopfRunner against KMock."""

from __future__ import annotations

from typing import Any

import pytest

from blackwell_operator.lifecycle.failures import PERMANENT_ERROR_REASON
from blackwell_operator.models.spec import Backend, BlackwellTrainingJobSpec
from blackwell_operator.planner import plan_job
from blackwell_operator.render.kinds import JOB_KINDS
from tests.operator.harness import NAMESPACE, Cluster, btj, from_operator, running_operator, wait_for
from tests.operator.test_replan import oom_message
from tests.operator.test_trainjob_lifecycle import node_job, trainer_pod, trainjob, trainjob_btj
from tests.support.pods import PERMANENT_TRAINER_ERROR as PERMANENT
from tests.support.pods import RESTARTING, T2, container, pod, pod_status, terminated

IGNORED = "carries the trainer's labels but no BlackwellTrainingJob's job controls it"


def _ignored(caplog: pytest.LogCaptureFixture, name: str) -> bool:
    """Whether the operator said it ignored pod `name` (its one warning per forged failure)."""
    return any(IGNORED in r.getMessage() and f"/{name} " in r.getMessage() for r in caplog.records)


def _ended(message: str, name: str = "pytorch") -> dict[str, Any]:
    return pod_status(container(state={"terminated": terminated(1, "Error", T2, message)}, name=name))


def _operator_deletes(cluster: Cluster) -> list[str]:
    return [str(r.path) for r in cluster.k.requests if from_operator(r) and r.method.value == "DELETE"]


@pytest.mark.integration
async def test_a_forged_pod_fails_nothing_deletes_nothing_and_replans_nothing(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    async with running_operator(cluster):
        job = await cluster.restarting_job("w", RESTARTING)
        before = cluster.status("w")
        oom = oom_message(plan_job(BlackwellTrainingJobSpec.model_validate(btj("w")["spec"])))

        # The trainer's labels and a permanent error, owned by nothing.
        await cluster.add_pod(pod("w-worker-7"), _ended(PERMANENT))
        # The child's kind and name in a controller reference, but another live object's uid (the BTJ's:
        # a made-up one is garbage-collected, as a real cluster does), and an out-of-memory line.
        btj_uid = (cluster.btj("w") or {})["metadata"]["uid"]
        made_up = {**job, "metadata": {"name": "w", "uid": btj_uid}}
        await cluster.add_pod(pod("w-worker-8", owner=made_up), _ended(oom))
        # A Job of one's own (controlled by nothing) as the pod's controller: not how a PyTorchJob owns pods.
        decoy = await cluster._json(
            "POST",
            f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs",
            {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "w-decoy"}, "spec": {}},
        )
        await cluster.add_pod(pod("w-worker-9", owner=decoy), _ended(PERMANENT))
        for name in ("w-worker-7", "w-worker-8", "w-worker-9"):
            await wait_for(lambda n=name: _ignored(caplog, n), what=f"{name} ignored")
        await cluster.settle("w")

        after = cluster.status("w")
        assert after["phase"] == "Restarting" and "lastFailure" not in after
        assert (
            after["plan"] == before["plan"] and "planHistory" not in after and "memoryCorrection" not in after
        )
        assert (cluster.job("w") or {})["metadata"]["uid"] == job["metadata"]["uid"]
        assert cluster.creates("pytorchjobs") == 1 and not _operator_deletes(cluster)
        assert not [e for e in cluster.events("w") if e.get("reason") in ("WorkerFailed", "Replanned")]

        # The child's own worker still counts.
        await cluster.add_pod(pod("w-worker-0", owner=job), _ended(PERMANENT))
        await wait_for(lambda: cluster.job("w") is None, what="the child deleted")
        failed = await wait_for(lambda: cluster.condition("w", "Failed"), what="condition Failed")
        assert failed["reason"] == PERMANENT_ERROR_REASON


@pytest.mark.integration
async def test_a_trainjob_pod_counts_only_through_its_own_jobset_and_job(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    async with running_operator(cluster):
        await cluster.apply(trainjob_btj("tj"))
        train = await wait_for(lambda: trainjob(cluster, "tj"), what="the TrainJob")
        await wait_for(lambda: cluster.condition("tj", "ChildCreated"), what="ChildCreated")
        # A Job named like JobSet's, made by someone else and controlled by nothing: its pod is ignored.
        stray = await cluster._json(
            "POST",
            f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs",
            {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "tj-node-0"}, "spec": {}},
        )
        await cluster.add_pod(trainer_pod("tj-node-0-0-forge", "tj", "tj", stray), _ended(PERMANENT, "node"))
        await wait_for(lambda: _ignored(caplog, "tj-node-0-0-forge"), what="the forged pod ignored")
        await cluster.settle("tj")
        assert cluster.status("tj").get("phase") != "Failed" and "lastFailure" not in cluster.status("tj")
        assert (trainjob(cluster, "tj") or {})["metadata"]["uid"] == train["metadata"]["uid"]

        # The genuine chain, TrainJob -> JobSet -> Job -> Pod: its permanent error stops the job.
        owner = await node_job(cluster, "tj", "tj-node-1")
        await cluster.add_pod(trainer_pod("tj-node-1-0-abcde", "tj", "tj", owner), _ended(PERMANENT, "node"))
        await wait_for(lambda: trainjob(cluster, "tj") is None, what="the TrainJob deleted")
        assert (cluster.condition("tj", "Failed") or {}).get("reason") == PERMANENT_ERROR_REASON
    assert JOB_KINDS[Backend.TRAIN_JOB].kind == train["kind"]
