"""The cluster calibration: minimum runs, median, bounds, one sample per job, and what plans do with it."""

from __future__ import annotations

import pytest

from blackwell_operator.calibration.cluster import (
    KEEP_PER_FAMILY,
    MEMORY_BOUNDS,
    MIN_RUNS,
    TOKENS_BOUNDS,
    ClusterCalibration,
    Sample,
    frozen,
)
from blackwell_operator.planner import plan_job
from blackwell_trainer.config import ActivationCheckpointing, PrecisionRecipe
from tests.planner.conftest import make_spec

B200 = "ml.p6-b200.48xlarge"


def sample(
    uid: str,
    tokens: float,
    memory: float | None = 1.0,
    recipe: PrecisionRecipe = PrecisionRecipe.NONE,
    ac: ActivationCheckpointing = ActivationCheckpointing.SELECTIVE,
    instance: str = B200,
) -> Sample:
    return Sample(
        job=f"team-a/{uid}",
        uid=uid,
        instance_type=instance,
        precision_recipe=recipe,
        activation_checkpointing=ac,
        tokens_ratio=tokens,
        memory_ratio=memory,
        observed_at="2026-12-01T10:00:00Z",
    )


def calibration(*samples: Sample) -> ClusterCalibration:
    cal = ClusterCalibration()
    for s in samples:
        cal = cal.record(s)
    return cal


KEY = (B200, PrecisionRecipe.NONE, ActivationCheckpointing.SELECTIVE)


def test_fewer_than_the_minimum_runs_correct_nothing() -> None:
    cal = calibration(*(sample(f"j{i}", 0.6) for i in range(MIN_RUNS - 1)))
    assert cal.correction(*KEY) is None
    assert calibration(*(sample(f"j{i}", 0.6) for i in range(MIN_RUNS))).correction(*KEY) is not None


def test_one_job_counts_once_however_often_it_is_read() -> None:
    cal = calibration(*(sample("same", 0.6) for _ in range(5)), sample("other", 0.6))
    assert len(cal.samples) == 2 and cal.correction(*KEY) is None
    assert cal.record(sample("same", 0.7)).runs(KEY)[-1].tokens_ratio == 0.7


def test_the_median_ignores_one_odd_job() -> None:
    cal = calibration(sample("a", 0.7), sample("b", 0.72), sample("c", 0.05), sample("d", 0.71))
    correction = cal.correction(*KEY)
    assert correction is not None and correction.runs == 4
    assert correction.tokens_factor == pytest.approx(0.705)


@pytest.mark.parametrize(
    ("ratio", "memory", "tokens_factor", "memory_factor"),
    [
        (0.1, 0.5, TOKENS_BOUNDS[0], MEMORY_BOUNDS[0]),
        (3.0, 2.0, TOKENS_BOUNDS[1], MEMORY_BOUNDS[1]),
        (0.8, 1.1, 0.8, 1.1),
    ],
)
def test_factors_are_clamped_to_their_bounds(
    ratio: float, memory: float, tokens_factor: float, memory_factor: float
) -> None:
    correction = calibration(*(sample(f"j{i}", ratio, memory) for i in range(MIN_RUNS))).correction(*KEY)
    assert correction is not None
    assert (correction.tokens_factor, correction.memory_factor) == (tokens_factor, memory_factor)


def test_memory_needs_its_own_minimum_of_readings() -> None:
    cal = calibration(sample("a", 0.8, None), sample("b", 0.8, None), sample("c", 0.8, 1.2))
    correction = cal.correction(*KEY)
    assert correction is not None and correction.memory_factor == 1.0


def test_families_and_instance_types_are_kept_apart() -> None:
    cal = calibration(*(sample(f"j{i}", 0.6) for i in range(MIN_RUNS)))
    assert cal.correction(B200, PrecisionRecipe.NONE, ActivationCheckpointing.FULL) is None
    assert cal.correction("ml.p5en.48xlarge", PrecisionRecipe.NONE, ActivationCheckpointing.SELECTIVE) is None
    assert cal.correction(B200, PrecisionRecipe.MXFP8_BLOCK, ActivationCheckpointing.SELECTIVE) is None


def test_each_family_keeps_only_its_newest_samples() -> None:
    cal = calibration(
        *(sample(f"j{i}", 0.6) for i in range(KEEP_PER_FAMILY + 5)),
        sample("x", 1.0, ac=ActivationCheckpointing.FULL),
    )
    uids = [s.uid for s in cal.runs(KEY)]
    assert uids == [f"j{i}" for i in range(5, KEEP_PER_FAMILY + 5)]
    assert len(cal.samples) == KEEP_PER_FAMILY + 1


def test_frozen_gives_only_its_own_family() -> None:
    correction = calibration(*(sample(f"j{i}", 0.6) for i in range(MIN_RUNS))).correction(*KEY)
    lookup = frozen(correction)
    assert lookup(PrecisionRecipe.NONE, ActivationCheckpointing.SELECTIVE) == correction
    assert lookup(PrecisionRecipe.NONE, ActivationCheckpointing.FULL) is None
    assert frozen(None)(PrecisionRecipe.NONE, ActivationCheckpointing.SELECTIVE) is None


# ----- what a plan does with it ------------------------------------------------------------------------


def test_a_slow_family_loses_the_plan_to_the_next_one_and_says_why() -> None:
    spec = make_spec(nodes=2, seq=8192)
    before = plan_job(spec)
    key = (spec.cluster.instance_type, before.chosen.precision_recipe, before.chosen.activation_checkpointing)
    slow = calibration(*(sample(f"j{i}", 0.5, recipe=key[1], ac=key[2]) for i in range(MIN_RUNS)))
    after = plan_job(spec, cluster=slow.corrector(spec.cluster.instance_type))
    assert (after.chosen.precision_recipe, after.chosen.activation_checkpointing) != key[1:]
    assert after.cluster_correction is None  # the new family was not measured: the model as it is
    # The new pick was slower than the old one by the model, and beats the old one at half its speed.
    slowed = before.predicted.tokens_per_second_per_gpu * 0.5
    assert slowed < after.predicted.tokens_per_second_per_gpu < before.predicted.tokens_per_second_per_gpu


def test_a_measured_family_s_prediction_is_corrected_and_explained() -> None:
    spec = make_spec(nodes=2, seq=8192, precision="bf16", activationCheckpointing="selective")
    before = plan_job(spec)
    cal = calibration(*(sample(f"j{i}", r) for i, r in enumerate((0.9, 0.95, 0.92))))
    after = plan_job(spec, cluster=cal.corrector(spec.cluster.instance_type))
    assert after.cluster_correction is not None and after.cluster_correction.runs == 3
    assert after.cluster_correction.tokens_factor == 0.92
    assert after.chosen == before.chosen
    assert after.predicted.tokens_per_second_per_gpu == pytest.approx(
        before.predicted.tokens_per_second_per_gpu * 0.92, abs=0.1
    )
    assert after.predicted.step_time_seconds == pytest.approx(
        before.predicted.step_time_seconds / 0.92, rel=1e-4
    )
    assert any("corrected from 3 runs on this cluster" in line for line in after.explanation)
    # Another instance type learns nothing from these runs.
    elsewhere = plan_job(spec, cluster=cal.corrector("ml.p5en.48xlarge"))
    assert elsewhere.cluster_correction is None and elsewhere.predicted == before.predicted


def test_a_memory_overshoot_shrinks_the_micro_batch() -> None:
    spec = make_spec(nodes=2, seq=8192, precision="bf16", activationCheckpointing="selective")
    before = plan_job(spec)
    overshoot = calibration(*(sample(f"j{i}", 1.0, MEMORY_BOUNDS[1]) for i in range(MIN_RUNS)))
    after = plan_job(spec, cluster=overshoot.corrector(spec.cluster.instance_type))
    assert after.cluster_correction is not None and after.cluster_correction.memory_factor == MEMORY_BOUNDS[1]
    assert after.chosen.micro_batch_size < before.chosen.micro_batch_size
    assert any("peak memory x1.30" in line for line in after.explanation)
