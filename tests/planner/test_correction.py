"""The memory correction an out-of-memory run teaches: the rule, and plans made with it (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from blackwell_operator.calibration import load_calibration
from blackwell_operator.errors import PlanningError
from blackwell_operator.models.spec import BlackwellTrainingJobSpec
from blackwell_operator.models.status import MemoryCorrection
from blackwell_operator.planner import evaluate, plan_job
from blackwell_operator.planner.correction import (
    MARGIN,
    MIN_OVERSHOOT_FRACTION,
    corrected_calibration,
    family_key,
    learn,
    overshoot_bytes,
)
from blackwell_operator.units import GIB
from blackwell_trainer.plan.config import OomPhase, OomResult, Plan


def _spec(**tuning: Any) -> BlackwellTrainingJobSpec:
    return BlackwellTrainingJobSpec.model_validate(
        {
            "model": {"preset": "llama3.1-8b"},
            "cluster": {"instanceType": "ml.p6-b200.48xlarge", "nodes": 2},
            "training": {"sequenceLength": 8192},
            "tuning": tuning,
        }
    )


def _oom(plan: Plan, *, over: int, phase: OomPhase = OomPhase.BACKWARD, **extra: Any) -> OomResult:
    """What the trainer reports when `plan` needed `over` bytes more than it predicted."""
    fields: dict[str, Any] = {
        "phase": phase,
        "step": 1,
        "requested_bytes": GIB,
        "allocated_bytes": plan.predicted.memory.peak_reserved + over - GIB,
        "peak_allocated_bytes": plan.predicted.memory.peak_reserved + over - GIB,
        "peak_reserved_bytes": plan.predicted.memory.peak_reserved + over - GIB,
        "predicted_peak_reserved_bytes": plan.predicted.memory.peak_reserved,
        "candidate": plan.chosen,
        **extra,
    }
    return OomResult(**fields)


def _predicted_peak(spec: BlackwellTrainingJobSpec, plan: Plan, correction: MemoryCorrection) -> int:
    cal = corrected_calibration(load_calibration(), correction)
    return evaluate(spec, plan.chosen, calibration=cal).prediction.memory.peak_reserved


def test_an_oom_in_backward_scales_activations_until_the_failed_plan_is_predicted_over_its_need() -> None:
    spec = _spec()
    failed = plan_job(spec)
    result = _oom(failed, over=6 * GIB)
    assert result.needed_bytes == failed.predicted.memory.peak_reserved + 6 * GIB
    assert overshoot_bytes(result, failed) == 6 * GIB

    correction = learn(None, result, failed, generation=3)
    assert correction.generation == 3 and correction.replans == 1
    assert correction.activation_scale > 1.0 and correction.reserve_bytes == 0
    assert correction.excluded == [failed.chosen]
    # The failed configuration, predicted again: its need plus the margin, at least.
    assert _predicted_peak(spec, failed, correction) >= result.needed_bytes + MARGIN * 6 * GIB * 0.99

    replanned = plan_job(spec, correction=correction)
    assert replanned.chosen != failed.chosen
    limit = failed.chosen.micro_batch_size
    if family_key(replanned.chosen) == family_key(failed.chosen):
        assert replanned.chosen.micro_batch_size < limit
    assert replanned.predicted.memory.peak_reserved <= replanned.gpu.memory_bytes * (
        1 - spec.tuning.memory_headroom
    )
    assert (
        "memory corrected after 1 out-of-memory run on this job: activations x" in replanned.explanation[-1]
    )


def test_an_oom_in_the_optimizer_step_or_setup_adds_a_reserve() -> None:
    spec = _spec()
    failed = plan_job(spec)
    for phase in (OomPhase.OPTIMIZER, OomPhase.SETUP):
        correction = learn(None, _oom(failed, over=4 * GIB, phase=phase), failed, generation=1)
        assert correction.activation_scale == 1.0
        assert correction.reserve_bytes == round((1 + MARGIN) * 4 * GIB)
        assert _predicted_peak(spec, failed, correction) == failed.predicted.memory.peak_reserved + round(
            (1 + MARGIN) * 4 * GIB
        )


def test_an_oom_below_the_prediction_still_corrects_by_the_failed_request_or_a_floor() -> None:
    spec = _spec()
    failed = plan_job(spec)
    # The process held less than predicted (memory taken outside it): the request is what it lacked.
    small = _oom(failed, over=-10 * GIB, requested_bytes=8 * GIB)
    assert overshoot_bytes(small, failed) == 8 * GIB
    tiny = _oom(failed, over=-10 * GIB, requested_bytes=2**20)
    assert overshoot_bytes(tiny, failed) == round(MIN_OVERSHOOT_FRACTION * failed.gpu.memory_bytes)


def test_a_gpu_smaller_than_the_catalog_says_adds_the_difference() -> None:
    spec = _spec()
    failed = plan_job(spec)
    short = failed.gpu.memory_bytes - 3 * GIB
    correction = learn(None, _oom(failed, over=GIB, gpu_total_bytes=short), failed, generation=1)
    assert correction.reserve_bytes == 3 * GIB


def test_corrections_compound_within_a_generation_and_restart_on_a_new_one() -> None:
    spec = _spec()
    first_plan = plan_job(spec)
    first = learn(None, _oom(first_plan, over=6 * GIB), first_plan, generation=1)
    second_plan = plan_job(spec, correction=first)
    second = learn(first, _oom(second_plan, over=6 * GIB), second_plan, generation=1)
    assert second.replans == 2 and second.excluded == [first_plan.chosen, second_plan.chosen]
    assert second.activation_scale > first.activation_scale
    third_plan = plan_job(spec, correction=second)
    assert third_plan.chosen not in second.excluded
    for failed in second.excluded:  # nor a larger micro-batch of a family that ran out
        if family_key(third_plan.chosen) == family_key(failed):
            assert third_plan.chosen.micro_batch_size < failed.micro_batch_size
    # The same OOM on the next spec generation starts from nothing.
    fresh = learn(second, _oom(first_plan, over=6 * GIB), first_plan, generation=2)
    assert fresh.replans == 1 and fresh.excluded == [first_plan.chosen]
    assert fresh.activation_scale == first.activation_scale


def test_the_correction_read_back_from_status_gives_the_same_plan() -> None:
    spec = _spec()
    failed = plan_job(spec)
    correction = learn(None, _oom(failed, over=6 * GIB), failed, generation=1)
    wire = correction.model_dump(by_alias=True, exclude_none=True, mode="json")
    assert plan_job(spec, correction=MemoryCorrection.model_validate(wire)) == plan_job(
        spec, correction=correction
    )


def test_a_pinned_micro_batch_is_kept_in_another_configuration_or_refused() -> None:
    spec = _spec(microBatchSize=2)
    failed = plan_job(spec)
    correction = learn(None, _oom(failed, over=GIB), failed, generation=1)
    other = plan_job(spec, correction=correction)
    assert other.chosen.micro_batch_size == 2 and family_key(other.chosen) != family_key(failed.chosen)
    # Everything pinned: nothing else to choose, and the refusal names the pinned field.
    pinned = _spec(microBatchSize=2, precision="bf16", activationCheckpointing="none", sharding="hybrid")
    failed = plan_job(pinned)
    correction = learn(None, _oom(failed, over=GIB), failed, generation=1)
    with pytest.raises(PlanningError) as err:
        plan_job(pinned, correction=correction)
    assert err.value.message == (
        "spec.tuning.microBatchSize: micro-batch 2 ran out of GPU memory on this job in every configuration "
        "the other spec.tuning pins allow (status.planHistory). Fix: use auto or a smaller micro-batch"
    )
