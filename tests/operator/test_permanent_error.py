"""A worker that ends on a permanent error fails the BTJ at once and its child is deleted (no retries).

The trainer marks errors no restart can fix (a plan, data or checkpoint that does not fit) in its
termination message; storage that failed to take saves is not marked, since it may recover.
"""

from __future__ import annotations

from typing import Any

import pytest

from blackwell_operator.lifecycle.failures import (
    PERMANENT_ERROR_REASON,
    failure_changes,
    is_permanent,
    stopped_on_permanent_error,
)
from blackwell_operator.lifecycle.status_patch import status_patch
from blackwell_operator.lifecycle.writers import POD_WATCHER
from tests.operator.harness import Cluster, btj, from_operator, running_operator, wait_for
from tests.support.pods import PERMANENT_TRAINER_ERROR as PERMANENT
from tests.support.pods import RESTARTING, T1, T2, container, pod, pod_status, terminated, verified

# metav1.Time the pure functions stamp their conditions and history with (the clock is passed in).
NOW = "2026-12-01T12:00:00Z"

STORAGE = "error: 3 interval checkpoints in a row not written, the last checkpoint of step 600: No space left"


def _failure(message: str, finished: str = T1) -> dict[str, Any]:
    return {
        "pod": "w-worker-0",
        "container": "pytorch",
        "exitCode": 1,
        "reason": "Error",
        "message": message,
        "finishedAt": finished,
    }


def _btj(phase: str, **status: Any) -> dict[str, Any]:
    body = btj("w")
    body["metadata"].update(uid="u-btj", generation=1, creationTimestamp="2026-11-30T07:00:00Z")
    body["status"] = {
        "phase": phase,
        "observedGeneration": 1,
        "message": "PyTorchJob w is Restarting",
        "child": {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "w", "uid": "u-job"},
        **status,
    }
    return body


def _worker() -> dict[str, Any]:
    owner = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": {"name": "w", "uid": "u-job"}}
    return pod("w-worker-0", owner=owner, creationTimestamp="2026-11-30T07:05:00Z")


# ----- the pure part ---------------------------------------------------------------------------------------


def test_only_the_trainer_s_marked_messages_are_permanent() -> None:
    assert is_permanent(_failure(PERMANENT))
    assert not is_permanent(_failure(STORAGE))
    assert not is_permanent(_failure(""))
    assert not is_permanent(None)


def test_a_permanent_error_fails_a_running_btj() -> None:
    body = _btj("Restarting")
    change, new = failure_changes(body, _worker(), _failure(PERMANENT), now=NOW, found=verified(body))
    assert change is not None and new
    changes = status_patch(change, body["status"], POD_WATCHER)
    assert changes["phase"] == "Failed" and changes["lastFailure"]["message"] == PERMANENT
    assert changes["message"].startswith("Failed: a worker ended on a permanent error, which no restart")
    assert "PyTorchJob w is deleted to free its GPUs" in changes["message"]
    assert stopped_on_permanent_error(changes)
    (failed,) = [c for c in changes["conditions"] if c["type"] == "Failed"]
    assert failed["status"] == "True" and failed["reason"] == PERMANENT_ERROR_REASON


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_a_finished_btj_is_not_failed_again(phase: str) -> None:
    body = _btj(phase)
    change, _ = failure_changes(body, _worker(), _failure(PERMANENT), now=NOW, found=verified(body))
    assert change is None or "phase" not in status_patch(change, body["status"], POD_WATCHER)


def test_a_storage_failure_is_recorded_but_the_job_goes_on() -> None:
    body = _btj("Restarting")
    change, new = failure_changes(body, _worker(), _failure(STORAGE), now=NOW, found=verified(body))
    assert change is not None and new
    changes = status_patch(change, body["status"], POD_WATCHER)
    assert "phase" not in changes
    assert not stopped_on_permanent_error({**body["status"], **changes})


# ----- the real operator -----------------------------------------------------------------------------------


def _events(cluster: Cluster, reason: str) -> list[dict[str, Any]]:
    return [e for e in cluster.events("w") if e.get("reason") == reason]


@pytest.mark.integration
async def test_a_permanent_worker_error_stops_the_job_until_the_spec_changes(cluster: Cluster) -> None:
    async with running_operator(cluster):
        job = await cluster.restarting_job("w", RESTARTING)

        # Full storage may be freed: recorded, and the job keeps retrying.
        storage = container(state={"terminated": terminated(1, "Error", T1, STORAGE)})
        await cluster.add_pod(pod("w-worker-1", owner=job), pod_status(storage))
        await wait_for(lambda: (cluster.status("w").get("lastFailure") or {}).get("message") == STORAGE)
        assert cluster.status("w")["phase"] == "Restarting" and cluster.job("w") is not None

        # A checkpoint that does not fit the plan: no restart can fix it.
        permanent = container(state={"terminated": terminated(1, "Error", T2, PERMANENT)})
        await cluster.add_pod(pod("w-worker-0", owner=job), pod_status(permanent))
        await wait_for(lambda: cluster.job("w") is None, what="the child deleted")
        status = await wait_for(
            lambda: cluster.status("w").get("phase") == "Failed" and cluster.status("w"), what="phase Failed"
        )
        failed = cluster.condition("w", "Failed")
        assert failed and failed["status"] == "True" and failed["reason"] == PERMANENT_ERROR_REASON
        assert status["lastFailure"]["message"] == PERMANENT
        await wait_for(lambda: _events(cluster, "ChildDeleted"), what="the ChildDeleted Event")
        # The child's deletion reads as the end of a failed job, and says why it failed.
        await wait_for(lambda: "not re-created" in cluster.status("w")["message"], what="the deletion noted")
        assert PERMANENT in cluster.status("w")["message"]
        await cluster.settle("w")
        assert cluster.job("w") is None and cluster.creates("pytorchjobs") == 1
        assert cluster.status("w")["phase"] == "Failed"

        # The fix is a spec change: it starts a new job.
        await cluster.patch_spec("w", {"training": {"sequenceLength": 8192, "steps": 1200}})
        await wait_for(lambda: cluster.job("w"), what="a new PyTorchJob")
        await wait_for(lambda: cluster.status("w").get("phase") != "Failed", what="the BTJ out of Failed")
        assert "lastFailure" not in cluster.status("w"), "the old child's failure is not the new job's"
        await cluster.settle("w")
    assert cluster.creates("pytorchjobs") == 2
    assert len(_events(cluster, "ChildDeleted")) == 1


def _mirror_reads(cluster: Cluster, since: int) -> int:
    """The operator's reads of BTJ w among the requests after the first `since`: the child watcher reads the
    BTJ for each child event it mirrors (nothing else reads a converged BTJ)."""
    return sum(
        1
        for r in cluster.k.requests[since:]
        if r.method.value == "GET"
        and r.resource is not None
        and r.resource.plural == "blackwelltrainingjobs"
        and r.name == "w"
        and from_operator(r)
    )


@pytest.mark.integration
async def test_the_child_s_last_phases_do_not_undo_the_stop(cluster: Cluster) -> None:
    # Between the status write and the child's deletion (or while a failed delete is retried) the training
    # operator may still report the child Restarting: the BTJ stays Failed.
    async with running_operator(cluster):
        await cluster.apply(btj("w"))
        await wait_for(lambda: cluster.job("w"), what="the PyTorchJob")
        await cluster.settle("w")
        # The pod watcher's stop, as it writes it: its Failed condition replaces the child's "no failure".
        stop = {
            "type": "Failed",
            "status": "True",
            "reason": PERMANENT_ERROR_REASON,
            "message": "a worker ended on a permanent error",
            "lastTransitionTime": T2,
        }
        conditions = [c for c in cluster.status("w").get("conditions", []) if c["type"] != "Failed"]
        await cluster.set_btj_status("w", {"phase": "Failed", "conditions": [*conditions, stop]})
        mark = len(cluster.k.requests)
        await cluster.set_child_status("w", RESTARTING)
        # settle() syncs the BTJ's handlers only: wait for the child watcher's read of the BTJ for this
        # event, then delete the child (as the pod watcher does). Kopf handles one child's events in order,
        # so once the deletion is recorded the Restarting event has been mirrored (or ignored).
        await wait_for(lambda: _mirror_reads(cluster, mark), what="the child watcher at the Restarting event")
        await cluster.delete_child("w")
        await wait_for(lambda: cluster.job("w") is None, what="the child released")
        await wait_for(lambda: "not re-created" in cluster.status("w")["message"], what="the deletion noted")
        await cluster.settle("w")
        assert cluster.status("w")["phase"] == "Failed"
        assert cluster.creates("pytorchjobs") == 1
