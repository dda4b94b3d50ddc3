"""status.progress (step, percent, time left) and the cluster-calibration sample, from two readings."""

from __future__ import annotations

import datetime
from dataclasses import replace
from typing import Any

import pytest

from blackwell_operator.lifecycle.measure import Reading
from blackwell_operator.lifecycle.measured import WARMUP_STEPS, measured_changes, sample_of
from blackwell_operator.lifecycle.ownership import Lineage
from blackwell_operator.lifecycle.progress import as_status, finished, progress_of, short_duration
from blackwell_operator.lifecycle.status_patch import status_patch
from blackwell_operator.lifecycle.writers import MEASURE_LOOP
from blackwell_operator.models.status import JobProgress
from blackwell_trainer.plan.config import ClusterCorrection, Plan, ProbeResult
from tests.support.manifests import btj
from tests.support.plans import probed_plan
from tests.support.pods import container, pod, pod_status
from tests.support.specs import make_spec

NOW = datetime.datetime(2026, 12, 1, 10, 0, 0, tzinfo=datetime.UTC)


def reading(at: float, step: int, *, planned: int = 1000, pod_steps: int = 50, reserved: int = 0) -> Reading:
    return Reading(at, 1e6 * step, 8, 0.4, step, planned, pod_steps, reserved)


@pytest.mark.parametrize(
    ("seconds", "text"), [(0, "0s"), (45.4, "45s"), (720, "12m"), (11_040, "3h04m"), (93_600, "1d2h")]
)
def test_time_left_reads_short(seconds: float, text: str) -> None:
    assert short_duration(seconds) == text


def test_progress_and_eta_from_the_measured_step_time() -> None:
    got = progress_of(reading(100.0, 100), reading(160.0, 120), NOW)
    assert got is not None
    # 20 steps in 60 s: 3 s a step, 880 steps left.
    assert as_status(got) == {
        "step": 120,
        "totalSteps": 1000,
        "percent": 12.0,
        "stepTimeSeconds": 3.0,
        "remainingSeconds": 2640,
        "remaining": "44m",
        "eta": "2026-12-01T10:44:00Z",
    }
    JobProgress.model_validate(as_status(got))  # the status model (and so the CRD) takes it as written


def test_without_a_moving_pair_only_the_step_is_told() -> None:
    first = {"step": 120, "totalSteps": 1000, "percent": 12.0}

    def told(earlier: Reading | None, later: Reading) -> dict[str, object] | None:
        got = progress_of(earlier, later, NOW)
        return None if got is None else as_status(got)

    assert told(None, reading(160.0, 120)) == first
    assert told(reading(100.0, 120), reading(160.0, 120)) == first  # stalled: no ETA
    assert told(reading(100.0, 130), reading(160.0, 120)) == first  # a restart went back


def test_an_absurd_planned_step_count_gives_no_time_left_rather_than_an_error() -> None:
    # A pod's /metrics said 10**15 planned steps: the ETA lay past the year 9999, and computing it raised,
    # so the job got no status.measured and a warning every round.
    got = progress_of(reading(100.0, 100, planned=10**15), reading(160.0, 120, planned=10**15), NOW)
    assert got is not None
    assert as_status(got) == {"step": 120, "totalSteps": 10**15, "percent": 0.0, "stepTimeSeconds": 3.0}


def test_no_progress_from_a_trainer_without_the_step_gauge() -> None:
    old = Reading(160.0, 1e6, 8, 0.4)
    assert progress_of(None, old, NOW) is None


def test_the_last_step_is_complete_not_past_it() -> None:
    done = progress_of(reading(100.0, 990, planned=1000), reading(160.0, 1000, planned=1000), NOW)
    assert done is not None and done.percent == 100.0 and done.remaining == "0s"


def test_a_finished_job_shows_every_step_done() -> None:
    done = as_status(finished(1000))
    assert JobProgress.model_validate(done).percent == 100.0 and done["remaining"] == "0s"


def _running_btj(plan: dict[str, Any] | None = None) -> dict[str, Any]:
    body = btj("w")
    body["metadata"]["uid"] = "uid-w"
    body["status"] = {"phase": "Running", **({"plan": plan} if plan else {})}
    return body


# The verified owner chain of a worker of _running_btj (lifecycle/ownership.py).
OURS = Lineage("PyTorchJob", "w", "u-job", "w", "uid-w")


def test_progress_is_written_beside_measured_only_when_it_changes() -> None:
    worker = pod("w-worker-0")
    worker["status"] = pod_status(container(), podIP="127.0.0.1")
    progress = {"step": 120, "totalSteps": 1000, "percent": 12.0}
    now = "2026-12-01T10:00:00Z"
    # Keys the reading lacks are removed (null in the merge patch): no time left from an earlier reading.
    nulls = {"stepTimeSeconds": None, "remainingSeconds": None, "remaining": None, "eta": None}
    earlier = _running_btj()
    earlier["status"]["progress"] = {
        "step": 100,
        "totalSteps": 1000,
        "percent": 10.0,
        "stepTimeSeconds": 2.0,
        "remainingSeconds": 1800,
        "remaining": "30m",
        "eta": "2026-12-01T10:30:00Z",
    }
    reading_progress = JobProgress.model_validate(progress)
    change = measured_changes(earlier, worker, None, None, now, reading_progress, found=OURS)
    assert change is not None
    assert status_patch(change, earlier["status"], MEASURE_LOOP) == {"progress": {**progress, **nulls}}
    first = measured_changes(_running_btj(), worker, None, None, now, reading_progress, found=OURS)
    assert first is not None and status_patch(first, {}, MEASURE_LOOP) == {"progress": progress}
    same = _running_btj()
    same["status"]["progress"] = progress
    assert measured_changes(same, worker, None, None, now, reading_progress, found=OURS) is None


def _plan(correction: ClusterCorrection | None = None) -> dict[str, Any]:
    from blackwell_operator.planner import plan_job

    plan = plan_job(make_spec(nodes=2, seq=8192, precision="bf16", activationCheckpointing="selective"))
    if correction is not None:
        plan.cluster_correction = correction
        plan.predicted.tokens_per_second_per_gpu *= correction.tokens_factor
    return dict(plan.model_dump(mode="json", by_alias=True))


def test_a_sample_is_measured_over_the_model_s_own_figure() -> None:
    plan = _plan()
    modelled = plan["predicted"]["tokensPerSecondPerGpu"]
    peak = plan["predicted"]["memory"]["peakReserved"]
    later = reading(160.0, 120, reserved=int(peak * 1.1))
    got = sample_of(_running_btj(plan), reading(100.0, 100), later, 0.6 * modelled, "t")
    assert got is not None and got.tokens_ratio == pytest.approx(0.6, abs=1e-4)
    assert got.memory_ratio == pytest.approx(1.1, abs=1e-4)
    assert (got.job, got.uid, got.precision_recipe.value) == ("hyperpod-ns-team-a/w", "uid-w", "none")


def test_a_corrected_plan_teaches_against_the_uncorrected_model() -> None:
    correction = ClusterCorrection(
        instance_type="ml.p6-b200.48xlarge",
        precision_recipe="none",
        activation_checkpointing="selective",
        runs=3,
        tokens_factor=0.6,
        memory_factor=1.0,
    )
    plan = _plan(correction)
    corrected = plan["predicted"]["tokensPerSecondPerGpu"]
    # Running exactly as the corrected plan said is 0.6 of the model: the correction holds, not drifts to 1.
    got = sample_of(_running_btj(plan), reading(100.0, 100), reading(160.0, 120), corrected, "t")
    assert got is not None and got.tokens_ratio == pytest.approx(0.6, abs=1e-3)
    assert got.memory_ratio is None  # no memory reading (CPU, or 0 reserved)


def test_warm_up_and_jobs_not_running_teach_nothing() -> None:
    plan = _plan()
    rate = plan["predicted"]["tokensPerSecondPerGpu"]
    warming = reading(100.0, 1, pod_steps=WARMUP_STEPS - 1)
    assert sample_of(_running_btj(plan), warming, reading(160.0, 20), rate, "t") is None
    restarting = _running_btj(plan)
    restarting["status"]["phase"] = "Restarting"
    assert sample_of(restarting, reading(100.0, 100), reading(160.0, 120), rate, "t") is None
    assert sample_of(_running_btj(None), reading(100.0, 100), reading(160.0, 120), rate, "t") is None


def test_a_probed_job_teaches_as_its_winner_once_the_operator_knows_it() -> None:
    plan = probed_plan()
    assert plan.probe is not None
    won = plan.probe.candidates[1]
    rate = won.prediction.tokens_per_second_per_gpu
    body = dict(plan.model_dump(mode="json", by_alias=True))
    # The trainer trains with the probe's winner; until its result is known, the reading teaches nothing.
    assert sample_of(_running_btj(body), reading(100.0, 100), reading(160.0, 120), rate, "t") is None
    probe = plan.probe.model_copy(update={"result": ProbeResult(winner=1, chosen=won.candidate, seconds=1)})
    known = Plan.model_validate(body).model_copy(update={"probe": probe})
    got = sample_of(
        _running_btj(dict(known.model_dump(mode="json", by_alias=True))),
        reading(100.0, 100),
        reading(160.0, 120),
        0.8 * rate,
        "t",
    )
    assert got is not None and got.tokens_ratio == pytest.approx(0.8, abs=1e-3)
    assert (got.precision_recipe, got.activation_checkpointing) == (
        won.candidate.precision_recipe,
        won.candidate.activation_checkpointing,
    )


def _from_pod(
    at: float, step: int, winner: int | None, tokens: float, peak: int, reserved: int = 0
) -> Reading:
    """A probed pod's reading: the winner it exports and the prediction beside it."""
    return replace(
        reading(at, step, reserved=reserved),
        probe_winner=winner,
        predicted_tokens_per_second=tokens,
        predicted_peak_reserved=peak,
    )


def test_a_probed_job_teaches_as_the_winner_its_pod_exports_while_its_first_run_goes_on() -> None:
    plan = probed_plan()
    assert plan.probe is not None
    won = plan.probe.options[1]
    rate, peak = won.prediction.tokens_per_second_per_gpu, won.prediction.memory.peak_reserved
    body = _running_btj(dict(plan.model_dump(mode="json", by_alias=True)))
    earlier, later = (
        _from_pod(100.0, 100, 1, rate, peak),
        _from_pod(160.0, 120, 1, rate, peak, int(1.1 * peak)),
    )
    # No termination message yet, so no result in the plan: the pod's own word, checked against the plan.
    got = sample_of(body, earlier, later, 0.8 * rate, "t")
    assert got is not None and got.uid == "uid-w"
    assert got.tokens_ratio == pytest.approx(0.8, abs=1e-3)  # no cluster correction: factor 1
    assert got.memory_ratio == pytest.approx(1.1, abs=1e-3)
    assert (got.precision_recipe, got.activation_checkpointing) == (
        won.candidate.precision_recipe,
        won.candidate.activation_checkpointing,
    )
    # The planner's pick won: the same, as the pick.
    pick = plan.probe.options[0].prediction
    tokens, pick_peak = pick.tokens_per_second_per_gpu, pick.memory.peak_reserved
    kept = sample_of(
        body,
        _from_pod(100.0, 100, 0, tokens, pick_peak),
        _from_pod(160.0, 120, 0, tokens, pick_peak),
        tokens,
        "t",
    )
    assert kept is not None and kept.activation_checkpointing == plan.chosen.activation_checkpointing


@pytest.mark.parametrize(
    "why",
    ["no probe yet", "another plan's prediction", "another peak", "no such option", "the winner changed"],
)
def test_a_pod_s_word_that_does_not_match_the_plan_teaches_nothing(why: str) -> None:
    plan = probed_plan()
    assert plan.probe is not None
    won = plan.probe.options[1]
    rate, peak = won.prediction.tokens_per_second_per_gpu, won.prediction.memory.peak_reserved
    earlier_winner, winner = 1, 1
    if why == "no probe yet":
        earlier_winner = winner = None  # type: ignore[assignment]  # the gauge's -1
    elif why == "another plan's prediction":
        rate *= 1.01  # a re-planned job's old pod: its candidate 1 is not this plan's
    elif why == "another peak":
        peak += 1
    elif why == "no such option":
        earlier_winner = winner = len(plan.probe.options)
    else:
        earlier_winner = 0
    body = _running_btj(dict(plan.model_dump(mode="json", by_alias=True)))
    earlier = _from_pod(100.0, 100, earlier_winner, rate, peak)
    later = _from_pod(160.0, 120, winner, rate, peak)
    assert sample_of(body, earlier, later, rate, "t") is None


def _probed_running(plan: Plan) -> dict[str, Any]:
    """A Running BTJ whose status shows `plan` and its columns (the pick, as reconcile wrote them)."""
    body = _running_btj(dict(plan.model_dump(mode="json", by_alias=True)))
    body["status"].update(
        precision=plan.chosen.precision.value,
        microBatchSize=plan.chosen.micro_batch_size,
        activationCheckpointing=plan.chosen.activation_checkpointing.value,
    )
    return body


def test_while_a_probed_job_s_result_is_unknown_its_columns_follow_the_winner_its_pod_exports() -> None:
    plan = probed_plan()
    assert plan.probe is not None
    won = plan.probe.options[1]
    assert won.candidate.activation_checkpointing != plan.chosen.activation_checkpointing
    rate, peak = won.prediction.tokens_per_second_per_gpu, won.prediction.memory.peak_reserved
    body, worker = _probed_running(plan), pod("w-worker-0")
    said = _from_pod(1.0, 9, 1, rate, peak)
    change = measured_changes(body, worker, None, None, "t", found=OURS, reading=said)
    assert change is not None
    patch = status_patch(change, body["status"], MEASURE_LOOP)
    assert patch["activationCheckpointing"] == won.candidate.activation_checkpointing.value
    assert patch.get("microBatchSize", plan.chosen.micro_batch_size) == won.candidate.micro_batch_size
    # Another plan's pod, or a pod still probing: nothing to say.
    for wrong in (_from_pod(1.0, 9, 1, 1.01 * rate, peak), _from_pod(1.0, 9, None, rate, peak)):
        assert measured_changes(body, worker, None, None, "t", found=OURS, reading=wrong) is None
    # Once the plan records a result, the pod watcher wrote the columns with it: the measure loop leaves them.
    result = ProbeResult(winner=0, chosen=plan.chosen, seconds=1.0)
    recorded = _probed_running(
        plan.model_copy(update={"probe": plan.probe.model_copy(update={"result": result})})
    )
    assert measured_changes(recorded, worker, None, None, "t", found=OURS, reading=said) is None


def test_the_predicted_columns_follow_the_winner_its_pod_exports() -> None:
    plan = probed_plan()
    assert plan.probe is not None
    won = plan.probe.options[1]
    rate, peak = won.prediction.tokens_per_second_per_gpu, won.prediction.memory.peak_reserved
    body = _probed_running(plan)
    change = measured_changes(
        body, pod("w-worker-0"), None, None, "t", found=OURS, reading=_from_pod(1.0, 9, 1, rate, peak)
    )
    assert change is not None
    assert change.predicted_tokens_per_second_per_gpu == round(rate, 1)
    assert change.predicted_model_flops_utilization == round(won.prediction.model_flops_utilization, 4)
