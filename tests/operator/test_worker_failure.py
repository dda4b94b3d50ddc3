"""A failed trainer container reaches the BTJ: status.lastFailure, the message, one WorkerFailed Event.

Pure tests of lifecycle.failures, then the real operator under KopfRunner against the emulator,
with pods written the way the training operator (create) and the kubelet (/status) write them.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from blackwell_operator.handlers.runtime import PODS_ON_NODES
from blackwell_operator.lifecycle.failures import (
    belongs_to,
    failure_changes,
    first_line,
    supersedes,
    worker_failure,
)
from blackwell_operator.lifecycle.message import FAILURE_SEPARATOR, describe, status_message
from blackwell_operator.lifecycle.ownership import Lineage, Reader, lineage
from blackwell_operator.lifecycle.status_patch import status_patch
from blackwell_operator.lifecycle.writers import POD_WATCHER
from blackwell_operator.models.status import StatusChange, WorkerFailure
from blackwell_operator.render.labels import JOB_NAME_LABEL
from tests.operator.harness import NAMESPACE, Cluster, from_operator, running_operator, verb_of, wait_for
from tests.support.pods import (
    RESTARTING,
    T1,
    T2,
    T3,
    container,
    job_condition,
    pod,
    pod_status,
    terminated,
    verified,
)

# metav1.Time the pure functions stamp their conditions and history with (the clock is passed in).
NOW = "2026-12-01T12:00:00Z"

TRAINER_ERROR = (
    "error: btj-trainer: spec.tuning.microBatchSize=12: permanent error: the plan needs 181.2 GiB per GPU "
    "and the GPU has 178.4 GiB. Fix: set spec.tuning.microBatchSize to 10 or less"
)
# status.lastFailure of w-worker-0 ending on TRAINER_ERROR at T1.
WORKER_0_FAILED = {
    "pod": "w-worker-0",
    "container": "pytorch",
    "exitCode": 1,
    "reason": "Error",
    "message": TRAINER_ERROR,
    "finishedAt": T1,
}


# ----- the pure part ---------------------------------------------------------------------------------------


def test_a_failed_trainer_container_becomes_a_failure() -> None:
    body = pod("w-worker-0")
    body["status"] = pod_status(
        container(state={"terminated": terminated(1, "Error", T1, f"\n  {TRAINER_ERROR}  \nsecond line\n")})
    )
    assert worker_failure(body) == WORKER_0_FAILED
    WorkerFailure.model_validate(worker_failure(body))  # the status model (and so the CRD) accepts it


def test_a_restarted_container_reports_its_previous_failure() -> None:
    body = pod("w-worker-0")
    body["status"] = pod_status(container(last={"terminated": terminated(137, "OOMKilled", T1)}))
    failure = worker_failure(body)
    assert failure is not None and failure["exitCode"] == 137 and failure["message"] == ""
    # The current end wins over the previous one.
    body["status"] = pod_status(
        container(
            state={"terminated": terminated(2, "Error", T2, "x")},
            last={"terminated": terminated(137, "OOMKilled", T1)},
        )
    )
    assert (worker_failure(body) or {})["exitCode"] == 2


@pytest.mark.parametrize(
    "status",
    [
        None,
        pod_status(),
        pod_status(container()),
        pod_status(container(state={"terminated": terminated(0, "Completed", T1)})),
        pod_status(container(state={"waiting": {"reason": "CrashLoopBackOff"}})),
        # Another container's failure (a sidecar) is not the trainer's.
        pod_status(container(state={"terminated": terminated(1, "Error", T1)}, name="sidecar")),
    ],
)
def test_no_failure_without_a_non_zero_trainer_exit(status: dict[str, Any] | None) -> None:
    body = pod("w-worker-0")
    if status is not None:
        body["status"] = status
    assert worker_failure(body) is None


def test_the_message_is_one_line_of_at_most_512_characters() -> None:
    assert first_line("\n\n  a  \nb") == "a"
    assert first_line(None) == "" and first_line(" \n ") == ""
    assert len(first_line("x" * 5000)) == 512
    body = pod("w-worker-0")
    body["status"] = pod_status(container(state={"terminated": terminated(1, "Error", T1, "é" * 600)}))
    WorkerFailure.model_validate(worker_failure(body))


def test_an_oom_kill_reads_as_host_memory() -> None:
    oom = {"pod": "w-worker-1", "exitCode": 137, "reason": "OOMKilled", "message": ""}
    text = describe(oom)
    assert text.startswith("pod w-worker-1 exit 137 (OOMKilled")
    assert "host memory" in text and "not GPU memory" in text
    assert describe({"pod": "p", "exitCode": 137, "reason": "Error"}) == "pod p exit 137 (Error)"
    assert (
        describe({"pod": "p", "exitCode": 1, "reason": "Error", "message": "m"}) == "pod p exit 1 (Error): m"
    )


def test_the_failure_is_folded_into_the_message_while_restarting_or_failed() -> None:
    failure = {"pod": "p", "exitCode": 1, "reason": "Error", "message": "boom"}
    base = "PyTorchJob w is Restarting"
    folded = status_message(base, "Restarting", failure)
    assert folded == f"{base}{FAILURE_SEPARATOR}pod p exit 1 (Error): boom"
    newer = status_message(base, "Failed", {**failure, "message": "new"})
    assert newer == f"{base}{FAILURE_SEPARATOR}pod p exit 1 (Error): new", "replaced, not stacked"
    assert status_message(base, "Running", failure) == base, "a running job shows no old failure"
    assert status_message(base, "Restarting", None) == base
    typed = WorkerFailure.model_validate({**failure, "container": "pytorch"})
    assert status_message(base, "Restarting", typed) == folded, "the typed status.lastFailure reads the same"


def test_a_restart_long_after_the_last_failure_is_not_blamed_on_it() -> None:
    # A node lost at 09:00 restarts the job; the worker failure of 08:00 (T1) is not its cause.
    failure = {"pod": "p", "exitCode": 1, "reason": "Error", "message": "boom", "finishedAt": T1}
    base = "PyTorchJob w is Restarting"
    assert status_message(base, "Restarting", failure, since=T3) == base
    # The training operator marks the job Restarting seconds after the failure: that one is the cause.
    assert status_message(base, "Restarting", failure, since=T2).endswith("(Error): boom")


def test_a_later_failure_replaces_the_stored_one_and_a_cascade_stop_does_not() -> None:
    first = {"pod": "a", "exitCode": 1, "reason": "Error", "finishedAt": T1}
    assert supersedes(first, None)
    assert not supersedes(dict(first), first), "identical: nothing to write"
    assert supersedes({**first, "message": "now known"}, first), "same failure, completed"
    assert not supersedes({**first, "pod": "b", "finishedAt": "2026-11-30T07:59:00Z"}, first), "older"
    assert supersedes({**first, "pod": "b", "finishedAt": T2}, first)
    # The training operator stops the other workers after a failure: their SIGTERM/SIGKILL exits within
    # the window do not hide the cause; later, a stop is news again.
    stopped = {"pod": "b", "exitCode": 143, "reason": "Error", "finishedAt": T2}
    assert not supersedes(stopped, first)
    assert not supersedes({**stopped, "exitCode": 137}, first)
    assert supersedes({**stopped, "exitCode": 137, "reason": "OOMKilled"}, first), "an OOM kill is a cause"
    assert supersedes({**stopped, "finishedAt": T3}, first)
    assert supersedes({**first, "pod": "c", "finishedAt": T3}, stopped)


def _patch(change: StatusChange | None, stored: dict[str, Any]) -> dict[str, Any]:
    """The pod watcher's change as the merge patch it sends."""
    assert change is not None
    return status_patch(change, stored, POD_WATCHER)


def _btj(status: dict[str, Any] | None = None, **meta: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "w", "namespace": NAMESPACE, "creationTimestamp": T1, "uid": "u-btj", **meta},
        "status": status or {},
    }


CHILD = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "w", "uid": "child-2"}}


def test_only_the_current_child_s_pods_belong_to_the_btj() -> None:
    recorded = _btj({"child": {"kind": "PyTorchJob", "name": "w", "uid": "child-2"}}, uid="u-btj")
    ours = pod("w-worker-0", owner=CHILD, creationTimestamp=T2)
    assert belongs_to(ours, recorded, verified(recorded))
    assert not belongs_to(ours, recorded, None), "no verified owner chain: labels alone count for nothing"
    predecessor = verified(recorded, job_uid="child-1")
    assert not belongs_to(ours, recorded, predecessor), "a deleted job's pod with the same name"
    other_btj = Lineage("PyTorchJob", "w", "child-2", "w", "u-other-btj")
    assert not belongs_to(ours, recorded, other_btj), "a job a predecessor BTJ of the same name controlled"
    assert belongs_to(ours, _btj(uid="u-btj"), verified(_btj(uid="u-btj"))), "no child recorded yet"
    elsewhere = pod("w-worker-0", namespace="other")
    assert not belongs_to(elsewhere, recorded, verified(recorded))


def _chain(*objects: dict[str, Any]) -> Reader:
    """A reader over a fixed set of objects, as the API would answer by kind, namespace and name."""
    by_key = {(o["kind"], o["metadata"]["namespace"], o["metadata"]["name"]): o for o in objects}
    return lambda kind, namespace, name: by_key.get((kind.kind, namespace, name))


# The trainer container of the jobs below, and when they were made (their pods are made later).
TRAINER = {
    "name": "pytorch",
    "image": "ghcr.io/blackwell-dev/blackwell-trainer:0.1.0",
    "command": ["torchrun"],
}
MADE = "2026-12-01T11:00:00Z"


def _obj(
    api_version: str, kind: str, name: str, uid: str, owner: dict[str, Any] | None, **spec: Any
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": NAMESPACE, "uid": uid, "creationTimestamp": MADE}
    if owner is not None:
        meta["ownerReferences"] = [{**owner, "controller": True}]
    return {"apiVersion": api_version, "kind": kind, "metadata": meta, "spec": spec}


def _made_from(body: dict[str, Any], container: dict[str, Any]) -> dict[str, Any]:
    """The pod as its controller makes it from a template with `container`, after the jobs above it."""
    return {
        **body,
        "metadata": {**body["metadata"], "uid": "p", "creationTimestamp": NOW},
        "spec": {"containers": [container]},
    }


def _template(container: dict[str, Any]) -> dict[str, Any]:
    return {"spec": {"containers": [container]}}


def _ref(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj["metadata"]
    return {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "name": meta["name"], "uid": meta["uid"]}


BTJ_OBJ = _obj("training.blackwell.dev/v1alpha1", "BlackwellTrainingJob", "w", "u-btj", None)


def test_the_owner_chain_is_verified_object_by_object() -> None:
    replicas = {"Worker": {"template": _template(TRAINER)}}
    job = _obj("kubeflow.org/v1", "PyTorchJob", "w", "u-job", _ref(BTJ_OBJ), pytorchReplicaSpecs=replicas)
    genuine = _made_from(pod("w-worker-0"), TRAINER)
    genuine["metadata"]["ownerReferences"] = [{**_ref(job), "controller": True}]
    assert lineage(genuine, _chain(job)) == Lineage("PyTorchJob", "w", "u-job", "w", "u-btj")
    # The trainer's labels and nothing else: no controller, nothing read.
    assert lineage(pod("w-worker-0"), _chain(job)) is None
    # A reference that names the job but another uid (copied from a deleted predecessor, or made up).
    forged = {**genuine, "metadata": {**genuine["metadata"]}}
    forged["metadata"]["ownerReferences"] = [{**_ref(job), "uid": "made-up", "controller": True}]
    assert lineage(forged, _chain(job)) is None
    # A reference that is not the controller one does not count.
    loose = {**genuine, "metadata": {**genuine["metadata"]}}
    loose["metadata"]["ownerReferences"] = [_ref(job)]
    assert lineage(loose, _chain(job)) is None
    # A job of ours that no BTJ controls (made by hand with our kind).
    orphan = _obj("kubeflow.org/v1", "PyTorchJob", "w", "u-job", None, pytorchReplicaSpecs=replicas)
    assert lineage(genuine, _chain(orphan)) is None
    # The right chain, but a pod made before the job (re-parented later), or not from its template.
    earlier = {**genuine, "metadata": {**genuine["metadata"], "creationTimestamp": "2026-12-01T10:59:59Z"}}
    assert lineage(earlier, _chain(job)) is None
    same_second = {**genuine, "metadata": {**genuine["metadata"], "creationTimestamp": MADE}}
    assert lineage(same_second, _chain(job)) is not None  # one-second resolution: equal counts
    for other in ({"image": "busybox"}, {"command": ["sh", "-c", "echo"]}, {"args": ["--lie"]}):
        assert lineage(_made_from(genuine, {**TRAINER, **other}), _chain(job)) is None, other


def test_a_trainjob_s_pods_are_followed_through_its_jobset_and_job() -> None:
    node = {**TRAINER, "name": "node"}
    runtime_ref = {"apiGroup": "trainer.kubeflow.org", "kind": "TrainingRuntime", "name": "w"}
    train = _obj(
        "trainer.kubeflow.org/v1alpha1", "TrainJob", "w", "u-tj", _ref(BTJ_OBJ), runtimeRef=runtime_ref
    )
    replicated = {"name": "node", "template": {"spec": {"template": _template(node)}}}
    the_runtime = _obj(
        "trainer.kubeflow.org/v1alpha1",
        "TrainingRuntime",
        "w",
        "u-rt",
        _ref(BTJ_OBJ),
        template={"spec": {"replicatedJobs": [replicated]}},
    )
    jobset = _obj("jobset.x-k8s.io/v1alpha2", "JobSet", "w", "u-js", _ref(train))
    batch = _obj("batch/v1", "Job", "w-node-0", "u-bj", _ref(jobset))
    worker = _made_from(pod("w-node-0-0"), node)
    worker["metadata"]["ownerReferences"] = [{**_ref(batch), "controller": True}]
    found = Lineage("TrainJob", "w", "u-tj", "w", "u-btj")
    assert lineage(worker, _chain(train, the_runtime, jobset, batch)) == found
    # The TrainJob's template is its TrainingRuntime's: none there, nothing to have been made from.
    assert lineage(worker, _chain(train, jobset, batch)) is None
    # A TrainJob's spec.trainer.image replaces the runtime's (Trainer v2 does): the pod runs that one.
    pinned = {**train, "spec": {**train["spec"], "trainer": {"image": "registry.example/trainer:2"}}}
    assert lineage(worker, _chain(pinned, the_runtime, jobset, batch)) is None
    repinned = _made_from(worker, {**node, "image": "registry.example/trainer:2"})
    assert lineage(repinned, _chain(pinned, the_runtime, jobset, batch)) == found
    # A Job of the same name that someone else made (another uid): the chain breaks there.
    impostor = _obj("batch/v1", "Job", "w-node-0", "u-other", _ref(jobset))
    assert lineage(worker, _chain(train, the_runtime, jobset, impostor)) is None
    # A Job that points straight at the TrainJob skips the JobSet: not the shape Trainer v2 makes.
    direct = _obj("batch/v1", "Job", "w-node-0", "u-bj", _ref(train))
    assert lineage(worker, _chain(train, the_runtime, direct)) is None
    # A pod that points straight at the TrainJob: not how its pods are owned either.
    straight = {**worker, "metadata": {**worker["metadata"]}}
    straight["metadata"]["ownerReferences"] = [{**_ref(train), "controller": True}]
    assert lineage(straight, _chain(train, the_runtime)) is None


def test_nothing_is_written_onto_a_btj_being_deleted_or_succeeded() -> None:
    body = pod("w-worker-0", owner=CHILD)
    found = Lineage("PyTorchJob", "w", "child-2", "w", "u-btj")
    failure = {"pod": "w-worker-0", "container": "pytorch", "exitCode": 1, "reason": "Error", "message": "m"}
    restarting = {"phase": "Restarting", "message": "PyTorchJob w is Restarting"}
    changes, new = failure_changes(_btj(restarting), body, failure, now=NOW, found=found)
    assert new and _patch(changes, restarting) == {
        "lastFailure": failure,
        "message": f"PyTorchJob w is Restarting{FAILURE_SEPARATOR}pod w-worker-0 exit 1 (Error): m",
        "headline": "PyTorchJob w is Restarting",  # a status from before headlines: its message was it
    }
    # A newer failure replaces the one in the message: composed from the stored headline, never parsed.
    folded = {**restarting, **_patch(changes, restarting)}
    later = {**failure, "message": "again", "finishedAt": T2}
    changes, new = failure_changes(_btj(folded), body, later, now=NOW, found=found)
    assert new and _patch(changes, folded) == {
        "lastFailure": later,
        "message": f"PyTorchJob w is Restarting{FAILURE_SEPARATOR}pod w-worker-0 exit 1 (Error): again",
        "headline": "PyTorchJob w is Restarting",  # written with the message, always
    }
    assert failure_changes(
        _btj({**restarting, "lastFailure": failure}), body, failure, now=NOW, found=found
    ) == (
        None,
        False,
    )
    deleting = _btj(restarting, deletionTimestamp=T2)
    assert failure_changes(deleting, body, failure, now=NOW, found=found) == (None, False)
    assert failure_changes(_btj({"phase": "Succeeded"}), body, failure, now=NOW, found=found) == (None, False)
    running, new = failure_changes(
        _btj({"phase": "Running", "message": "m"}), body, failure, now=NOW, found=found
    )
    assert new and running is not None
    assert _patch(running, {"phase": "Running"}) == {"lastFailure": failure}, (
        "recorded, not folded, while running"
    )


# ----- the running operator --------------------------------------------------------------------------------


def _failure_writes(cluster: Cluster) -> list[dict[str, Any]]:
    """status.lastFailure of every status write the operator sent for BTJ w (as sent: the raw body)."""
    bodies = [
        json.loads(r.body)
        for r in cluster.k.requests
        if from_operator(r)
        and r.method.value == "PATCH"
        and r.resource is not None
        and r.resource.plural == "blackwelltrainingjobs"
        and r.subresource == "status"
        and r.name == "w"
    ]
    return [b["status"]["lastFailure"] for b in bodies if "lastFailure" in b.get("status", {})]


def _warnings(cluster: Cluster) -> list[dict[str, Any]]:
    return [e for e in cluster.events("w") if e.get("reason") == "WorkerFailed"]


@pytest.mark.integration
async def test_a_failed_worker_shows_on_the_btj(cluster: Cluster) -> None:
    async with running_operator(cluster):
        job = await cluster.restarting_job("w", RESTARTING)

        # Not ours (no managed-by label) and a worker that ended well: nothing.
        stranger = pod("other-0")
        del stranger["metadata"]["labels"]["app.kubernetes.io/managed-by"]
        failed = container(state={"terminated": terminated(1, "Error", T1, TRAINER_ERROR)})
        await cluster.add_pod(stranger, pod_status(failed))
        done = container(state={"terminated": terminated(0, "Completed", T2)})
        await cluster.add_pod(pod("w-worker-1", owner=job), pod_status(done))

        await cluster.add_pod(pod("w-worker-0", owner=job), pod_status(failed))
        status = await wait_for(lambda: cluster.status("w").get("lastFailure") and cluster.status("w"))
        assert status["lastFailure"] == WORKER_0_FAILED
        assert status["message"] == (
            "PyTorchJob w is Restarting: PyTorchJob w is restarting because 1 Worker replica(s) failed."
            f"; last worker failure: pod w-worker-0 exit 1 (Error): {TRAINER_ERROR}"
        )
        (event,) = await wait_for(lambda: _warnings(cluster), what="the WorkerFailed Event")
        assert event["type"] == "Warning"
        assert event["message"] == f"pod w-worker-0 exit 1 (Error): {TRAINER_ERROR}"

        # The same failure again (the pod's next event): nothing new. Then the container, restarted in
        # place, is OOM-killed: events of one pod are handled in order, so this one follows the no-op.
        await cluster.set_pod_status("w-worker-0", pod_status(failed, podIP="10.0.0.7"))
        oom = container(
            state={"terminated": terminated(137, "OOMKilled", T2)},
            last={"terminated": terminated(1, "Error", T1, TRAINER_ERROR)},
        )
        await cluster.set_pod_status("w-worker-0", pod_status(oom))
        await wait_for(lambda: cluster.status("w")["lastFailure"]["exitCode"] == 137, what="the OOM kill")
        message = cluster.status("w")["message"]
        assert "pod w-worker-0 exit 137 (OOMKilled" in message and "host memory" in message
        assert "not GPU memory" in message
        await wait_for(lambda: len(_warnings(cluster)) == 2, what="the second WorkerFailed Event")

        # Running again: the message drops the failure (lastFailure stays); Failed: it is back.
        await cluster.set_child_status(
            "w", {"conditions": [job_condition("Created"), job_condition("Running")]}
        )
        await wait_for(lambda: cluster.status("w").get("phase") == "Running", what="phase Running")
        assert FAILURE_SEPARATOR not in cluster.status("w")["message"]
        assert cluster.status("w")["lastFailure"]["exitCode"] == 137
        await cluster.set_child_status(
            "w",
            {
                "conditions": [
                    job_condition("Created"),
                    job_condition("Failed", message="backoffLimit reached"),
                ]
            },
        )
        await wait_for(lambda: cluster.status("w").get("phase") == "Failed", what="phase Failed")
        assert cluster.status("w")["message"].startswith(
            "PyTorchJob w is Failed: backoffLimit reached; last worker failure: pod w-worker-0 exit 137"
        )
        await cluster.settle("w")

    writes = _failure_writes(cluster)
    assert [(w["pod"], w["exitCode"]) for w in writes] == [("w-worker-0", 1), ("w-worker-0", 137)]
    assert len(_warnings(cluster)) == 2, "one Event per distinct failure"
    # The pod watch is filtered by the API server: the operator never receives the cluster's other pods.
    # The one exception is free capacity's LIST of the pods on nodes (never watched), of which it keeps
    # only node, namespace, job label and GPUs (discovery/capacity.py, docs/security.md).
    pod_requests = [
        r
        for r in cluster.k.requests
        if from_operator(r) and r.resource is not None and r.resource.plural == "pods"
    ]
    capacity_lists = [r for r in pod_requests if r.params.get("fieldSelector") == PODS_ON_NODES]
    assert all(verb_of(r) == "list" and r.namespace is None for r in capacity_lists)
    pod_watches = [r for r in pod_requests if r not in capacity_lists]
    assert pod_watches
    for request in pod_watches:
        selector = request.params.get("labelSelector") or ""
        assert "app.kubernetes.io/managed-by=blackwell-operator" in selector and JOB_NAME_LABEL in selector


@pytest.mark.integration
async def test_a_transient_api_error_does_not_lose_the_failure(cluster: Cluster) -> None:
    # Event handlers get no retries from Kopf: the handler retries the status write itself.
    async with running_operator(cluster):
        job = await cluster.restarting_job("w", RESTARTING)
        await cluster.settle("w")
        fault = cluster.k.inject_fault("PATCH", "blackwelltrainingjobs", 503, times=2, subresource="status")
        failed = container(state={"terminated": terminated(2, "Error", T1, TRAINER_ERROR)})
        await cluster.add_pod(pod("w-worker-0", owner=job), pod_status(failed))
        await wait_for(lambda: cluster.status("w").get("lastFailure"), what="lastFailure")
        await wait_for(lambda: _warnings(cluster), what="the WorkerFailed Event")
    assert fault.times == 0, "both injected errors were met"
    assert cluster.status("w")["lastFailure"]["exitCode"] == 2
    assert len(_warnings(cluster)) == 1
