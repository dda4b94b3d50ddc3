"""A pod that merely looks like a trainer changes nothing: only pods whose controllers lead, uid by uid, to
the BTJ's own child count (lifecycle/ownership.py), and only when the pod is what that child's controller
makes: created after it, from its current pod template (lifecycle/pod_origin.py). The real operator under
KopfRunner against KMock."""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from blackwell_operator.handlers.measure import INTERVAL_ENV
from blackwell_operator.lifecycle.failures import PERMANENT_ERROR_REASON
from blackwell_operator.models.spec import Backend, BlackwellTrainingJobSpec
from blackwell_operator.planner import plan_job
from blackwell_operator.render.kinds import JOB_KINDS
from blackwell_operator.timefmt import now_rfc3339
from blackwell_trainer.plan.metric_names import GPUS, TOKENS, total
from tests.operator.harness import NAMESPACE, PODS, Cluster, btj, from_operator, running_operator, wait_for
from tests.operator.test_trainjob_lifecycle import node_job, trainer_pod, trainjob, trainjob_btj
from tests.support.oom import oom_message
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


# What someone who may create pods in the namespace runs in the trainer's place: their own image and command
# (a container that writes a chosen termination message, or serves chosen /metrics), under the child's
# controller reference copied whole (its kind, apiVersion, name, uid, controller: true) and its labels.
IMPOSTOR = {
    "image": "docker.io/library/busybox:1.36",
    "command": ["sh", "-c", "cat /lie > /dev/termination-log"],
}


def _copied_reference(name: str, job: dict[str, Any], **container: Any) -> dict[str, Any]:
    """A pod carrying `job`'s controller reference and template labels, with `container` fields of its own
    in the trainer container."""
    body = pod(name, owner=job)
    body["spec"]["containers"][0].update(container)
    return body


@pytest.mark.integration
async def test_a_copied_controller_reference_fails_nothing_and_replans_nothing(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    async with running_operator(cluster):
        job = await cluster.restarting_job("w", RESTARTING)
        before = cluster.status("w")
        oom = oom_message(plan_job(BlackwellTrainingJobSpec.model_validate(btj("w")["spec"])))
        # The victim child's very controller reference and labels, but another container: an OOM line, and
        # a permanent error.
        await cluster.add_pod(_copied_reference("w-worker-5", job, **IMPOSTOR), _ended(oom))
        await cluster.add_pod(_copied_reference("w-worker-6", job, **IMPOSTOR), _ended(PERMANENT))
        # Only the command differs from the template (an image anyone can pull): not made from it either.
        await cluster.add_pod(_copied_reference("w-worker-7", job, args=["--fail"]), _ended(PERMANENT))
        for name in ("w-worker-5", "w-worker-6", "w-worker-7"):
            await wait_for(lambda n=name: _ignored(caplog, n), what=f"{name} ignored")
        await cluster.settle("w")

        after = cluster.status("w")
        assert after["phase"] == "Restarting" and "lastFailure" not in after
        assert after["plan"] == before["plan"] and "planHistory" not in after
        assert "memoryCorrection" not in after
        assert (cluster.job("w") or {})["metadata"]["uid"] == job["metadata"]["uid"]
        assert cluster.creates("pytorchjobs") == 1 and not _operator_deletes(cluster)
        assert not [e for e in cluster.events("w") if e.get("reason") in ("WorkerFailed", "Replanned")]
        # The child's own worker, made from its template after it, still counts: its OOM line re-plans.
        await cluster.add_pod(pod("w-worker-0", owner=job), _ended(oom))
        await wait_for(lambda: cluster.status("w").get("planHistory"), what="the re-plan")
        await wait_for(
            lambda: [e for e in cluster.events("w") if e.get("reason") == "Replanned"], what="Replanned"
        )


@pytest.mark.integration
async def test_a_pod_made_before_the_child_and_re_parented_fails_nothing(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    # A pod made from the very template the child has, but before the child existed, then given the
    # child's controller reference by a metadata patch (owner references are mutable): no controller makes
    # a pod before its job.
    async with running_operator(cluster):
        await cluster.apply(btj("w"))
        first = await wait_for(lambda: cluster.job("w"), what="the PyTorchJob")
        early = pod("w-worker-3", owner=first)
        del early["metadata"]["ownerReferences"]
        await cluster.add_pod(early)
        made = (cluster.k.get_object("v1/pods", NAMESPACE, "w-worker-3") or {})["metadata"][
            "creationTimestamp"
        ]
        await wait_for(lambda: now_rfc3339() > made, what="the next second")
        await cluster.delete_child("w")  # the operator re-creates it: a new uid, created after the pod
        job = await wait_for(
            lambda: (j := cluster.job("w")) and j["metadata"]["uid"] != first["metadata"]["uid"] and j,
            what="the re-created PyTorchJob",
        )
        await wait_for(lambda: (cluster.status("w").get("child") or {}).get("uid") == job["metadata"]["uid"])
        assert job["spec"] == first["spec"], "the same template: only the creation time tells them apart"
        await cluster.set_child_status("w", RESTARTING)
        await wait_for(lambda: cluster.status("w").get("phase") == "Restarting", what="phase Restarting")

        reparented = pod("w-worker-3", owner=job)["metadata"]["ownerReferences"]
        await cluster._json(
            "PATCH",
            f"{PODS}/w-worker-3",
            {"metadata": {"ownerReferences": reparented}},
            "application/merge-patch+json",
        )
        await cluster.set_pod_status("w-worker-3", _ended(PERMANENT))
        await wait_for(lambda: _ignored(caplog, "w-worker-3"), what="the re-parented pod ignored")
        await cluster.settle("w")
        after = cluster.status("w")
        assert after["phase"] == "Restarting" and "lastFailure" not in after
        assert (cluster.job("w") or {})["metadata"]["uid"] == job["metadata"]["uid"]
        assert not [e for e in cluster.events("w") if e.get("reason") == "WorkerFailed"]


class _Exporter(http.server.ThreadingHTTPServer):
    """A /metrics endpoint like the trainer's: its token counter grows at `rate` tokens/s on one GPU; it
    counts the scrapes it answers."""

    def __init__(self, rate: float) -> None:
        self.rate, self.scrapes, self.started = rate, 0, time.monotonic()
        super().__init__(("127.0.0.1", 0), _Handler)

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def text(self) -> str:
        self.scrapes += 1
        tokens = self.rate * (time.monotonic() - self.started)
        return f"# TYPE {TOKENS} counter\n{total(TOKENS)} {tokens:.1f}\n# TYPE {GPUS} gauge\n{GPUS} 1\n"


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Exporter

    def do_GET(self) -> None:
        body = self.server.text().encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def exporters() -> Iterator[tuple[_Exporter, _Exporter]]:
    """The genuine worker's endpoint (5,000 tokens/s) and the impostor's (the figure the probe saw)."""
    servers = (_Exporter(5000.0), _Exporter(996_483_857_747.0))
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in servers]
    for thread in threads:
        thread.start()
    yield servers
    for server in servers:
        server.shutdown()
        server.server_close()


def _serving(body: dict[str, Any], port: int) -> tuple[dict[str, Any], dict[str, Any]]:
    """The pod with its trainer container's metrics port at `port`, and its Running status on loopback."""
    body["spec"]["containers"][0]["ports"] = [{"name": "metrics", "containerPort": port, "protocol": "TCP"}]
    return body, pod_status(container(), podIP="127.0.0.1")


@pytest.mark.integration
async def test_a_copied_controller_reference_s_metrics_are_never_read(
    cluster: Cluster, exporters: tuple[_Exporter, _Exporter], monkeypatch: pytest.MonkeyPatch
) -> None:
    genuine, impostor = exporters
    monkeypatch.setenv(INTERVAL_ENV, "0.2")
    async with running_operator(cluster):
        job = await cluster.running_child("w")
        # The child's own worker: its reading becomes status.measured.
        await cluster.add_pod(*_serving(pod("w-worker-0", owner=job), genuine.port))
        measured = await wait_for(lambda: cluster.status("w").get("measured"), what="status.measured")
        assert 0 < measured["tokensPerSecondPerGpu"] < 10_000

        # The impostor: the child's controller reference and labels, its own image, named to be read first.
        forged = _copied_reference("w-a-worker-0", job, **IMPOSTOR)
        await cluster.add_pod(*_serving(forged, impostor.port))
        seen = genuine.scrapes
        # Several rounds after the pod exists (the genuine endpoint keeps being read), or the impostor's read.
        await wait_for(lambda: genuine.scrapes >= seen + 4 or impostor.scrapes, what="four more rounds")
        await cluster.settle("w")
    assert impostor.scrapes == 0, "the operator read the /metrics of a pod its child's controller never made"
    measured = cluster.status("w")["measured"]
    assert 0 < measured["tokensPerSecondPerGpu"] < 10_000
