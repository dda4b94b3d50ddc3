"""The GPU is learned, memory included: the real operator under KopfRunner reads a first job's probe, whose
measured peaks are well under the model's, into the cluster calibration; the second job of the same spec in
the same namespace then plans the larger micro-batch the model had ruled out (its plan and its Planned
condition say from how many readings), and a job in another namespace plans on the model (issue 37). A
training run that ran out of memory keeps its configuration out of every later plan on that GPU."""

from __future__ import annotations

from typing import Any

import pytest

from blackwell_operator.calibration.learned_memory import (
    MEMORY_BOUNDS,
    MIN_READINGS,
    MemorySource,
    floor_ratio,
)
from blackwell_operator.handlers import cluster_calibration as store
from blackwell_operator.handlers.measure import INTERVAL_ENV
from blackwell_operator.planner.cluster_figures import candidate_figures, figures_of
from blackwell_trainer.plan.config import Plan, ProbeResult
from tests.operator.harness import NAMESPACE, Cluster, btj, running_operator, wait_for
from tests.operator.test_cluster_calibration import SLOW, PacedTrainer, serve_worker
from tests.operator.test_probe_result import probed_events, stored_calibration
from tests.support.helm import NAMESPACE as HOME
from tests.support.oom import oom_message
from tests.support.pods import T2, container, pod, pod_status, terminated
from tests.support.probe_results import measured_probe

# 30 sequences per rank: micro-batch 5 (accumulating 6) and 6 (accumulating 5) both reach it exactly, so
# memory alone picks the size; long enough that `probe: auto` probes (its candidates are modelled).
TRAINING = {"sequenceLength": 8192, "steps": 20_000, "globalBatchTokens": 8192 * 16 * 30}
# BF16, whose AC none is a neighbour of its selective pick: under FP8 this trainer runs selective as none, so
# the pick (mbs 5) has no neighbour and auto does not probe.
TUNING = {"precision": "bf16"}
PEAK = 0.85  # measured over modelled peak reserved: the model over-predicts this GPU's memory
OTHER_NAMESPACE = "hyperpod-ns-team-b"


def result_for(plan: Plan) -> ProbeResult:
    """The probe of the plan's candidates (not its larger sizes, as in the issue): each measured at its
    predicted speed and PEAK of its modelled peak; the planner's pick wins."""
    assert plan.probe is not None
    return measured_probe(
        plan,
        speed=[1.0] * len(plan.probe.candidates),
        peak=lambda c: PEAK * candidate_figures(c).modelled_peak_reserved,
        winner=0,
        seconds_each=60.0,
        seconds=130.0,
    )


async def planned(cluster: Cluster, name: str) -> Plan:
    raw = await wait_for(lambda: cluster.status(name).get("plan"), what=f"{name}'s plan")
    return Plan.model_validate(raw)


async def other_namespace_plan(cluster: Cluster, name: str) -> Plan:
    """A BTJ of the same spec in another namespace (created as `kubectl create namespace` does), planned."""
    await cluster._json("POST", "/api/v1/namespaces", {"metadata": {"name": OTHER_NAMESPACE}})
    manifest = btj(name, training=TRAINING, tuning=TUNING)
    manifest["metadata"]["namespace"] = OTHER_NAMESPACE
    await cluster._json("POST", cluster_path(OTHER_NAMESPACE), manifest)

    def plan() -> Any:
        found = cluster.k.get_object(
            "training.blackwell.dev/v1alpha1/blackwelltrainingjobs", OTHER_NAMESPACE, name
        )
        return ((found or {}).get("status") or {}).get("plan")

    return Plan.model_validate(await wait_for(plan, what=f"{name}'s plan in {OTHER_NAMESPACE}"))


def cluster_path(namespace: str) -> str:
    return f"/apis/training.blackwell.dev/v1alpha1/namespaces/{namespace}/blackwelltrainingjobs"


@pytest.mark.integration
async def test_a_second_job_plans_the_larger_micro_batch_from_the_first_job_s_measured_peaks(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(store.NAMESPACE_ENV, HOME)
    async with running_operator(cluster):
        await cluster.apply(btj("first", training=TRAINING, tuning=TUNING))
        job = await wait_for(lambda: cluster.job("first"), what="first's PyTorchJob")
        first = await planned(cluster, "first")
        assert first.probe is not None and first.probe.enabled, first.probe
        result = result_for(first)
        done = container(state={"terminated": terminated(0, "Completed", T2, f"done\n{result.to_line()}\n")})
        await cluster.add_pod(pod("first-worker-0", job="first", owner=job), pod_status(done))
        await wait_for(lambda: probed_events(cluster, "first"), what="first's Probed Event")
        await wait_for(
            lambda: (
                (c := stored_calibration(cluster)) is not None
                and len(c.memory_evidence(first.instance_type, NAMESPACE)[0]) >= MIN_READINGS
            ),
            what="the first job's measured peaks in the cluster calibration",
        )
        await cluster.apply(btj("second", training=TRAINING, tuning=TUNING))
        second = await planned(cluster, "second")
        condition = await wait_for(lambda: cluster.condition("second", "Planned"), what="second's Planned")
        elsewhere = await other_namespace_plan(cluster, "elsewhere")

    # The model ruled the next size out: the first job trains the smaller one.
    assert first.probe is not None
    larger = first.chosen.micro_batch_size + 1
    assert [g.candidate.micro_batch_size for g in first.probe.growth][:1] == [larger]
    assert first.cluster_correction is None
    # The second job plans it, from the first job's peaks (one reading per measured candidate).
    assert second.chosen.micro_batch_size == larger, second.explanation
    correction = second.cluster_correction
    assert correction is not None
    assert correction.memory_factor == MEMORY_BOUNDS[0] and correction.memory_readings == len(
        result.measurements
    )
    assert correction.tokens_factor == 1.0  # one job: its speed is not the cluster's yet
    said = f"peak memory x0.90 (learned from {len(result.measurements)} measured peaks on this GPU type)"
    assert any(said in line for line in second.explanation)
    assert said in condition["message"]
    # Another namespace's job plans on the model: the first job's peaks are not its namespace's.
    assert elsewhere.chosen.micro_batch_size == first.chosen.micro_batch_size
    assert elsewhere.cluster_correction is None


@pytest.mark.integration
async def test_a_training_run_out_of_memory_keeps_its_configuration_out_of_later_plans(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(store.NAMESPACE_ENV, HOME)
    unprobed = {"probe": {"policy": "never"}}
    async with running_operator(cluster):
        await cluster.apply(btj("ran-out", training=TRAINING, tuning=unprobed))
        job = await wait_for(lambda: cluster.job("ran-out"), what="ran-out's PyTorchJob")
        failed = await planned(cluster, "ran-out")
        ended = container(state={"terminated": terminated(1, "Error", T2, oom_message(failed))})
        await cluster.add_pod(pod("ran-out-worker-0", job="ran-out", owner=job), pod_status(ended))
        calibration = await wait_for(
            lambda: (c := stored_calibration(cluster)) is not None and c.memory and c,
            what="the out-of-memory floor in the cluster calibration",
        )
        await cluster.apply(btj("after", training=TRAINING, tuning=unprobed))
        after = await planned(cluster, "after")

    # The run's true peak was above the card: the factor that puts its modelled peak over the card.
    (floor,) = calibration.memory
    uid = cluster.btj("ran-out")["metadata"]["uid"]  # type: ignore[index]
    assert floor.source is MemorySource.OUT_OF_MEMORY and floor.uid.startswith(f"{uid}/oom-")
    assert floor.ratio == floor_ratio(failed.gpu.memory_bytes, figures_of(failed).modelled_peak_reserved)
    # A later job of the same spec never plans that configuration: it fits no budget on that GPU now.
    correction = after.cluster_correction
    assert correction is not None and correction.memory_floor == floor.ratio
    assert correction.memory_factor == floor.ratio and correction.memory_readings == 0
    assert after.chosen.micro_batch_size < failed.chosen.micro_batch_size
    assert any("where a configuration ran out of memory" in line for line in after.explanation)


@pytest.mark.integration
async def test_probed_jobs_still_running_teach_the_next_plan_from_the_winner_their_pods_export(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two probed jobs train for days: no termination message yet, and the result their pods serve has no
    # measurements (as from a trainer that served none at all), so status.probe stays empty and only the
    # pods' metrics say which candidate won. Their readings, taken against that candidate's figures, are two
    # readings of the GPU type's memory: a third job of the same spec plans the larger micro-batch now.
    monkeypatch.setenv(INTERVAL_ENV, "0.3")
    monkeypatch.setenv(store.NAMESPACE_ENV, HOME)
    running = ("first", "also")
    trainers = {name: PacedTrainer(monkeypatch) for name in running}
    try:
        async with running_operator(cluster):
            plans = {name: await _probed_and_running(cluster, name, trainers[name]) for name in running}
            calibration = await wait_for(
                lambda: (
                    (c := stored_calibration(cluster)) is not None and len(c.samples) == len(running) and c
                ),
                timeout=30,
                what="a running reading of each probed job in the cluster calibration",
            )
            first = plans["first"]
            assert first.probe is not None
            won = first.probe.options[1]  # what the paced workers say they train with
            # `kubectl get btj` says what they train: the winner their pods export, not the planner's pick.
            won_ac = won.candidate.activation_checkpointing.value
            for name in running:
                await wait_for(
                    lambda n=name: cluster.status(n).get("activationCheckpointing") == won_ac,  # type: ignore[misc]
                    what=f"{name}'s AC column naming the winner",
                )
            await cluster.apply(btj("third", training=TRAINING, tuning=TUNING))
            third = await planned(cluster, "third")
    finally:
        for trainer in trainers.values():
            trainer.close()

    assert won.candidate.activation_checkpointing != first.chosen.activation_checkpointing
    for sample in calibration.samples:
        uid = cluster.btj(sample.job.split("/")[1])["metadata"]["uid"]  # type: ignore[index]
        assert sample.uid == uid  # the job's own sample, which its termination message would later replace
        assert (sample.precision_recipe, sample.activation_checkpointing) == (
            won.candidate.precision_recipe,
            won.candidate.activation_checkpointing,
        )
        assert sample.tokens_ratio == pytest.approx(SLOW, rel=0.15)
        assert sample.memory_ratio == pytest.approx(PEAK, rel=0.01)
    assert all(not cluster.status(name).get("probe") for name in running)  # nothing ended: no result read
    winner_rate = round(won.prediction.tokens_per_second_per_gpu, 1)
    assert all(cluster.status(n)["predictedTokensPerSecondPerGpu"] == winner_rate for n in running)
    assert third.chosen.micro_batch_size == first.chosen.micro_batch_size + 1, third.explanation
    correction = third.cluster_correction
    assert correction is not None and correction.memory_factor == MEMORY_BOUNDS[0]


async def _probed_and_running(cluster: Cluster, name: str, trainer: PacedTrainer) -> Plan:
    """Apply BTJ `name` (probed), report its job Running, and start a worker whose exporter says it probed
    and trains with candidate 1, at SLOW times that candidate's predicted speed and PEAK times its modelled
    peak."""
    job = await cluster.running_child(name, training=TRAINING, tuning=TUNING)
    plan = await planned(cluster, name)
    assert plan.probe is not None and plan.probe.enabled, plan.probe
    won = plan.probe.options[1]
    trainer.metrics.record_probe(plan, ProbeResult(winner=1, chosen=won.candidate, seconds=130.0))
    trainer.rate = SLOW * won.prediction.tokens_per_second_per_gpu
    trainer.reserved = int(PEAK * candidate_figures(won).modelled_peak_reserved)
    await serve_worker(cluster, name, job, trainer)
    return plan
