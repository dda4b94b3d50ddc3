"""A trainer's probe result reaches its BTJ: the real operator under KopfRunner reads the probe line of a
worker's termination message and writes status.probe, posts one `Probed` Event, adds a sample for every
probed family to the cluster calibration and copies the result into the plan ConfigMap (a restart trains
with it; the job and its pods are untouched, and an operator restart keeps it). After three such jobs, a
later BTJ in the same namespace plans without a probe: its candidates' families are measured now. A worker
that failed and carries a probe line is one status write; a pod no child of a BTJ controls teaches nothing."""

from __future__ import annotations

import json
from typing import Any

import kmock
import pytest

from blackwell_operator.calibration.cluster import MIN_RUNS, ClusterCalibration
from blackwell_operator.handlers import cluster_calibration as store
from blackwell_operator.handlers.measure import INTERVAL_ENV
from blackwell_operator.render.environment import PLAN_FILE
from blackwell_operator.render.labels import PLAN_HASH_ANNOTATION
from blackwell_operator.render.pod import plan_config_map_name
from blackwell_trainer import probe as trainer_probe
from blackwell_trainer.plan.config import Plan, ProbeResult
from tests.operator.harness import NAMESPACE, Cluster, btj, from_operator, running_operator, wait_for
from tests.operator.test_cluster_calibration import PacedTrainer, serve_worker
from tests.support.helm import NAMESPACE as HOME
from tests.support.pods import T2, container, pod, pod_status, terminated
from tests.support.probe_results import measured_probe

# Long enough that the probe pays for itself (auto probes: 2 candidates of modelled families).
TRAINING = {"sequenceLength": 8192, "steps": 20_000}
# Mistral 7B in BF16: AC none (the pick, mbs 4) and AC selective (mbs 4, 2.6% slower) are two runs. The
# embedded example's Llama 3.1 8B plans FP8, whose selective this trainer runs as AC none
# (trainer.selective_recomputes_nothing): one family, nothing to probe. In BF16 it pairs selective mbs 4 with
# none mbs 2, which a later job, with memory learned, can no longer fit with the probe's margin.
MODEL = {"preset": "mistral-7b"}
TUNING = {"precision": "bf16"}
JOBS = ("a", "b", "c")[:MIN_RUNS]
SPEED = [0.92, 0.97]  # measured over predicted tokens/s: the runner-up (candidate 1) wins, by ~2%
PEAK = 0.92  # measured over predicted peak reserved


def result_for(plan: Plan) -> ProbeResult:
    """What the trainer's probe reports for `plan`: each candidate at SPEED times its prediction."""
    return measured_probe(
        plan,
        speed=SPEED,
        peak=lambda c: PEAK * c.prediction.memory.peak_reserved,
        winner=1,
        seconds_each=50.0,
        seconds=104.0,
    )


async def probed_job(cluster: Cluster, name: str) -> tuple[Plan, ProbeResult, dict[str, Any]]:
    """Apply BTJ `name`; its worker completes with the probe line in its termination message."""
    await cluster.apply(btj(name, model=MODEL, training=TRAINING, tuning=TUNING))
    job = await wait_for(lambda: cluster.job(name), what=f"{name}'s PyTorchJob")
    raw = await wait_for(lambda: cluster.status(name).get("plan"), what=f"{name}'s plan")
    plan = Plan.model_validate(raw)
    assert plan.probe is not None and plan.probe.enabled and len(plan.probe.candidates) == len(SPEED)
    result = result_for(plan)
    done = container(state={"terminated": terminated(0, "Completed", T2, f"done\n{result.to_line()}\n")})
    await cluster.add_pod(pod(f"{name}-worker-0", job=name, owner=job), pod_status(done))
    return plan, result, job


def probed_events(cluster: Cluster, name: str) -> list[dict[str, Any]]:
    return [e for e in cluster.events(name) if e.get("reason") == "Probed"]


def stored_calibration(cluster: Cluster) -> ClusterCalibration | None:
    found = cluster.k.get_object("v1/configmaps", HOME, store.NAME)
    return None if found is None else store.parse(found)


def config_map_plan(cluster: Cluster, name: str) -> Plan:
    found = cluster.config_map(plan_config_map_name(name))
    assert found is not None
    return Plan.model_validate_json(found["data"][PLAN_FILE])


@pytest.mark.integration
async def test_a_probe_result_becomes_status_an_event_samples_and_the_plans_copy(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(store.NAMESPACE_ENV, HOME)
    async with running_operator(cluster):
        plan, result, job = await probed_job(cluster, "a")
        probe = await wait_for(lambda: cluster.status("a").get("probe"), what="status.probe")
        columns = cluster.status("a")  # written with status.probe, in the same status write
        (event,) = await wait_for(lambda: probed_events(cluster, "a"), what="the Probed Event")
        # The same pod's next event (a status update) changes nothing and posts nothing.
        await cluster.set_pod_status(
            "a-worker-0",
            pod_status(
                container(
                    state={"terminated": terminated(0, "Completed", T2, f"done\n{result.to_line()}\n")}
                ),
                podIP="10.0.0.9",
            ),
        )
        await cluster.settle("a")
        for name in JOBS[1:]:
            await probed_job(cluster, name)
            await wait_for(lambda n=name: cluster.status(n).get("probe"), what=f"{name}'s status.probe")
        calibration = await wait_for(
            lambda: (c := stored_calibration(cluster)) is not None and len(c.samples) == 2 * len(JOBS) and c,
            what="a sample of every probed family of every job",
        )
        await cluster.apply(btj("later", model=MODEL, training=TRAINING, tuning=TUNING))
        later = await wait_for(lambda: cluster.status("later").get("plan"), what="the later plan")
    assert len(probed_events(cluster, "a")) == 1

    # status.probe: each candidate's configuration, prediction and measurement; the winner; the gap.
    assert probe["winner"] == 1 and probe["chosen"] == plan.probe.candidates[1].candidate.model_dump(
        by_alias=True, mode="json"
    )
    pick, won = (m.tokens_per_second_per_gpu or 0.0 for m in result.measurements)
    assert probe["pickBehind"] == pytest.approx(1 - pick / won, abs=1e-4) and won > pick
    assert probe["childUid"] == job["metadata"]["uid"] and probe["generation"] == 1
    # The columns `kubectl get btj` prints name what the job trains now: the winner, not the pick.
    won_config = plan.probe.candidates[1].candidate
    assert won_config.activation_checkpointing != plan.chosen.activation_checkpointing
    assert (columns["precision"], columns["microBatchSize"], columns["activationCheckpointing"]) == (
        won_config.precision.value,
        won_config.micro_batch_size,
        won_config.activation_checkpointing.value,
    )
    won_prediction = plan.probe.candidates[1].prediction
    assert columns["predictedTokensPerSecondPerGpu"] == round(won_prediction.tokens_per_second_per_gpu, 1)
    for i, c in enumerate(probe["candidates"]):
        wanted = plan.probe.candidates[i]
        assert c["configuration"] == wanted.candidate.model_dump(by_alias=True, mode="json")
        assert c["predictedTokensPerSecondPerGpu"] == wanted.prediction.tokens_per_second_per_gpu
        assert c["tokensPerSecondPerGpu"] == result.measurements[i].tokens_per_second_per_gpu
        assert c["peakReservedBytes"] == result.measurements[i].peak_reserved_bytes
    assert event["type"] == "Normal" and event["message"].startswith(
        "probed 2 candidates in 104 s: training with candidate 1 at "
    )
    # The Event says the figure status.probe keeps (4 decimals), so both read the same.
    assert f"the planner's pick measured {round(1 - pick / won, 4):.1%} slower" in event["message"]

    # The plan's copy: the ConfigMap and status.plan carry the result, so a restart of the trainer trains
    # with candidate 1 and never probes (the trainer's own reading of the copy); the job is untouched.
    copied = config_map_plan(cluster, "a")
    assert copied.probe is not None and copied.probe.result == result
    assert trainer_probe.earlier_choice(copied, "") == result
    assert Plan.model_validate(cluster.status("a")["plan"]).probe.result == result  # type: ignore[union-attr]
    now = cluster.job("a")
    assert now is not None and now["metadata"]["resourceVersion"] == job["metadata"]["resourceVersion"]

    # Every probed family of every job is one sample, keyed by job; the winner's by the job's own uid (the
    # measure loop's later reading of the running job replaces it).
    uids = {cluster.btj(n)["metadata"]["uid"]: n for n in JOBS}  # type: ignore[index]
    assert {s.uid for s in calibration.samples} == {u for u in uids} | {f"{u}/probe-0" for u in uids}
    for s in calibration.samples:
        assert s.job.startswith(f"{NAMESPACE}/") and s.memory_ratio == pytest.approx(PEAK, abs=1e-3)
        assert s.tokens_ratio == pytest.approx(SPEED[0] if "/probe-0" in s.uid else SPEED[1], abs=1e-3)

    # A later job of the same spec in that namespace: every candidate's family is measured, no probe.
    assert later["probe"]["enabled"] is False, later["probe"]
    assert "measured" in later["probe"]["reason"]
    assert all(c["measured"] for c in later["probe"]["candidates"])


@pytest.mark.integration
async def test_an_operator_restart_keeps_the_copy_and_says_nothing_twice(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(store.NAMESPACE_ENV, HOME)
    async with running_operator(cluster):
        _, result, job = await probed_job(cluster, "a")
        await wait_for(lambda: probed_events(cluster, "a"), what="the Probed Event")
        await wait_for(lambda: config_map_plan(cluster, "a").probe.result, what="the copy")  # type: ignore[union-attr]
    hashed = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["metadata"]["annotations"]
    # A new operator reconciles the BTJ afresh (a resume pass) and reads the pod again.
    async with running_operator(cluster):
        await cluster.settle("a")
    copied = config_map_plan(cluster, "a")
    assert copied.probe is not None and copied.probe.result == result
    assert len(probed_events(cluster, "a")) == 1
    now = cluster.job("a")
    assert now is not None and now["metadata"]["resourceVersion"] == job["metadata"]["resourceVersion"]
    assert (
        now["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["metadata"]["annotations"][
            PLAN_HASH_ANNOTATION
        ]
        == hashed[PLAN_HASH_ANNOTATION]
    )
    assert json.loads(json.dumps(cluster.status("a")["probe"]))["winner"] == 1


@pytest.mark.integration
async def test_a_failed_worker_with_a_probe_line_is_one_status_write_and_a_forged_pod_teaches_nothing(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(store.NAMESPACE_ENV, HOME)
    async with running_operator(cluster):
        await cluster.apply(btj("f", model=MODEL, training=TRAINING, tuning=TUNING))
        job = await wait_for(lambda: cluster.job("f"), what="f's PyTorchJob")
        plan = Plan.model_validate(await wait_for(lambda: cluster.status("f").get("plan"), what="f's plan"))
        await cluster.settle("f")
        line = result_for(plan).to_line()
        # Our labels, but no child of a BTJ controls it: its probe line is ignored.
        await cluster.add_pod(
            pod("f-forged", job="f"),
            pod_status(container(state={"terminated": terminated(0, "Completed", T2, line)})),
        )
        await wait_for(lambda: "f-forged carries the trainer's labels" in caplog.text, what="the refusal")
        assert "probe" not in cluster.status("f") and stored_calibration(cluster) is None
        since = len(list(cluster.k.requests))
        failed = container(state={"terminated": terminated(1, "Error", T2, f"error: NCCL timeout\n{line}")})
        await cluster.add_pod(pod("f-worker-0", job="f", owner=job), pod_status(failed))
        await wait_for(
            lambda: cluster.status("f").get("probe") and cluster.status("f").get("lastFailure"),
            what="status.probe and lastFailure",
        )
        await cluster.settle("f")
    writes = [
        r
        for r in list(cluster.k.requests)[since:]
        if from_operator(r) and r.method == kmock.method.PATCH and r.subresource == "status" and r.name == "f"
    ]
    assert len(writes) == 1, "the failure and the probe are one write"
    assert cluster.status("f")["lastFailure"]["pod"] == "f-worker-0"
    calibration = stored_calibration(cluster)
    assert calibration is not None and {s.job for s in calibration.samples} == {f"{NAMESPACE}/f"}
    assert len(calibration.samples) == len(SPEED) and len(probed_events(cluster, "f")) == 1


def with_speeds(plan: Plan, winner: int, speeds: list[float]) -> ProbeResult:
    """result_for with other figures and winner: what a worker that disagrees would report."""
    result = result_for(plan)
    for m, speed in zip(result.measurements, speeds, strict=True):
        m.tokens_per_second_per_gpu = round(speed * m.predicted_tokens_per_second_per_gpu, 1)
    assert plan.probe is not None
    return result.model_copy(update={"winner": winner, "chosen": plan.probe.candidates[winner].candidate})


async def add_worker(cluster: Cluster, name: str, index: int, job: dict[str, Any], line: str) -> None:
    done = container(state={"terminated": terminated(0, "Completed", T2, f"done\n{line}\n")})
    await cluster.add_pod(pod(f"{name}-worker-{index}", job=name, owner=job), pod_status(done))


@pytest.mark.integration
async def test_the_first_result_of_a_child_stays_and_a_later_different_one_is_not_taken(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(store.NAMESPACE_ENV, HOME)
    async with running_operator(cluster):
        plan, first, job = await probed_job(cluster, "a")
        probe = await wait_for(lambda: cluster.status("a").get("probe"), what="status.probe")
        # Two more workers of the same child report other figures and another winner.
        await add_worker(cluster, "a", 1, job, with_speeds(plan, 0, [1.05, 0.9]).to_line())
        await add_worker(cluster, "a", 2, job, with_speeds(plan, 1, [0.5, 0.99]).to_line())
        for worker in ("a-worker-1", "a-worker-2"):  # handled: refused (logged) or taken (status moved)
            await wait_for(
                lambda w=worker: (
                    f"{w}: status.probe holds this generation's first result" in caplog.text
                    or cluster.status("a").get("probe") != probe
                ),
                what=f"{worker}'s result handled",
            )
        await cluster.settle("a")
    assert cluster.status("a")["probe"] == probe
    assert len(probed_events(cluster, "a")) == 1
    copied = config_map_plan(cluster, "a")
    assert copied.probe is not None and copied.probe.result == first
    calibration = stored_calibration(cluster)
    assert calibration is not None and len(calibration.samples) == len(SPEED)  # the first result's only


@pytest.mark.integration
async def test_figures_beyond_the_gpu_are_refused_and_the_job_trains_the_planners_pick(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(store.NAMESPACE_ENV, HOME)
    async with running_operator(cluster):
        await cluster.apply(btj("r", model=MODEL, training=TRAINING, tuning=TUNING))
        job = await wait_for(lambda: cluster.job("r"), what="r's PyTorchJob")
        plan = Plan.model_validate(await wait_for(lambda: cluster.status("r").get("plan"), what="r's plan"))
        wild = result_for(plan)
        wild.measurements[1].tokens_per_second_per_gpu = 1e30
        await add_worker(cluster, "r", 0, job, wild.to_line())
        (event,) = await wait_for(
            lambda: [e for e in cluster.events("r") if e.get("reason") == "ProbeRefused"], what="the refusal"
        )
        probe = await wait_for(lambda: cluster.status("r").get("probe"), what="status.probe")
        await cluster.settle("r")
    assert plan.probe is not None
    pick = plan.probe.candidates[0].candidate
    assert event["type"] == "Warning" and "BF16 dense peak" in event["message"]
    assert "; training the planner's pick, which is " in event["message"]
    assert probe["winner"] == 0 and probe["chosen"] == pick.model_dump(by_alias=True, mode="json")
    assert probe["refused"] in event["message"] and probe["summary"] == event["message"]
    assert "1e+30" not in json.dumps(probe) and probe.get("candidates", []) == []
    assert probed_events(cluster, "r") == [] and stored_calibration(cluster) is None
    copied = config_map_plan(cluster, "r")
    assert copied.probe is not None and copied.probe.result is not None
    assert (copied.probe.result.winner, copied.probe.result.chosen) == (0, pick)
    assert trainer_probe.earlier_choice(copied, wild.to_line()) == copied.probe.result


@pytest.mark.integration
async def test_a_running_worker_s_served_result_is_taken_before_its_run_ends(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A job that trains for days: its worker serves the probe's result beside /metrics once it has chosen,
    # and the measure loop takes it then, with the termination message's effects; the message at the end of
    # the run carries the same line and changes nothing.
    monkeypatch.setenv(INTERVAL_ENV, "0.3")
    monkeypatch.setenv(store.NAMESPACE_ENV, HOME)
    trainer = PacedTrainer(monkeypatch)
    try:
        async with running_operator(cluster):
            job = await cluster.running_child("a", model=MODEL, training=TRAINING, tuning=TUNING)
            plan = Plan.model_validate(
                await wait_for(lambda: cluster.status("a").get("plan"), what="a's plan")
            )
            assert plan.probe is not None and plan.probe.enabled
            result = result_for(plan)
            trainer.metrics.record_probe(plan, result)
            trainer.rate = SPEED[1] * plan.probe.candidates[1].prediction.tokens_per_second_per_gpu
            await serve_worker(cluster, "a", job, trainer)
            probe = await wait_for(lambda: cluster.status("a").get("probe"), what="status.probe from the pod")
            (event,) = await wait_for(lambda: probed_events(cluster, "a"), what="the Probed Event")
            running = cluster.status("a")
            copied = config_map_plan(cluster, "a")
            ended = container(
                state={"terminated": terminated(0, "Completed", T2, f"done\n{result.to_line()}\n")}
            )
            await cluster.set_pod_status("a-worker-0", pod_status(ended, podIP="127.0.0.1"))
            await cluster.settle("a")
    finally:
        trainer.close()
    assert (
        running["phase"] == "Running" and probe["winner"] == 1 and probe["childUid"] == job["metadata"]["uid"]
    )
    assert event["message"].startswith("probed 2 candidates in 104 s: training with candidate 1 at ")
    assert copied.probe is not None and copied.probe.result == result  # a restart trains with the winner
    won = plan.probe.candidates[1].candidate
    assert running["activationCheckpointing"] == won.activation_checkpointing.value
    assert len(probed_events(cluster, "a")) == 1  # the same line at the end of the run: nothing twice
    assert cluster.status("a")["probe"] == probe
