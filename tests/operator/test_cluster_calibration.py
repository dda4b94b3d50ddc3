"""Measured runs teach later plans: the real operator scrapes real trainer exporters into its cluster
calibration (a ConfigMap), the next plan on that instance type is corrected, and the exported copy gives
`btj plan --explain` the same correction offline. Also the store's conflict handling and status.progress.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from typer.testing import CliRunner

from blackwell_operator.calibration.cluster import (
    KEEP_PER_FAMILY,
    POOL_PER_NAMESPACE,
    ClusterCalibration,
    Sample,
    implausible,
)
from blackwell_operator.cli import _register_commands, app
from blackwell_operator.handlers import cluster_calibration as store
from blackwell_operator.handlers.api import ApiError, KubeApi
from blackwell_operator.handlers.measure import INTERVAL_ENV
from blackwell_operator.testing.kubeconfig import write_kubeconfig
from blackwell_trainer.loop.metrics import TrainerMetrics
from blackwell_trainer.plan.config import ActivationCheckpointing, PrecisionRecipe
from tests.operator.harness import NAMESPACE, Cluster, btj, from_operator, running_operator, verb_of, wait_for
from tests.ports import free_port
from tests.support.helm import NAMESPACE as RELEASE_NAMESPACE
from tests.support.helm import by_kind, render
from tests.support.plans import tiny_plan
from tests.support.pods import container, job_condition, pod, pod_status

_register_commands()
runner = CliRunner()
SLOW = 0.6  # the jobs run at this share of the modelled tokens/s
HEAVY = 1.1  # and reserve this much more memory than modelled
JOBS = ("a", "b", "c")
# One recipe family for every job (pinned, so that the corrected family still wins the next plan).
FAMILY = {"precision": "bf16", "activationCheckpointing": "selective"}


class PacedTrainer:
    """A trainer exporter (2 GPUs) whose token counter grows at `rate` tokens/s per GPU of wall time."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("LOCAL_RANK", "0")
        monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
        self.metrics = TrainerMetrics(tiny_plan())
        self.metrics.serve(0)
        self.rate, self.reserved = 0.0, 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return int(self.metrics.port or 0)

    def _run(self) -> None:
        last, step = time.monotonic(), 0
        while not self.stop.wait(0.02):
            now = time.monotonic()
            if self.rate <= 0:
                last = now
                continue
            step += 1
            tokens = int(self.rate * (now - last))  # per GPU, as a rank records its step
            last = now
            self.metrics.record_step(
                tokens=tokens,
                step_seconds=0.02,
                loss=2.0,
                mfu=0.3,
                peak_allocated_bytes=self.reserved,
                peak_reserved_bytes=self.reserved,
                step=step,
            )

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.metrics.close()


@pytest.fixture
def trainers(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, PacedTrainer]]:
    made = {name: PacedTrainer(monkeypatch) for name in JOBS}
    yield made
    for trainer in made.values():
        trainer.close()


async def _running_job(cluster: Cluster, name: str, trainer: PacedTrainer) -> dict[str, Any]:
    """Apply BTJ `name`, report its job Running, start a worker pod serving `trainer`'s /metrics at SLOW
    times the plan's modelled tokens/s and HEAVY times its memory; the plan is returned."""
    job = await cluster.running_child(name, tuning=FAMILY)
    plan: dict[str, Any] = await wait_for(lambda: cluster.status(name).get("plan"), what=f"{name}'s plan")
    trainer.rate = SLOW * plan["predicted"]["tokensPerSecondPerGpu"]
    trainer.reserved = int(HEAVY * plan["predicted"]["memory"]["peakReserved"])
    await serve_worker(cluster, name, job, trainer)
    return plan


async def serve_worker(cluster: Cluster, name: str, job: dict[str, Any], trainer: PacedTrainer) -> None:
    """Start `name`-worker-0 of `job`, Running on loopback, its metrics port `trainer`'s exporter."""
    body = pod(f"{name}-worker-0", job=name, owner=job)
    body["spec"]["containers"][0]["ports"] = [{"name": "metrics", "containerPort": trainer.port}]
    await cluster.add_pod(body, pod_status(container(), podIP="127.0.0.1"))


# The operator keeps its calibration in its own namespace (the chart's release namespace), not the jobs'.
HOME = RELEASE_NAMESPACE


def _stored(cluster: Cluster) -> ClusterCalibration | None:
    found = cluster.k.get_object("v1/configmaps", HOME, store.NAME)
    return None if found is None else store.parse(found)


def _allowed(rules: list[dict[str, Any]], verb: str, name: str | None) -> bool:
    """Whether a Role's rules allow `verb` on ConfigMap `name` (None: a create, which has no name)."""
    return any(
        "configmaps" in rule["resources"]
        and verb in rule["verbs"]
        and (not rule.get("resourceNames") or name in rule["resourceNames"])
        for rule in rules
    )


@pytest.mark.integration
async def test_slow_runs_correct_the_next_plan_and_the_exported_copy_offline(
    cluster: Cluster,
    trainers: dict[str, PacedTrainer],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    helm: str,
) -> None:
    monkeypatch.setenv(INTERVAL_ENV, "0.3")
    monkeypatch.setenv(store.NAMESPACE_ENV, HOME)
    async with running_operator(cluster):
        plans = [await _running_job(cluster, name, trainers[name]) for name in JOBS]
        # Each job is one run however often it is read; every ratio is the pacing's.
        calibration = await wait_for(
            lambda: (c := _stored(cluster)) is not None and len(c.samples) == len(JOBS) and c,
            timeout=30,
            what="a sample of every job in the cluster calibration",
        )
        progress = await wait_for(
            lambda: cluster.status("a").get("progress", {}).get("remaining"), what="a's time left"
        )
        await cluster.apply(btj("next", tuning=FAMILY))
        await wait_for(lambda: cluster.status("next").get("plan"), what="the next plan")
        planned = cluster.condition("next", "Planned")
        # The job ends well: its progress shows every step done, not the last reading's.
        done = [job_condition("Created"), job_condition("Running", "False"), job_condition("Succeeded")]
        await cluster.set_child_status("b", {"conditions": done})
        await wait_for(lambda: cluster.status("b").get("phase") == "Succeeded", what="b Succeeded")
        finished_progress = await wait_for(
            lambda: (
                cluster.status("b")["progress"].get("percent") == 100.0 and cluster.status("b")["progress"]
            ),
            what="b's progress at 100%",
        )
    # Every call the operator made in its own namespace is one the chart's calibration Role allows.
    home_calls = {
        (verb_of(r), r.name)
        for r in cluster.k.requests
        if from_operator(r) and r.namespace == HOME and r.resource is not None
    }
    (role,) = [r for r in by_kind(render(helm), "Role") if r["metadata"]["name"].endswith("-calibration")]
    assert {verb for verb, _ in home_calls} == {"get", "create", "patch"}
    assert all(_allowed(role["rules"], verb, name) for verb, name in home_calls), home_calls
    for s in calibration.samples:
        assert s.tokens_ratio == pytest.approx(SLOW, rel=0.15) and s.memory_ratio == pytest.approx(
            HEAVY, rel=0.01
        )
    assert {s.job for s in calibration.samples} == {f"{NAMESPACE}/{n}" for n in JOBS}
    nxt = cluster.status("next")["plan"]
    correction = nxt["clusterCorrection"]
    assert nxt["chosen"]["precisionRecipe"] == "none" and correction["runs"] == len(JOBS)
    assert correction["tokensFactor"] == pytest.approx(SLOW, rel=0.15)
    assert correction["memoryFactor"] == pytest.approx(HEAVY, rel=0.01)
    assert nxt["predicted"]["tokensPerSecondPerGpu"] < 0.9 * plans[0]["predicted"]["tokensPerSecondPerGpu"]
    assert all(p.get("clusterCorrection") is None for p in plans)  # the first jobs had nothing to go on
    assert planned is not None and f"corrected from {len(JOBS)} runs on this cluster" in planned["message"]
    assert progress and cluster.status("a")["progress"]["totalSteps"] == tiny_plan().steps
    steps = plans[1]["steps"]
    assert finished_progress == {
        "step": steps,
        "totalSteps": steps,
        "percent": 100.0,
        "remainingSeconds": 0,
        "remaining": "0s",
    }

    # Export from the cluster, then plan offline from the copy: the same correction, said in --explain.
    monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kubeconfig", cluster.url)))
    exported = tmp_path / "cluster.json"
    result = await asyncio.to_thread(
        runner.invoke, app, ["calibrate", "cluster", "export", str(exported), "-n", HOME]
    )
    assert result.exit_code == 0, result.output
    assert ClusterCalibration.model_validate(json.loads(exported.read_text())) == _stored(cluster)
    shown = await asyncio.to_thread(runner.invoke, app, ["calibrate", "cluster", "show", "-n", HOME])
    assert shown.exit_code == 0 and "3" in shown.output and "x0." in shown.output, shown.output
    pinned = tmp_path / "job.yaml"
    pinned.write_text(json.dumps(btj("offline", tuning=FAMILY)))
    offline = runner.invoke(app, ["plan", str(pinned), "--explain", "--cluster-calibration", str(exported)])
    assert offline.exit_code == 0, offline.output
    assert f"corrected from {len(JOBS)} runs on this cluster" in offline.output
    plain = runner.invoke(app, ["plan", str(pinned), "--explain"])
    assert "corrected from" not in plain.output

    reset = await asyncio.to_thread(
        runner.invoke, app, ["calibrate", "cluster", "reset", "-n", HOME, "--yes"]
    )
    assert reset.exit_code == 0 and _stored(cluster) is None, reset.output


# ----- the store on its own --------------------------------------------------------------------------------


def _sample(uid: str) -> Sample:
    return Sample(
        job=f"{NAMESPACE}/{uid}",
        uid=uid,
        instance_type="ml.p6-b200.48xlarge",
        precision_recipe=PrecisionRecipe.NONE,
        activation_checkpointing=ActivationCheckpointing.SELECTIVE,
        tokens_ratio=0.7,
        observed_at="2026-12-01T10:00:00Z",
    )


async def test_concurrent_writers_lose_no_sample(cluster: Cluster, tmp_path: Path) -> None:
    from blackwell_operator.handlers.api import load_api_client

    kubeconfig = write_kubeconfig(tmp_path / "kubeconfig", cluster.url)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KUBECONFIG", str(kubeconfig))
        apis = [KubeApi(load_api_client()) for _ in range(4)]
    # Four writers at once, several samples each: creates and patches race on one resourceVersion.
    await asyncio.gather(
        *(
            asyncio.to_thread(
                lambda a=api, i=i: [store.record(a, HOME, _sample(f"w{i}-{k}")) for k in range(3)]
            )
            for i, api in enumerate(apis)
        )
    )
    stored = _stored(cluster)
    assert stored is not None and sorted(s.uid for s in stored.samples) == sorted(
        f"w{i}-{k}" for i in range(4) for k in range(3)
    )


async def test_a_stale_resource_version_is_refused_not_overwritten(cluster: Cluster, tmp_path: Path) -> None:
    from blackwell_operator.handlers.api import load_api_client

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kubeconfig", cluster.url)))
        api = KubeApi(load_api_client())
    await asyncio.to_thread(store.record, api, HOME, _sample("first"))
    old = cluster.k.get_object("v1/configmaps", HOME, store.NAME)
    assert old is not None
    await asyncio.to_thread(store.record, api, HOME, _sample("second"))
    stale = store.body_of(ClusterCalibration(), HOME)
    stale["metadata"] = {"resourceVersion": old["metadata"]["resourceVersion"]}
    with pytest.raises(ApiError) as refused:
        await asyncio.to_thread(api.patch, store.path(HOME), stale)
    assert refused.value.status == 409
    stored = _stored(cluster)
    assert stored is not None and [s.uid for s in stored.samples] == ["first", "second"]


def test_an_unreadable_config_map_names_the_fix() -> None:
    with pytest.raises(store.UnreadableCalibration, match="btj calibrate cluster reset"):
        store.parse({"data": {store.DATA_KEY: "{not json"}})
    with pytest.raises(store.UnreadableCalibration, match="is missing"):
        store.parse({"data": {}})


# ----- readings no GPU can give, and the jobs measured after them ----------------------------------------


class GarbageExporter:
    """A /metrics endpoint on loopback that answers text no Prometheus parser reads."""

    def __init__(self) -> None:
        self.runner: web.AppRunner | None = None
        self.port = free_port()

    async def start(self) -> None:
        app = web.Application()
        app.add_routes([web.get("/metrics", self._metrics)])
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()

    @staticmethod
    async def _metrics(_: web.Request) -> web.Response:
        return web.Response(text='btj_trainer_tokens_total{kind="x" 12 oops\n\x00\n')

    async def close(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


def _rejected(caplog: pytest.LogCaptureFixture, name: str) -> bool:
    return any(
        "Not recording a reading" in r.getMessage() and f"{NAMESPACE}/{name}:" in r.getMessage()
        for r in caplog.records
    )


@pytest.mark.integration
async def test_nan_inf_zero_huge_and_unparsable_metrics_are_rejected_and_the_round_goes_on(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(INTERVAL_ENV, "0.3")
    monkeypatch.setenv(store.NAMESPACE_ENV, HOME)
    # Read in the order of their pods' names: every bad one before the good one.
    names = ("a-nan", "b-inf", "c-huge", "d-zero", "z-good")
    trainers = {name: PacedTrainer(monkeypatch) for name in names}
    garbage = GarbageExporter()
    await garbage.start()
    try:
        async with running_operator(cluster):
            for name in names:
                plan = await _running_job(cluster, name, trainers[name])
                if name == "c-huge":  # a thousand times the GPU's peak
                    trainers[name].rate = 1000 * plan["predicted"]["tokensPerSecondPerGpu"]
                if name == "d-zero":  # steps go by, no token is trained
                    trainers[name].rate = 1e-12
            for name in ("a-nan", "b-inf"):
                await wait_for(lambda n=name: cluster.status(n).get("measured"), what=f"{name} measured")
            trainers["a-nan"].metrics.tokens.inc(float("nan"))
            trainers["b-inf"].metrics.tokens.inc(float("inf"))
            # A job whose pod answers garbage, read before the others too.
            job = await _garbage_job(cluster, "a0-garbage", garbage.port)
            assert job is not None
            await wait_for(lambda: _rejected(caplog, "c-huge"), what="the huge reading rejected")
            await wait_for(lambda: _rejected(caplog, "d-zero"), what="the zero reading rejected")
            stored = await wait_for(
                lambda: (
                    (c := _stored(cluster)) is not None
                    and any(s.job.endswith("/z-good") for s in c.samples)
                    and c
                ),
                timeout=30,
                what="the good job's sample, taken in rounds that also read the bad ones",
            )
            measured_before = cluster.status("z-good")["measured"]["observedAt"]
            await wait_for(
                lambda: (
                    cluster.status("z-good")["measured"]["observedAt"] != measured_before
                    or cluster.status("z-good").get("progress", {}).get("step", 0) > 0
                ),
                what="the good job measured again",
            )
    finally:
        await garbage.close()
        for trainer in trainers.values():
            trainer.close()
    jobs = {s.job.split("/", 1)[1] for s in stored.samples}
    assert jobs <= {"a-nan", "b-inf", "z-good"} and "z-good" in jobs, jobs
    for s in stored.samples:  # whatever was stored before the NaN and Inf came is a real reading
        assert implausible(s) is None
    assert "c-huge" not in jobs and "d-zero" not in jobs and "a0-garbage" not in jobs
    assert "measured" not in cluster.status("a0-garbage")


async def _garbage_job(cluster: Cluster, name: str, port: int) -> dict[str, Any]:
    """A running BTJ whose only worker's /metrics answers garbage."""
    job = await cluster.running_child(name, tuning=FAMILY)
    body = pod(f"{name}-worker-0", job=name, owner=job)
    body["spec"]["containers"][0]["ports"] = [{"name": "metrics", "containerPort": port}]
    await cluster.add_pod(body, pod_status(container(), podIP="127.0.0.1"))
    return job


@pytest.mark.integration
async def test_another_namespace_s_runs_do_not_move_this_namespace_s_plans(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from blackwell_operator.handlers.api import load_api_client

    monkeypatch.setenv(store.NAMESPACE_ENV, HOME)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kubeconfig", cluster.url)))
        api = KubeApi(load_api_client())
    # Twenty jobs of another team, all measured at half the modelled speed, of the family planned here.
    for i in range(KEEP_PER_FAMILY):
        other = _sample(f"b{i}").model_copy(update={"job": f"team-b/b{i}", "tokens_ratio": 0.5})
        await asyncio.to_thread(store.record, api, HOME, other)
    async with running_operator(cluster):
        await cluster.apply(btj("mine", tuning=FAMILY))
        mine = await wait_for(lambda: cluster.status("mine").get("plan"), what="mine's plan")
        # The pool is the operator's opt-in (read at each plan): team-b then counts with a few votes.
        monkeypatch.setenv(store.POOL_ENV, "true")
        await cluster.apply(btj("pooled", tuning=FAMILY))
        pooled = await wait_for(lambda: cluster.status("pooled").get("plan"), what="pooled's plan")
    assert mine.get("clusterCorrection") is None, "team-b's runs do not move team-a's plan"
    assert pooled["clusterCorrection"]["runs"] == POOL_PER_NAMESPACE
    assert pooled["clusterCorrection"]["tokensFactor"] == 0.5


def test_the_calibration_config_map_is_marked_like_everything_the_operator_makes() -> None:
    # It said managed-by btj-operator once, where the children, their pods, the Events and the chart's
    # trainer PodMonitor say blackwell-operator (applabels.py, the one home).
    from blackwell_operator.applabels import COMPONENT_LABEL, MANAGED_BY_LABEL, MANAGER
    from blackwell_operator.calibration.cluster import ClusterCalibration
    from blackwell_operator.render.labels import own_labels

    labels = store.body_of(ClusterCalibration(), "btj-system")["metadata"]["labels"]
    assert labels[MANAGED_BY_LABEL] == MANAGER == own_labels("w")[MANAGED_BY_LABEL]
    assert labels[COMPONENT_LABEL] == store.NAME
