"""The real operator (KopfRunner) against the hardened KMock API server: create, follow, update, delete."""

from __future__ import annotations

import json

import pytest

from blackwell_trainer.plan.config import Plan
from tests.operator.harness import (
    HYPERPODJOBS,
    NAMESPACE,
    Cluster,
    btj,
    running_operator,
    wait_for,
)

pytestmark = pytest.mark.integration


async def test_apply_creates_configmap_and_pytorchjob_with_owner_and_plan(cluster: Cluster) -> None:
    async with running_operator(cluster) as runner:
        created = await cluster.apply(btj("llama"))
        await wait_for(lambda: cluster.status("llama").get("phase") == "Pending", what="phase Pending")
        # The child watcher can set the phase first; ChildCreated comes only with reconcile's status write.
        await wait_for(lambda: cluster.condition("llama", "ChildCreated"), what="ChildCreated")
        await wait_for(lambda: cluster.events("llama"), what="an Event")
        job, config_map = cluster.job("llama"), cluster.config_map("llama-plan")
    assert runner.exception is None and runner.exit_code == 0
    assert job is not None and config_map is not None
    uid = created["metadata"]["uid"]
    for child in (job, config_map):
        (ref,) = child["metadata"]["ownerReferences"]
        assert ref == {
            "apiVersion": "training.blackwell.dev/v1alpha1",
            "kind": "BlackwellTrainingJob",
            "name": "llama",
            "uid": uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
        # The parent's own labels propagate, Argo CD's tracking label does not.
        assert child["metadata"]["labels"]["team"] == "a"
        assert "app.kubernetes.io/instance" not in child["metadata"]["labels"]
    status = cluster.status("llama")
    plan = json.loads(config_map["data"]["plan.json"])
    # Beside the plan, the job it is for: the trainer records it in every checkpoint (docs/trainer.md).
    assert json.loads(config_map["data"]["job.json"]) == {"namespace": NAMESPACE, "name": "llama", "uid": uid}
    # status.plan is the trainer's plan file (nulls dropped: a merge patch cannot carry them).
    assert Plan.model_validate(status["plan"]) == Plan.model_validate(plan)
    assert status["precision"] == plan["chosen"]["precision"]
    assert status["microBatchSize"] == plan["chosen"]["microBatchSize"]
    assert status["activationCheckpointing"] == plan["chosen"]["activationCheckpointing"]
    assert status["observedGeneration"] == 1
    assert status["child"] == {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "name": "llama",
        "uid": job["metadata"]["uid"],
        "configMap": "llama-plan",
    }
    types = {c["type"]: c for c in status["conditions"]}
    assert types["Planned"]["status"] == "True"
    assert types["ChildCreated"]["status"] == "True" and types["ChildCreated"]["reason"] == "Created"
    assert types["CapacityAvailable"]["status"] == "True"
    assert all(c["observedGeneration"] == 1 and c["lastTransitionTime"] for c in status["conditions"])
    # Kubernetes Events name what happened.
    assert any(
        e["reason"] == "Created" and "PyTorchJob llama" in e["message"] for e in cluster.events("llama")
    )


async def test_btj_follows_the_pytorchjob_through_its_life(cluster: Cluster) -> None:
    async with running_operator(cluster):
        await cluster.apply(btj("follow", queueName="hyperpod-ns-team-a-localqueue"))
        await wait_for(lambda: cluster.job("follow"), what="the PyTorchJob")

        async def step(conditions: list[dict[str, str]], phase: str) -> None:
            await cluster.set_child_status("follow", {"conditions": conditions})
            await wait_for(lambda: cluster.status("follow").get("phase") == phase, what=f"phase {phase}")

        suspended = {
            "type": "Suspended",
            "status": "True",
            "reason": "PyTorchJobSuspended",
            "message": "PyTorchJob follow is suspended.",
        }
        await step([suspended], "Queued")
        assert cluster.condition("follow", "Admitted")["status"] == "False"

        created = {"type": "Created", "status": "True", "reason": "PyTorchJobCreated", "message": "created"}
        resumed = {**suspended, "status": "False", "reason": "PyTorchJobResumed"}
        running = {
            "type": "Running",
            "status": "True",
            "reason": "PyTorchJobRunning",
            "message": "PyTorchJob follow is running.",
        }
        await step([created, resumed, running], "Running")
        admitted = cluster.condition("follow", "Admitted")
        assert admitted["status"] == "True"
        running_since = cluster.condition("follow", "Running")["lastTransitionTime"]

        restarting = {
            "type": "Restarting",
            "status": "True",
            "reason": "PyTorchJobRestarting",
            "message": "worker-1 exited with 137",
        }
        await step([created, resumed, {**running, "status": "False"}, restarting], "Restarting")
        assert "137" in cluster.status("follow")["message"]

        await step([created, resumed, {**restarting, "status": "False"}, running], "Running")
        succeeded = {
            "type": "Succeeded",
            "status": "True",
            "reason": "PyTorchJobSucceeded",
            "message": "PyTorchJob follow is successfully completed.",
        }
        await step([created, resumed, {**running, "status": "False"}, succeeded], "Succeeded")
        assert cluster.condition("follow", "Succeeded")["status"] == "True"
        assert cluster.condition("follow", "Running")["status"] == "False"
        # lastTransitionTime moves only on a flip: Admitted stayed True all along.
        assert cluster.condition("follow", "Admitted")["lastTransitionTime"] == admitted["lastTransitionTime"]
        assert running_since
        # Events are posted asynchronously by Kopf's poster.
        wanted = {"Queued", "Running", "Restarting", "Succeeded"}
        await wait_for(lambda: wanted <= {e["reason"] for e in cluster.events("follow")}, what="phase Events")


async def test_failed_job_fails_the_btj(cluster: Cluster) -> None:
    async with running_operator(cluster):
        await cluster.apply(btj("doomed"))
        await wait_for(lambda: cluster.job("doomed"), what="the PyTorchJob")
        await cluster.set_child_status(
            "doomed",
            {
                "conditions": [
                    {"type": "Created", "status": "True", "reason": "PyTorchJobCreated", "message": ""},
                    {
                        "type": "Failed",
                        "status": "True",
                        "reason": "PyTorchJobFailed",
                        "message": "PyTorchJob doomed has failed because it has reached the specified "
                        "backoff limit",
                    },
                ]
            },
        )
        await wait_for(lambda: cluster.status("doomed").get("phase") == "Failed", what="phase Failed")
        await wait_for(
            lambda: any(e["reason"] == "Failed" and e["type"] == "Warning" for e in cluster.events("doomed")),
            what="a Failed warning Event",
        )
    failed = cluster.condition("doomed", "Failed")
    assert failed["status"] == "True" and "backoff limit" in failed["message"]


async def test_hyperpod_backend_creates_a_hyperpodpytorchjob(cluster: Cluster) -> None:
    async with running_operator(cluster):
        await cluster.apply(btj("hp", backend="HyperPodPyTorchJob"))
        await wait_for(lambda: cluster.condition("hp", "ChildCreated"), what="ChildCreated")
        job = cluster.job("hp", "sagemaker.amazonaws.com/v1/hyperpodpytorchjobs")
        assert job is not None and job["kind"] == "HyperPodPyTorchJob"
        assert cluster.status("hp")["child"]["kind"] == "HyperPodPyTorchJob"
        await cluster.set_child_status(
            "hp",
            {
                "conditions": [
                    {"type": "Completed", "status": "True", "reason": "AllPodsCompleted", "message": "done"}
                ]
            },
            collection=HYPERPODJOBS,
        )
        await wait_for(lambda: cluster.status("hp").get("phase") == "Succeeded", what="phase Succeeded")


async def test_dry_run_plans_and_creates_nothing(cluster: Cluster) -> None:
    async with running_operator(cluster):
        await cluster.apply(btj("dry", dryRun=True))
        await wait_for(lambda: cluster.status("dry").get("phase") == "Planned", what="phase Planned")
    status = cluster.status("dry")
    assert status["plan"]["jobName"] == "dry"
    assert cluster.condition("dry", "ChildCreated")["reason"] == "DryRun"
    assert cluster.job("dry") is None and cluster.config_map("dry-plan") is None
    assert cluster.creates("pytorchjobs") == 0 and cluster.creates("configmaps") == 0


async def test_spec_change_before_start_patches_the_job(cluster: Cluster) -> None:
    async with running_operator(cluster):
        await cluster.apply(btj("edit"))
        await wait_for(lambda: cluster.status("edit").get("observedGeneration") == 1, what="generation 1")
        first_plan = cluster.status("edit")["plan"]
        await cluster.patch_spec("edit", {"training": {"sequenceLength": 4096, "steps": 1000}})
        await wait_for(lambda: cluster.status("edit").get("observedGeneration") == 2, what="generation 2")
        job, config_map = cluster.job("edit"), cluster.config_map("edit-plan")
    status = cluster.status("edit")
    assert status["plan"]["sequenceLength"] == 4096 != first_plan["sequenceLength"]
    assert json.loads(config_map["data"]["plan.json"])["sequenceLength"] == 4096
    assert cluster.condition("edit", "SpecApplied")["reason"] == "Patched"
    assert job is not None and job["metadata"]["generation"] == 2
    assert cluster.creates("pytorchjobs") == 1


async def test_spec_change_of_a_running_job_is_reported_not_applied(cluster: Cluster) -> None:
    async with running_operator(cluster):
        await cluster.apply(btj("busy"))
        await wait_for(lambda: cluster.job("busy"), what="the PyTorchJob")
        await cluster.set_child_status(
            "busy",
            {
                "startTime": "2026-01-01T00:00:00Z",
                "conditions": [
                    {"type": "Created", "status": "True", "reason": "PyTorchJobCreated", "message": ""},
                    {
                        "type": "Running",
                        "status": "True",
                        "reason": "PyTorchJobRunning",
                        "message": "running",
                    },
                ],
            },
        )
        await wait_for(lambda: cluster.status("busy").get("phase") == "Running", what="phase Running")
        await wait_for(lambda: cluster.condition("busy", "ChildCreated"), what="ChildCreated (status.plan)")
        plan_before = cluster.status("busy")["plan"]
        job_before = cluster.job("busy")
        await cluster.patch_spec("busy", {"cluster": {"instanceType": "ml.p6-b200.48xlarge", "nodes": 4}})
        await wait_for(lambda: cluster.status("busy").get("observedGeneration") == 2, what="generation 2")
        await wait_for(
            lambda: any(e["reason"] == "RunningJobImmutable" for e in cluster.events("busy")),
            what="a RunningJobImmutable Event",
        )
    applied = cluster.condition("busy", "SpecApplied")
    assert applied["status"] == "False" and applied["reason"] == "RunningJobImmutable"
    assert "delete and re-create" in applied["message"]
    assert cluster.job("busy")["spec"] == job_before["spec"], "the running job is untouched"
    assert cluster.status("busy")["plan"] == plan_before, "status.plan still describes what runs"
    assert cluster.status("busy")["phase"] == "Running"


async def test_delete_removes_the_children_through_owner_references(cluster: Cluster) -> None:
    async with running_operator(cluster):
        await cluster.apply(btj("gone"))
        await wait_for(lambda: cluster.job("gone") and cluster.config_map("gone-plan"), what="children")
        await cluster.delete_btj("gone")
        await wait_for(lambda: cluster.btj("gone") is None, what="the BTJ to go")
        # The job's final-status finalizer is released by the operator once it sees the job going.
        await wait_for(lambda: cluster.job("gone") is None, what="the job released")
    # No finalizer was needed: the BTJ went at once, and the (emulated) garbage collector took the children.
    assert cluster.job("gone") is None and cluster.config_map("gone-plan") is None
    assert not any(
        "finalizers" in (v or {}).get("metadata", {})
        for v in cluster.k.objects[
            "training.blackwell.dev/v1alpha1/blackwelltrainingjobs", NAMESPACE, "gone"
        ].history
        if v
    )
