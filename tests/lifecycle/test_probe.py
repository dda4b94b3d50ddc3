"""The operator's reading of a probe result (pure): from a pod's termination message to the Probed Event and
one calibration sample per measured candidate, and a later plan on the same cluster that skips the probe
because its candidates are now measured. The first result of a generation's candidates is kept; figures
no GPU can give are refused whole (the job trains the planner's pick); an all-OOM probe says so."""

from __future__ import annotations

import pytest

from blackwell_operator.calibration.cluster import MIN_RUNS, ClusterCalibration
from blackwell_operator.calibration.learned_memory import MemorySource
from blackwell_operator.lifecycle.memory_readings import probe_readings
from blackwell_operator.lifecycle.ownership import Lineage
from blackwell_operator.lifecycle.probe import (
    ProbePass,
    config_map_copy,
    joined,
    pick_result,
    probe_pass,
    probe_result_of,
    probe_samples,
    probed_event,
    result_of,
    with_probe_result,
)
from blackwell_operator.lifecycle.replan import candidate_line
from blackwell_operator.models.spec import BlackwellTrainingJobSpec
from blackwell_operator.models.status import BlackwellTrainingJobStatus, StatusChange
from blackwell_operator.planner import plan_job
from blackwell_trainer import probe as trainer_probe
from blackwell_trainer.plan.config import Plan, ProbeMeasurement, ProbeOutcome, ProbeResult
from tests.support.specs import make_spec

NOW = "2026-12-01T10:00:00Z"


def spec() -> BlackwellTrainingJobSpec:
    # BF16: its AC selective (the pick) and AC none are two runs within 5%. Under FP8 this trainer runs
    # selective as AC none (trainer.selective_recomputes_nothing): one family, nothing to probe.
    raw = make_spec(nodes=2, seq=4096, precision="bf16").model_dump(by_alias=True, mode="json")
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
    chosen = plan.probe.candidates[winner].candidate  # as the trainer names it
    return ProbeResult(winner=winner, chosen=chosen, measurements=measurements, seconds=140.0)


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


def test_a_dropped_candidate_is_named_and_teaches_no_sample_but_a_memory_floor() -> None:
    plan = plan_job(spec(), job_name="j")
    assert plan.probe is not None
    result = result_for(plan, winner=0, speed=[1.0] * len(plan.probe.candidates), oom=1)
    event = probed_event(plan, result)
    assert (
        event is not None and "the planner's pick won" in event[1] and "dropped: 1 out-of-memory" in event[1]
    )
    meta = {"namespace": "a", "name": "j", "uid": "u1"}
    samples, refused, taken = probe_samples(meta, plan, result, NOW)
    # The winner's family is keyed by the job's uid (the measure loop's reading later replaces it).
    assert [s.uid for s in samples] == [
        "u1" if i == 0 else f"u1/probe-{i}" for i in range(len(plan.probe.candidates)) if i != 1
    ]
    assert refused == []
    # What ran out of memory is a lower bound of its GPU type's memory factor (docs/cluster-calibration.md).
    readings, _ = probe_readings(meta, plan, result, taken, NOW)
    assert [(r.uid, r.source) for r in readings] == [("u1/oom-probe-1", MemorySource.OUT_OF_MEMORY)]


def test_every_candidate_s_measurement_is_a_sample_and_a_later_plan_skips_the_probe() -> None:
    first = plan_job(spec(), job_name="j0")
    assert first.probe is not None and first.probe.enabled
    count = len(first.probe.candidates)
    calibration = ClusterCalibration()
    for job in range(MIN_RUNS):  # three jobs on this cluster probed the same candidates
        result = result_for(first, winner=0, speed=[0.97] * count)
        samples, _, _ = probe_samples(
            {"namespace": "a", "name": f"j{job}", "uid": f"u{job}"}, first, result, NOW
        )
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


# ----- one pod's probe pass: status.probe, the plan's copy, what is refused ---------------------------------

LINEAGE = Lineage("PyTorchJob", "j", "u-job", "j", "u-btj")


def btj_with(plan: Plan, **status: object) -> dict[str, object]:
    meta = {"name": "j", "namespace": "a", "uid": "u-btj", "generation": 2}
    child = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "j", "uid": "u-job"}
    raw = {"plan": plan.model_dump(mode="json", by_alias=True), "child": child, "observedGeneration": 2}
    return {"metadata": meta, "status": {**raw, **status}}


def worker() -> dict[str, object]:
    return {"metadata": {"name": "j-worker-0", "namespace": "a", "uid": "p1"}}


def test_a_new_result_is_status_probe_the_plans_copy_samples_and_one_event() -> None:
    plan = plan_job(spec(), job_name="j")
    assert plan.probe is not None
    result = result_for(plan, winner=1, speed=[0.9, 1.0])
    decided = probe_pass(btj_with(plan), worker(), result, found=LINEAGE, now=NOW)
    assert decided.new and decided.problem is None and decided.event is not None
    assert decided.change is not None and decided.change.probe is not None
    probe = decided.change.probe
    assert (probe.winner, probe.child_uid, probe.generation) == (1, "u-job", 2)
    assert probe.chosen == plan.probe.candidates[1].candidate and probe.pick_behind is not None
    assert [c.configuration for c in probe.candidates] == [c.candidate for c in plan.probe.candidates]
    assert decided.plan is not None and decided.plan.probe is not None and decided.plan.probe.result == result
    # status.probe holds the trainer's result whole (with the winner's configuration named)
    assert result_of(probe) == result.model_copy(update={"chosen": plan.probe.candidates[1].candidate})
    assert len(decided.samples) == 2 and decided.refused == ()
    # Stored already (the pod's next event, an operator restart): nothing to write, nothing to post.
    stored = btj_with(plan, probe=probe.model_dump(mode="json", by_alias=True))
    again = probe_pass(stored, worker(), result, found=LINEAGE, now="2026-12-01T11:00:00Z")
    assert not again.new and again.event is None and again.samples == ()


def test_another_childs_pod_a_re_planned_job_and_unreal_figures_teach_nothing() -> None:
    plan = plan_job(spec(), job_name="j")
    assert plan.probe is not None
    result = result_for(plan, winner=1, speed=[0.9, 1.0])
    predecessor = Lineage("PyTorchJob", "j", "u-old-job", "j", "u-btj")
    assert not probe_pass(btj_with(plan), worker(), result, found=predecessor, now=NOW).new
    assert not probe_pass(btj_with(plan), worker(), result, found=None, now=NOW).new
    replanned = plan.model_copy(deep=True)
    assert replanned.probe is not None
    replanned.probe.candidates[1].candidate.micro_batch_size += 1
    decided = probe_pass(btj_with(replanned), worker(), result, found=LINEAGE, now=NOW)
    assert not decided.new and decided.problem is not None and "re-planned" in decided.problem


def _refused(plan: Plan, result: ProbeResult) -> ProbePass:
    """The pass of a result whose figures no GPU can give: refused whole, the planner's pick kept."""
    assert plan.probe is not None
    decided = probe_pass(btj_with(plan), worker(), result, found=LINEAGE, now=NOW)
    assert decided.new and decided.warning and decided.event is not None
    assert decided.event[0] == "ProbeRefused" and decided.samples == () and decided.refused == ()
    assert decided.change is not None and decided.change.probe is not None
    probe = decided.change.probe
    assert probe.winner == 0 and probe.chosen == plan.probe.candidates[0].candidate and probe.candidates == []
    assert probe.refused is not None and probe.summary == decided.event[1]
    assert "training the planner's pick, which is " in decided.event[1]
    assert decided.plan is not None and decided.plan.probe is not None
    assert decided.plan.probe.result == pick_result(plan, result.seconds)
    return decided


@pytest.mark.parametrize(
    ("field", "value", "why"),
    [
        ("tokens_per_second_per_gpu", float("inf"), "candidate 0's tokens/s is inf, not a number"),
        ("tokens_per_second_per_gpu", 1e30, "of the BF16 dense peak, above the"),
        ("tokens_per_second_per_gpu", 0.0, "is not a rate"),
        ("peak_reserved_bytes", 2**50, "is more than the GPU's"),
        ("seconds", float("inf"), "candidate 0's wall time is inf"),
    ],
)
def test_figures_beyond_the_gpu_are_refused_whole_and_the_job_trains_the_pick(
    field: str, value: float, why: str
) -> None:
    plan = plan_job(spec(), job_name="j")
    result = result_for(plan, winner=1, speed=[0.9, 1.0])
    result.measurements[0] = result.measurements[0].model_copy(update={field: value})
    decided = _refused(plan, result)
    assert decided.event is not None and why in decided.event[1]


def test_a_dropped_candidate_above_the_card_is_refused_too() -> None:
    plan = plan_job(spec(), job_name="j")
    assert plan.probe is not None
    result = result_for(plan, winner=0, speed=[1.0, 1.0], oom=1)
    result.measurements[1].peak_reserved_bytes = 2 * plan.gpu.memory_bytes
    decided = _refused(plan, result)
    assert decided.event is not None and "candidate 1: " in decided.event[1]


def test_the_first_result_of_a_generation_is_kept_and_a_later_different_one_is_not_taken() -> None:
    plan = plan_job(spec(), job_name="j")
    assert plan.probe is not None
    first = result_for(plan, winner=1, speed=[0.9, 1.0])
    decided = probe_pass(btj_with(plan), worker(), first, found=LINEAGE, now=NOW)
    assert decided.change is not None and decided.change.probe is not None
    stored = btj_with(plan, probe=decided.change.probe.model_dump(mode="json", by_alias=True))
    # Another worker of the same child reports a different result (its own winner): not taken, logged.
    other = result_for(plan, winner=0, speed=[1.1, 1.0])
    later = probe_pass(stored, worker(), other, found=LINEAGE, now=NOW)
    assert not later.new and later.event is None and later.samples == ()
    assert later.problem is not None and "first result" in later.problem
    # A replacement child's pod repeating the kept choice (the trainer read the plan's copy): quiet.
    replacement = Lineage("PyTorchJob", "j", "u-new-job", "j", "u-btj")
    stored["status"]["child"]["uid"] = "u-new-job"  # type: ignore[index]
    again = probe_pass(stored, worker(), first, found=replacement, now=NOW)
    assert not again.new and again.problem is None
    # ... and figures beyond the GPU after the first result change nothing either.
    wild = first.model_copy(deep=True)
    wild.measurements[1].tokens_per_second_per_gpu = 1e30
    assert not probe_pass(stored, worker(), wild, found=replacement, now=NOW).new
    # An out-of-memory re-plan made other candidates in this generation: they are probed anew.
    replanned = plan.model_copy(deep=True)
    assert replanned.probe is not None
    replanned.probe.candidates[1].candidate.micro_batch_size += 1
    status = stored["status"]
    assert isinstance(status, dict)
    anew = {**stored, "status": {**status, "plan": replanned.model_dump(mode="json", by_alias=True)}}
    fresh = result_for(replanned, winner=1, speed=[0.9, 1.0])
    assert probe_pass(anew, worker(), fresh, found=replacement, now=NOW).new


def test_an_all_out_of_memory_probe_says_so_and_trains_the_pick() -> None:
    plan = plan_job(spec(), job_name="j")
    assert plan.probe is not None
    result = result_for(plan, winner=0, speed=[1.0, 1.0])
    result.measurements = [
        m.model_copy(
            update={
                "outcome": ProbeOutcome.OUT_OF_MEMORY,
                "tokens_per_second_per_gpu": None,
                "peak_reserved_bytes": None,
            }
        )
        for m in result.measurements
    ]
    decided = probe_pass(btj_with(plan), worker(), result, found=LINEAGE, now=NOW)
    assert decided.new and decided.warning and decided.event is not None
    reason, message = decided.event
    pick = plan.probe.candidates[0]
    assert reason == "Probed" and "the planner's pick won" not in message
    assert (
        "every candidate ran out of memory; training the planner's pick, which is "
        f"{candidate_line(pick.candidate, pick.prediction.memory.peak_reserved)}" in message
    )
    assert decided.change is not None and decided.change.probe is not None
    assert decided.change.probe.summary == message and decided.samples == ()


def test_a_refused_result_is_the_copy_every_restart_trains_with() -> None:
    plan = plan_job(spec(), job_name="j")
    assert plan.probe is not None
    wild = result_for(plan, winner=1, speed=[0.9, 1.0])
    wild.measurements[1].tokens_per_second_per_gpu = 1e30
    decided = _refused(plan, wild)
    assert decided.change is not None and decided.change.probe is not None
    kept = with_probe_result(plan, BlackwellTrainingJobStatus(probe=decided.change.probe), 2)
    assert kept.probe is not None and kept.probe.result == pick_result(plan, wild.seconds)
    # The trainer restarted in place (its termination message names its own winner) trains the pick.
    assert trainer_probe.earlier_choice(kept, wild.to_line()) == kept.probe.result


def test_the_reconciler_keeps_this_generations_choice_only() -> None:
    plan = plan_job(spec(), job_name="j")
    assert plan.probe is not None
    result = result_for(plan, winner=1, speed=[0.9, 1.0])
    decided = probe_pass(btj_with(plan), worker(), result, found=LINEAGE, now=NOW)
    assert decided.change is not None and decided.change.probe is not None
    stored = BlackwellTrainingJobStatus(probe=decided.change.probe)
    kept = with_probe_result(plan, stored, 2)
    assert kept.probe is not None and kept.probe.result == result_of(decided.change.probe)
    assert with_probe_result(plan, stored, 3) is plan  # a new generation probes anew
    other = plan.model_copy(deep=True)
    assert other.probe is not None
    other.probe.candidates[1].candidate.micro_batch_size += 1
    assert with_probe_result(other, stored, 2) is other  # a re-plan made other candidates


def test_a_failure_and_a_probe_of_one_pod_are_one_status_change() -> None:
    plan = plan_job(spec(), job_name="j")
    decided = probe_pass(btj_with(plan), worker(), result_for(plan, 1, [0.9, 1.0]), found=LINEAGE, now=NOW)
    assert decided.change is not None
    failure = StatusChange(last_failure=None)
    both = joined(failure, decided.change)
    assert both is not None and both.probe == decided.change.probe and both.plan == decided.plan
    assert {"last_failure", "probe", "plan"} <= both.model_fields_set
    replan = StatusChange(plan=plan)  # an out-of-memory re-plan: its plan, not the probe's copy
    merged = joined(replan, decided.change)
    assert merged is not None and merged.plan == plan and merged.probe == decided.change.probe
    assert joined(None, decided.change) is decided.change and joined(failure, None) is failure


def test_the_plan_config_map_copy_is_the_reconcilers_render_and_only_of_our_own() -> None:
    from blackwell_operator.render.children import plan_config_map

    plan = plan_job(spec(), job_name="j")
    btj = btj_with(plan)
    labels = {"team": "vision"}  # the BTJ's own, which the reconciler copies onto the ConfigMap
    btj["metadata"]["labels"] = labels  # type: ignore[index]
    decided = probe_pass(btj, worker(), result_for(plan, 1, [0.9, 1.0]), found=LINEAGE, now=NOW)
    assert decided.plan is not None
    existing = plan_config_map("j", "a", plan, parent_labels=labels, uid="u-btj")
    existing["metadata"].update(resourceVersion="7", ownerReferences=[{"uid": "u-btj"}])
    patch, problem = config_map_copy(existing, btj, decided.plan)
    assert problem is None and patch is not None and patch["metadata"]["resourceVersion"] == "7"
    wanted = plan_config_map("j", "a", decided.plan, parent_labels=labels, uid="u-btj")
    assert (
        patch["data"] == wanted["data"]
        and patch["metadata"]["annotations"] == wanted["metadata"]["annotations"]
        and patch["metadata"]["labels"] == wanted["metadata"]["labels"]
    )
    held = {**wanted, "metadata": {**wanted["metadata"], "ownerReferences": [{"uid": "u-btj"}]}}
    assert config_map_copy(held, btj, decided.plan) == (None, None)  # holds it already
    theirs = {**existing, "metadata": {**existing["metadata"], "ownerReferences": [{"uid": "someone"}]}}
    patch, problem = config_map_copy(theirs, btj, decided.plan)
    assert patch is None and problem is not None and "not this BlackwellTrainingJob's" in problem
