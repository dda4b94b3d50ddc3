"""backend: TrainJob under the real operator (KopfRunner) and the KMock API server: the whole lifecycle."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from blackwell_operator.lifecycle.measure import metrics_endpoint
from blackwell_operator.render.labels import own_labels
from blackwell_operator.testing.emulator import TRAINING_RUNTIME_RESOURCE, TRAINJOB_RESOURCE
from blackwell_trainer.plan.config import PERMANENT_ERROR_PREFIX
from tests.operator.harness import NAMESPACE, TRAINJOBS, Cluster, btj, running_operator, wait_for
from tests.support.pods import T1, T2, container, pod_status, terminated, worker_template

pytestmark = pytest.mark.integration

TRAINER_ERROR = "error: loss is NaN at step 12"


def trainjob_btj(name: str, **spec: Any) -> dict[str, Any]:
    return btj(name, backend="TrainJob", **spec)


def condition(type_: str, status: str = "True", reason: str = "", message: str = "") -> dict[str, Any]:
    """One TrainJob condition as Trainer v2 writes it (types Suspended, Complete, Failed only)."""
    return {"type": type_, "status": status, "reason": reason or type_, "message": message}


def jobs_status(**counts: int) -> list[dict[str, Any]]:
    """status.jobsStatus of the one replicated job, `node`."""
    base = {"active": 0, "ready": 0, "succeeded": 0, "failed": 0, "suspended": 0}
    return [{"name": "node", **base, **counts}]


RUNNING = {
    "conditions": [condition("Suspended", "False", "Resumed")],
    "jobsStatus": jobs_status(active=1, ready=1),
}


def trainjob(cluster: Cluster, name: str) -> dict[str, Any] | None:
    return cluster.job(name, TRAINJOB_RESOURCE)


def runtime(cluster: Cluster, name: str) -> dict[str, Any] | None:
    return cluster.job(name, TRAINING_RUNTIME_RESOURCE)


def _controller(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj["metadata"]
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


async def node_job(cluster: Cluster, trainjob_name: str, job_name: str | None = None) -> dict[str, Any]:
    """The batch Job that JobSet creates for the replicated job `node` (it owns the pods), under the JobSet
    that Trainer v2 creates for the TrainJob (made here when it is not there yet): the owner chain
    TrainJob -> JobSet -> Job the operator checks a pod's result along. The paths are spelled out on
    purpose: they are what JobSet and Trainer v2 serve."""
    jobsets = f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{NAMESPACE}/jobsets"
    train = await wait_for(lambda: trainjob(cluster, trainjob_name), what="the TrainJob")

    def current() -> dict[str, Any] | None:
        return cluster.k.get_object("jobset.x-k8s.io/v1alpha2/jobsets", NAMESPACE, trainjob_name)

    def of_this_trainjob(jobset: dict[str, Any]) -> bool:
        return any(
            r["uid"] == train["metadata"]["uid"] for r in jobset["metadata"].get("ownerReferences", [])
        )

    jobset = current()
    if jobset is not None and not of_this_trainjob(jobset):  # a replaced TrainJob's: collected with it
        await wait_for(lambda: current() is None, what="the previous JobSet to be garbage-collected")
        jobset = None
    if jobset is None:
        body = {
            "apiVersion": "jobset.x-k8s.io/v1alpha2",
            "kind": "JobSet",
            "metadata": {"name": trainjob_name, "ownerReferences": [_controller(train)]},
        }
        jobset = await cluster._json("POST", jobsets, body)
    # JobSet copies the replicated job's template (from the TrainJob's TrainingRuntime) into the Job.
    the_runtime = await wait_for(lambda: runtime(cluster, trainjob_name), what="the TrainingRuntime")
    (replicated,) = the_runtime["spec"]["template"]["spec"]["replicatedJobs"]
    job: dict[str, Any] = await cluster._json(
        "POST",
        f"/apis/batch/v1/namespaces/{NAMESPACE}/jobs",
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": job_name or f"{trainjob_name}-node-0",
                "ownerReferences": [_controller(jobset)],
            },
            "spec": replicated["template"]["spec"],
        },
    )
    return job


def trainer_pod(
    name: str, job: str, trainjob_name: str, owner: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A pod of a TrainJob as JobSet's Job creates it, owned by a Job: from the Job's pod template when it
    carries one (the Job controller copies it), else a bare `node` container; our template labels plus
    JobSet's."""
    uid = (owner or {}).get("metadata", {}).get("uid", "00000000-0000-4000-8000-000000000001")
    owner_name = (owner or {}).get("metadata", {}).get("name", f"{trainjob_name}-node-0")
    template = worker_template(owner) if owner is not None else None
    labels = dict((template or {}).get("metadata", {}).get("labels") or own_labels(job))
    bare = {"containers": [{"name": "node", "image": "ghcr.io/blackwell-dev/blackwell-trainer:0.1.0"}]}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "labels": {**labels, "jobset.sigs.k8s.io/jobset-name": trainjob_name},
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": owner_name,
                    "uid": uid,
                    "controller": True,
                }
            ],
        },
        "spec": copy.deepcopy(dict(template["spec"])) if template is not None else bare,
    }


async def set_status(cluster: Cluster, name: str, status: dict[str, Any]) -> None:
    await cluster.set_child_status(name, status, collection=TRAINJOBS)


async def test_a_trainjob_goes_through_its_whole_life(cluster: Cluster) -> None:
    async with running_operator(cluster):
        created = await cluster.apply(trainjob_btj("tj", queueName="hyperpod-ns-team-a-localqueue"))
        await wait_for(lambda: cluster.condition("tj", "ChildCreated"), what="ChildCreated")
        job, rt, config_map = trainjob(cluster, "tj"), runtime(cluster, "tj"), cluster.config_map("tj-plan")
        assert job is not None and rt is not None and config_map is not None
        for child in (job, rt, config_map):
            (ref,) = child["metadata"]["ownerReferences"]
            assert ref["uid"] == created["metadata"]["uid"] and ref["controller"] is True
        assert job["spec"]["runtimeRef"]["name"] == "tj" and job["spec"]["trainer"]["numNodes"] == 2
        assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "hyperpod-ns-team-a-localqueue"
        assert cluster.status("tj")["child"] == {
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "TrainJob",
            "name": "tj",
            "uid": job["metadata"]["uid"],
            "configMap": "tj-plan",
        }
        assert cluster.status("tj")["phase"] == "Pending"

        # Kueue suspends it: Queued; admitted and its pods ready: Running.
        await set_status(cluster, "tj", {"conditions": [condition("Suspended", message="queued by Kueue")]})
        await wait_for(lambda: cluster.status("tj").get("phase") == "Queued", what="phase Queued")
        assert cluster.condition("tj", "Admitted")["status"] == "False"
        await set_status(cluster, "tj", RUNNING)
        await wait_for(lambda: cluster.status("tj").get("phase") == "Running", what="phase Running")
        assert cluster.condition("tj", "Admitted")["status"] == "True"
        assert cluster.condition("tj", "Running")["status"] == "True"

        # A worker fails (its container is `node`); JobSet re-creates the gang: Restarting.
        failed = container(state={"terminated": terminated(1, "Error", T1, TRAINER_ERROR)}, name="node")
        owner = await node_job(cluster, "tj")
        await cluster.add_pod(trainer_pod("tj-node-0-0-abcde", "tj", "tj", owner), pod_status(failed))
        await wait_for(lambda: cluster.status("tj").get("lastFailure"), what="lastFailure")
        assert cluster.status("tj")["lastFailure"]["container"] == "node"
        await set_status(cluster, "tj", {"jobsStatus": jobs_status(failed=1)})
        await wait_for(lambda: cluster.status("tj").get("phase") == "Restarting", what="phase Restarting")
        assert (
            f"last worker failure: pod tj-node-0-0-abcde exit 1 (Error): {TRAINER_ERROR}"
            in (cluster.status("tj")["message"])
        )

        # Deleted by hand while it runs: re-created from the same plan and runtime.
        first = job["metadata"]["uid"]
        await cluster.delete_child("tj", collection=TRAINJOBS)
        await wait_for(
            lambda: (cluster.status("tj").get("child") or {}).get("uid") not in (None, first),
            what="the re-created TrainJob recorded",
        )
        await wait_for(
            lambda: "ChildRecreated" in [e["reason"] for e in cluster.events("tj")], what="ChildRecreated"
        )
        assert trainjob(cluster, "tj") is not None and cluster.creates("trainjobs") == 2
        await set_status(cluster, "tj", RUNNING)
        await wait_for(lambda: cluster.status("tj").get("phase") == "Running", what="Running again")

        await set_status(
            cluster,
            "tj",
            {
                "conditions": [
                    condition("Suspended", "False", "Resumed"),
                    condition("Complete", message="jobset completed"),
                ],
                "jobsStatus": jobs_status(succeeded=1),
            },
        )
        await wait_for(lambda: cluster.status("tj").get("phase") == "Succeeded", what="phase Succeeded")
        assert cluster.condition("tj", "Succeeded")["status"] == "True"
        assert cluster.condition("tj", "Running")["status"] == "False"

        # Its TTL (or a hand) deletes the finished TrainJob: reported, never run again.
        await cluster.delete_child("tj", collection=TRAINJOBS)
        await wait_for(
            lambda: cluster.condition("tj", "ChildCreated")["reason"] == "ChildDeleted", what="ChildDeleted"
        )
        await cluster.settle("tj")
    assert cluster.creates("trainjobs") == 2 and trainjob(cluster, "tj") is None
    assert cluster.status("tj")["phase"] == "Succeeded"


async def test_a_failed_trainjob_fails_the_btj(cluster: Cluster) -> None:
    async with running_operator(cluster):
        await cluster.apply(trainjob_btj("tjf"))
        await wait_for(lambda: trainjob(cluster, "tjf"), what="the TrainJob")
        await set_status(
            cluster,
            "tjf",
            {
                "conditions": [condition("Failed", reason="FailedMaxRestarts", message="jobset failed")],
                "jobsStatus": jobs_status(failed=1),
            },
        )
        await wait_for(lambda: cluster.status("tjf").get("phase") == "Failed", what="phase Failed")
        await wait_for(
            lambda: any(e["reason"] == "Failed" and e["type"] == "Warning" for e in cluster.events("tjf")),
            what="a Failed warning Event",
        )
    failed = cluster.condition("tjf", "Failed")
    assert failed["status"] == "True" and failed["message"] == "jobset failed"


async def test_a_permanent_worker_error_deletes_the_trainjob(cluster: Cluster) -> None:
    async with running_operator(cluster):
        await cluster.apply(trainjob_btj("tjp"))
        await wait_for(lambda: cluster.condition("tjp", "ChildCreated"), what="ChildCreated")
        await set_status(cluster, "tjp", RUNNING)
        await wait_for(lambda: cluster.status("tjp").get("phase") == "Running", what="phase Running")
        message = f"{PERMANENT_ERROR_PREFIX}the plan does not fit"
        failed = container(state={"terminated": terminated(1, "Error", T2, message)}, name="node")
        owner = await node_job(cluster, "tjp")
        await cluster.add_pod(trainer_pod("tjp-node-0-0-fghij", "tjp", "tjp", owner), pod_status(failed))
        await wait_for(lambda: trainjob(cluster, "tjp") is None, what="the TrainJob deleted")
        await cluster.settle("tjp")
    assert cluster.status("tjp")["phase"] == "Failed"
    assert cluster.condition("tjp", "Failed")["reason"] == "PermanentError"
    assert cluster.creates("trainjobs") == 1


async def test_a_spec_change_before_start_patches_the_runtime(cluster: Cluster) -> None:
    async with running_operator(cluster):
        await cluster.apply(trainjob_btj("tjs"))
        await wait_for(lambda: runtime(cluster, "tjs"), what="the TrainingRuntime")
        await cluster.patch_spec("tjs", {"image": "registry.example/trainer:2"})

        def image() -> str:
            rt = runtime(cluster, "tjs") or {}
            (job,) = rt["spec"]["template"]["spec"]["replicatedJobs"]
            return str(job["template"]["spec"]["template"]["spec"]["containers"][0]["image"])

        await wait_for(lambda: image() == "registry.example/trainer:2", what="the runtime patched")
        await wait_for(
            lambda: cluster.condition("tjs", "SpecApplied")["reason"] == "Patched", what="SpecApplied"
        )
        # A node-count change: the TrainJob's trainer is immutable, so it is reported, not sent.
        await cluster.patch_spec("tjs", {"cluster": {"instanceType": "ml.p6-b200.48xlarge", "nodes": 1}})
        await wait_for(
            lambda: cluster.condition("tjs", "SpecApplied")["reason"] == "TrainJobImmutable",
            what="SpecApplied False",
        )
        await cluster.settle("tjs")
    assert (trainjob(cluster, "tjs") or {})["spec"]["trainer"]["numNodes"] == 2
    assert cluster.condition("tjs", "SpecApplied")["status"] == "False"


def test_the_measure_loop_reads_a_trainjob_pod_s_node_container() -> None:
    pod = trainer_pod("tj-node-0-0-abcde", "tj", "tj")
    pod["spec"]["containers"][0]["ports"] = [{"name": "metrics", "containerPort": 9400}]
    pod["status"] = {"phase": "Running", "podIP": "10.1.2.3"}
    assert metrics_endpoint(pod) == "http://10.1.2.3:9400/metrics"
