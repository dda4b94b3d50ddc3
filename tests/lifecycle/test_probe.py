"""The operator's reading of a probe result (pure): from a pod's termination message to the Probed Event and
one calibration sample per measured candidate, and a later plan on the same cluster that skips the probe
because its candidates are now measured."""

from __future__ import annotations

from blackwell_operator.calibration.cluster import MIN_RUNS, ClusterCalibration
from blackwell_operator.lifecycle.probe import probe_result_of, probe_samples, probed_event
from blackwell_operator.models.spec import BlackwellTrainingJobSpec
from blackwell_operator.planner import plan_job
from blackwell_trainer.config import Plan, ProbeMeasurement, ProbeOutcome, ProbeResult
from tests.planner.conftest import make_spec

NOW = "2026-12-01T10:00:00Z"


def spec() -> BlackwellTrainingJobSpec:
    raw = make_spec(nodes=2, seq=4096).model_dump(by_alias=True, mode="json")
    raw["training"]["steps"] = 20_000
    return BlackwellTrainingJobSpec.model_validate(raw)


def result_for(plan: Plan, winner: int, speed: list[float], oom: int | None = None) -> ProbeResult:
    """The trainer's result: candidate i measured at speed[i] x its prediction (`oom` ran out)."""
    assert plan.probe is not None
    measurements = []
    for i, c in enumerate(plan.probe.candidates):
        predicted = c.prediction.tokens_per_second_per_gpu
        lost = i == oom
        measurements.append(
            ProbeMeasurement(
                index=i,
                outcome=ProbeOutcome.OUT_OF_MEMORY if lost else ProbeOutcome.MEASURED,
                predicted_tokens_per_second_per_gpu=predicted,
                predicted_peak_reserved_bytes=c.prediction.memory.peak_reserved,
                tokens_per_second_per_gpu=None if lost else round(predicted * speed[i], 1),
                peak_reserved_bytes=None if lost else int(c.prediction.memory.peak_reserved * 0.95),
                detail="rank 1: OutOfMemoryError: CUDA out of memory" if lost else "",
            )
        )
    return ProbeResult(winner=winner, measurements=measurements, seconds=140.0)


def pod_with(message: str) -> dict[str, object]:
    terminated = {"exitCode": 0, "reason": "Completed", "message": message}
    return {"status": {"containerStatuses": [{"name": "trainer", "state": {"terminated": terminated}}]}}


def test_the_result_is_read_from_the_pod_and_the_event_says_how_far_the_pick_was() -> None:
    plan = plan_job(spec(), job_name="j")
    assert plan.probe is not None and len(plan.probe.candidates) >= 2
    result = result_for(plan, winner=1, speed=[0.90, 1.00, 1.0][: len(plan.probe.candidates)])
    found = probe_result_of(pod_with(f"some line\n{result.to_line()}\n"))
    assert found == result
    assert probe_result_of(pod_with("error: no probe here")) is None
    event = probed_event(plan, result)
    assert event is not None and event[0] == "Probed"
    assert "training with candidate 1" in event[1]
    won = result.measurements[1].tokens_per_second_per_gpu
    pick = result.measurements[0].tokens_per_second_per_gpu
    assert won and pick and f"the planner's pick measured {1 - pick / won:.1%} slower" in event[1]


def test_a_dropped_candidate_is_named_and_teaches_the_calibration_nothing() -> None:
    plan = plan_job(spec(), job_name="j")
    assert plan.probe is not None
    result = result_for(plan, winner=0, speed=[1.0] * len(plan.probe.candidates), oom=1)
    event = probed_event(plan, result)
    assert (
        event is not None and "the planner's pick won" in event[1] and "dropped: 1 out-of-memory" in event[1]
    )
    samples = probe_samples({"namespace": "a", "name": "j", "uid": "u1"}, plan, result, NOW)
    assert [s.uid for s in samples] == [
        "u1/probe-" + str(i) for i in range(len(plan.probe.candidates)) if i != 1
    ]


def test_every_candidate_s_measurement_is_a_sample_and_a_later_plan_skips_the_probe() -> None:
    first = plan_job(spec(), job_name="j0")
    assert first.probe is not None and first.probe.enabled
    count = len(first.probe.candidates)
    calibration = ClusterCalibration()
    for job in range(MIN_RUNS):  # three jobs on this cluster probed the same candidates
        result = result_for(first, winner=0, speed=[0.97] * count)
        samples = probe_samples({"namespace": "a", "name": f"j{job}", "uid": f"u{job}"}, first, result, NOW)
        assert len(samples) == count
        assert {(s.precision_recipe, s.activation_checkpointing) for s in samples} == {
            (c.candidate.precision_recipe, c.candidate.activation_checkpointing)
            for c in first.probe.candidates
        }
        assert all(s.tokens_ratio == 0.97 and s.memory_ratio == 0.95 for s in samples)
        for s in samples:
            calibration = calibration.record(s)
    later = plan_job(spec(), job_name="j9", cluster=calibration.corrector(first.instance_type))
    assert later.probe is not None and not later.probe.enabled
    assert "measured" in later.probe.reason
    assert later.cluster_correction is not None and later.cluster_correction.tokens_factor == 0.97
