"""The memory factor a GPU type learns on the cluster: how many readings, the largest of them, the bounds,
the out-of-memory floor, its scope (the GPU type over every family, one namespace), and what a plan does
with it: the larger micro-batch where the model over-predicts, never one that ran out of memory."""

from __future__ import annotations

import pytest

from blackwell_operator.calibration.cluster import (
    MIN_RUNS,
    ClusterCalibration,
    ImplausibleSample,
    Sample,
    describe_correction,
    frozen,
    speed_measured,
)
from blackwell_operator.calibration.learned_memory import (
    MEMORY_BOUNDS,
    MIN_READINGS,
    LearnedMemory,
    MemoryReading,
    MemorySource,
    floor_ratio,
    learned_memory,
)
from blackwell_operator.models.spec import BlackwellTrainingJobSpec
from blackwell_operator.planner import plan_job
from blackwell_operator.planner.cluster_figures import figures_of
from blackwell_trainer.plan.config import ActivationCheckpointing, Plan, PrecisionRecipe
from tests.support.specs import make_spec

B200 = "ml.p6-b200.48xlarge"
NOW = "2026-12-01T10:00:00Z"


# ----- the rule -----------------------------------------------------------------------------------------


def test_one_reading_alone_moves_nothing_and_two_give_the_largest() -> None:
    assert MIN_READINGS == 2
    assert learned_memory([0.8], []) is None
    assert learned_memory([0.93, 0.97], []) == LearnedMemory(factor=0.97, readings=2, floor=None)
    # A reading read too low never lowers the model while a truthful one stands beside it.
    assert learned_memory([0.2, 0.97, 0.95], []) == LearnedMemory(factor=0.97, readings=3, floor=None)


@pytest.mark.parametrize(
    ("ratios", "factor"), [([0.5, 0.6], MEMORY_BOUNDS[0]), ([1.2, 2.5], MEMORY_BOUNDS[1]), ([1.0, 1.1], 1.1)]
)
def test_the_factor_is_clamped_to_its_bounds(ratios: list[float], factor: float) -> None:
    learned = learned_memory(ratios, [])
    assert learned is not None and learned.factor == factor


def test_an_out_of_memory_floor_is_a_lower_bound_the_readings_never_go_under() -> None:
    # Two readings say 0.92; a configuration modelled at 100 GiB ran out on a 96 GiB card: the factor must
    # put it above 96, whatever the readings say.
    floor = floor_ratio(96.0, 100.0)
    assert floor is not None and 0.96 < floor <= 0.9601 and floor * 100.0 > 96.0
    learned = learned_memory([0.92, 0.92], [floor])
    assert learned == LearnedMemory(factor=floor, readings=2, floor=floor)
    # Readings above the floor stand; a floor alone applies too (over the model's own 1.0 only).
    assert learned_memory([1.05, 1.0], [floor]) == LearnedMemory(factor=1.05, readings=2, floor=floor)
    assert learned_memory([], [floor]) == LearnedMemory(factor=1.0, readings=0, floor=floor)
    assert learned_memory([0.9], [1.1]) == LearnedMemory(factor=1.1, readings=0, floor=1.1)


def test_a_floor_stops_at_the_top_bound() -> None:
    # A configuration far below the card that ran out (memory taken outside the job) says nothing of the
    # model: the job's own re-plan deals with it, later plans are raised at most to the bound.
    learned = learned_memory([], [floor_ratio(96.0, 40.0) or 0.0])
    assert learned is not None and learned.factor == MEMORY_BOUNDS[1]


# ----- the store: per GPU type over every family, per namespace ---------------------------------------------


def sample(
    uid: str, memory: float | None, *, namespace: str = "team-a", instance: str = B200, **kw: object
) -> Sample:
    return Sample(
        job=f"{namespace}/{uid}",
        uid=uid,
        instance_type=instance,
        precision_recipe=kw.get("recipe", PrecisionRecipe.NONE),  # type: ignore[arg-type]
        activation_checkpointing=kw.get("ac", ActivationCheckpointing.SELECTIVE),  # type: ignore[arg-type]
        tokens_ratio=1.0,
        memory_ratio=memory,
        observed_at=NOW,
    )


def reading(uid: str, ratio: float, *, namespace: str = "team-a", oom: bool = False) -> MemoryReading:
    return MemoryReading(
        job=f"{namespace}/{uid.partition('/')[0]}",
        uid=uid,
        instance_type=B200,
        source=MemorySource.OUT_OF_MEMORY if oom else MemorySource.PROBE,
        ratio=ratio,
        observed_at=NOW,
    )


def test_every_family_s_readings_count_for_the_gpu_type_and_stay_in_their_namespace() -> None:
    cal = (
        ClusterCalibration()
        .record(sample("a", 0.88, ac=ActivationCheckpointing.NONE))
        .record_memory(reading("a/peak-2", 0.91))
    )
    full = (B200, PrecisionRecipe.MXFP8_BLOCK, ActivationCheckpointing.FULL)
    correction = cal.correction(*full, "team-a")
    assert correction is not None and (correction.memory_factor, correction.memory_readings) == (0.91, 2)
    assert correction.runs == 0 and correction.tokens_factor == 1.0 and not speed_measured(correction)
    # Another namespace, another GPU type: nothing.
    assert cal.correction(*full, "team-b") is None
    assert cal.correction("ml.p5en.48xlarge", *full[1:], "team-a") is None
    # Another namespace's many low readings never move this namespace's factor; pooled, they count.
    theirs = cal
    for i in range(30):
        theirs = theirs.record_memory(reading(f"b{i}/peak-0", 0.5, namespace="team-b"))
    assert theirs.correction(*full, "team-a") == correction
    pooled = theirs.correction(*full, "team-a", pooled=True)
    assert pooled is not None and pooled.memory_readings == 32 and pooled.memory_factor == 0.91


def test_a_reading_is_one_per_key_and_an_implausible_one_is_never_stored() -> None:
    cal = (
        ClusterCalibration().record_memory(reading("a/peak-0", 0.9)).record_memory(reading("a/peak-0", 0.95))
    )
    assert [r.ratio for r in cal.memory] == [0.95]
    for bad in (0.01, 20.0, float("inf")):
        with pytest.raises(ImplausibleSample, match="team-a/a"):
            cal.record_memory(reading("a/peak-1", bad))
    # The samples' store keeps the memory readings it did not touch, and the other way round.
    both = cal.record(sample("j", 1.0))
    assert len(both.memory) == 1 and len(both.record_memory(reading("a/peak-1", 0.9)).samples) == 1


def test_a_frozen_correction_gives_the_other_families_its_memory_factor_only() -> None:
    cal = ClusterCalibration()
    for i in range(MIN_RUNS):
        cal = cal.record(sample(f"j{i}", 0.92).model_copy(update={"tokens_ratio": 0.7}))
    correction = cal.correction(B200, PrecisionRecipe.NONE, ActivationCheckpointing.SELECTIVE, "team-a")
    assert correction is not None and speed_measured(correction) and correction.memory_readings == MIN_RUNS
    other = frozen(correction)(PrecisionRecipe.NONE, ActivationCheckpointing.FULL)
    assert other is not None and (other.tokens_factor, other.memory_factor, other.runs) == (1.0, 0.92, 0)
    assert "tokens/s x0.70, peak memory x0.92 (learned from 3 measured peaks on this GPU type)" in (
        describe_correction(correction)
    )
    assert describe_correction(other).startswith(f"corrected on this cluster ({B200}): peak memory x0.92")


# ----- what a plan does with it -------------------------------------------------------------------------


def memory_bound_spec() -> BlackwellTrainingJobSpec:
    spec = make_spec(nodes=2, seq=8192, precision="bf16", activationCheckpointing="selective")
    # 840 sequences per rank: every micro-batch up to 8 divides it, so memory alone picks the size.
    spec.training.global_batch_tokens = 8192 * 16 * 840
    return spec


def probed(plan: Plan, ratio: float) -> ClusterCalibration:
    """What a probe of `plan`'s pick and one other configuration teaches: two peaks at `ratio`."""
    peak = figures_of(plan).modelled_peak_reserved
    assert peak > 0
    cal = ClusterCalibration()
    for i in range(MIN_READINGS):
        cal = cal.record_memory(reading(f"first/peak-{i}", ratio))
    return cal


def test_a_gpu_that_reserves_less_than_modelled_plans_the_larger_micro_batch_and_says_so() -> None:
    spec = memory_bound_spec()
    before = plan_job(spec)
    after = plan_job(spec, cluster=probed(before, 0.85).corrector(spec.cluster.instance_type, "team-a"))
    assert after.chosen.micro_batch_size == before.chosen.micro_batch_size + 1
    assert after.cluster_correction is not None and after.cluster_correction.memory_factor == MEMORY_BOUNDS[0]
    line = next(e for e in after.explanation if "on this cluster" in e)
    assert "peak memory x0.90 (learned from 2 measured peaks on this GPU type)" in line
    # The plan stores the model's peak; the corrected one fits the budget.
    assert after.predicted.memory.peak_reserved * 0.9 <= after.gpu.memory_bytes * 0.95
    # Another namespace plans on the model.
    elsewhere = plan_job(spec, cluster=probed(before, 0.85).corrector(spec.cluster.instance_type, "team-b"))
    assert elsewhere.chosen == before.chosen and elsewhere.cluster_correction is None


def test_a_configuration_that_ran_out_of_memory_is_never_planned_again_from_the_readings() -> None:
    spec = memory_bound_spec()
    before = plan_job(spec)
    grown = plan_job(spec, cluster=probed(before, 0.85).corrector(spec.cluster.instance_type, "team-a"))
    # The larger micro-batch ran out of memory (a probe's grown candidate, or a training run): its floor.
    floor = floor_ratio(grown.gpu.memory_bytes, figures_of(grown).modelled_peak_reserved)
    assert floor is not None
    cal = probed(before, 0.85).record_memory(reading("first/oom-probe-2", floor, oom=True))
    after = plan_job(spec, cluster=cal.corrector(spec.cluster.instance_type, "team-a"))
    assert after.chosen.micro_batch_size == before.chosen.micro_batch_size
    assert after.cluster_correction is not None and after.cluster_correction.memory_floor == floor
    assert after.cluster_correction.memory_factor == floor
    assert "where a configuration ran out of memory" in describe_correction(after.cluster_correction)
