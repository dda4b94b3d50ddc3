"""What a job teaches its GPU type's memory beyond its samples (pure): every probe candidate measured is one
reading (the winner's in its family's sample, the others as readings of their own), a candidate that ran
out of memory is a floor, and so is a training run that ran out, unless the job's own correction had
changed its plan."""

from __future__ import annotations

from typing import Any

from blackwell_operator.calibration.cluster import ClusterCalibration
from blackwell_operator.calibration.learned_memory import MemorySource, floor_ratio
from blackwell_operator.lifecycle.memory_readings import oom_reading
from blackwell_operator.lifecycle.probe import probe_pass
from blackwell_operator.models.spec import BlackwellTrainingJobSpec
from blackwell_operator.models.status import MemoryCorrection
from blackwell_operator.planner import plan_job
from blackwell_operator.planner.cluster_figures import candidate_figures, figures_of
from blackwell_operator.units import GIB
from blackwell_trainer.plan.config import (
    OomPhase,
    OomResult,
    Plan,
    ProbeMeasurement,
    ProbeOutcome,
    ProbeResult,
)
from tests.lifecycle.test_probe import LINEAGE, NOW, btj_with, spec, worker
from tests.support.specs import make_spec


def growing_result(plan: Plan, peak: float) -> ProbeResult:
    """The trainer's probe of `plan`: every candidate measured at `peak` x its modelled peak, then the pick's
    first larger size (a growth option) measured and winning, its next one out of memory."""
    assert plan.probe is not None and len(plan.probe.growth) >= 2
    n = len(plan.probe.candidates)
    options = plan.probe.options
    measurements = []
    for i in [*range(n), n, n + 1]:
        modelled = candidate_figures(options[i]).modelled_peak_reserved
        lost = i == n + 1
        measurements.append(
            ProbeMeasurement(
                index=i,
                outcome=ProbeOutcome.OUT_OF_MEMORY if lost else ProbeOutcome.MEASURED,
                grown_from=0 if i >= n else None,
                predicted_tokens_per_second_per_gpu=options[i].prediction.tokens_per_second_per_gpu,
                predicted_peak_reserved_bytes=modelled,
                tokens_per_second_per_gpu=None if lost else options[i].prediction.tokens_per_second_per_gpu,
                peak_reserved_bytes=None if lost else int(peak * modelled),
            )
        )
    return ProbeResult(winner=n, chosen=options[n].candidate, measurements=measurements, seconds=300.0)


def probing_plan() -> Plan:
    # BF16, whose AC none is a neighbour of its selective pick (FP8 runs selective as none: no neighbour).
    raw = make_spec(nodes=2, seq=8192, precision="bf16").model_dump(by_alias=True, mode="json")
    raw["training"].update(steps=20_000, globalBatchTokens=8192 * 16 * 840)
    raw["tuning"]["probe"] = {"policy": "always"}
    plan = plan_job(BlackwellTrainingJobSpec.model_validate(raw), job_name="j")
    assert plan.probe is not None and plan.probe.enabled
    return plan


def test_every_measured_candidate_is_one_reading_and_an_oom_candidate_a_floor() -> None:
    plan = probing_plan()
    assert plan.probe is not None
    n = len(plan.probe.candidates)
    result = growing_result(plan, 0.85)
    decided = probe_pass(btj_with(plan), worker(), result, found=LINEAGE, now=NOW)
    assert decided.new and decided.refused == ()
    # The winner (a grown size) is its family's sample, keyed by the job (the running job's reading later
    # replaces it); every other measured candidate is a sample of its family or a reading of its own.
    won = plan.probe.options[n].candidate
    own = next(s for s in decided.samples if s.uid == "u-btj")
    assert (own.precision_recipe, own.activation_checkpointing) == (
        won.precision_recipe,
        won.activation_checkpointing,
    )
    peaks = [r for r in decided.readings if r.source is MemorySource.PROBE]
    assert len(decided.samples) + len(peaks) == n + 1, "one reading per measured candidate"
    assert all(r.ratio == 0.85 and r.uid.startswith("u-btj/peak-") for r in peaks)
    (floor,) = [r for r in decided.readings if r.source is MemorySource.OUT_OF_MEMORY]
    lost = candidate_figures(plan.probe.options[n + 1]).modelled_peak_reserved
    assert floor.ratio == floor_ratio(plan.gpu.memory_bytes, lost) and floor.uid == f"u-btj/oom-probe-{n + 1}"
    # Stored, they are the GPU type's factor: the largest reading, raised to the floor.
    cal = ClusterCalibration()
    for s in decided.samples:
        cal = cal.record(s)
    for r in decided.readings:
        cal = cal.record_memory(r)
    learned = cal.learned_memory(plan.instance_type, "a")
    assert learned is not None and learned.readings == n + 1
    assert learned.factor == max(0.9, floor.ratio) and learned.floor == floor.ratio


def failed(btj: dict[str, Any], plan: Plan, *, over: int) -> OomResult:
    peak = figures_of(plan).modelled_peak_reserved
    return OomResult(
        phase=OomPhase.BACKWARD,
        step=1,
        requested_bytes=GIB,
        allocated_bytes=peak + over - GIB,
        peak_allocated_bytes=peak + over - GIB,
        peak_reserved_bytes=peak + over - GIB,
        predicted_peak_reserved_bytes=peak,
        candidate=plan.chosen,
    )


def test_a_training_run_out_of_memory_is_a_floor_once_and_only_on_the_model_s_own_plan() -> None:
    plan = plan_job(spec(), job_name="j")
    btj = btj_with(plan)
    modelled = figures_of(plan).modelled_peak_reserved
    # It needed less than the card: the card is the bound (its true peak was above what the GPU had).
    reading = oom_reading(btj, failed(btj, plan, over=GIB), NOW)
    assert reading is not None and reading.source is MemorySource.OUT_OF_MEMORY
    assert reading.ratio == floor_ratio(plan.gpu.memory_bytes, modelled) and reading.job == "a/j"
    assert reading.uid.startswith("u-btj/oom-")
    # It measured more than the card: what it needed is the bound.
    over = plan.gpu.memory_bytes - modelled + 8 * GIB
    high = oom_reading(btj, failed(btj, plan, over=over), NOW)
    assert high is not None and high.ratio > reading.ratio and high.uid == reading.uid
    # A plan the job's own out-of-memory correction changed is not the model's: no floor from it.
    corrected = MemoryCorrection(generation=2, activation_scale=1.2, reserve_bytes=0, excluded=[], replans=1)
    btj["status"]["memoryCorrection"] = corrected.model_dump(mode="json", by_alias=True)  # type: ignore[index]
    assert oom_reading(btj, failed(btj, plan, over=GIB), NOW) is None
