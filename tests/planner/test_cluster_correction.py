"""The cluster calibration: minimum runs, median, bounds, one sample per job, and what plans do with it."""

from __future__ import annotations

import pytest

from blackwell_operator.calibration.cluster import (
    KEEP_PER_FAMILY,
    MAX_PER_NAMESPACE,
    MAX_SAMPLES,
    MIN_RUNS,
    MIN_TOKENS_RATIO,
    POOL_PER_NAMESPACE,
    TOKENS_BOUNDS,
    ClusterCalibration,
    ImplausibleSample,
    Sample,
    frozen,
    implausible,
)
from blackwell_operator.calibration.learned_memory import MEMORY_BOUNDS
from blackwell_operator.planner import plan_job
from blackwell_trainer.plan.config import ActivationCheckpointing, PrecisionRecipe
from tests.support.specs import make_spec

B200 = "ml.p6-b200.48xlarge"


def sample(
    uid: str,
    tokens: float,
    memory: float | None = None,
    recipe: PrecisionRecipe = PrecisionRecipe.NONE,
    ac: ActivationCheckpointing = ActivationCheckpointing.SELECTIVE,
    instance: str = B200,
    namespace: str = "team-a",
) -> Sample:
    return Sample.model_construct(  # unvalidated: the store must refuse what the model would let through
        job=f"{namespace}/{uid}",
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
    assert correction is not None and correction.memory_factor == 1.0 and correction.memory_readings == 0


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


def test_frozen_gives_only_its_own_family_without_a_learned_memory_factor() -> None:
    correction = calibration(*(sample(f"j{i}", 0.6) for i in range(MIN_RUNS))).correction(*KEY)
    lookup = frozen(correction)
    assert lookup(PrecisionRecipe.NONE, ActivationCheckpointing.SELECTIVE) == correction
    assert lookup(PrecisionRecipe.NONE, ActivationCheckpointing.FULL) is None
    assert frozen(None)(PrecisionRecipe.NONE, ActivationCheckpointing.SELECTIVE) is None


# ----- tenants: validated samples, per-namespace scope, per-source caps -----------------------------------


@pytest.mark.parametrize(
    ("tokens", "memory"),
    [
        (float("nan"), 1.0),
        (float("inf"), 1.0),
        (0.0, 1.0),
        (MIN_TOKENS_RATIO / 2, 1.0),  # a stalled job: nothing the cluster's speed says
        (1e9, 1.0),
        (0.8, float("nan")),
        (0.8, 0.0),
        (0.8, 1e9),
    ],
    ids=["nan", "inf", "zero", "near-zero", "huge", "memory-nan", "memory-zero", "memory-huge"],
)
def test_a_sample_no_reading_can_give_is_never_stored(tokens: float, memory: float) -> None:
    good = calibration(*(sample(f"j{i}", 0.8) for i in range(MIN_RUNS)))
    bad = sample("bad", tokens, memory)
    assert implausible(bad) is not None
    with pytest.raises(ImplausibleSample, match="team-a/bad"):
        good.record(bad)
    # Stored raw by an older operator: it is not counted either.
    poisoned = ClusterCalibration.model_construct(
        samples=[*good.samples, bad, sample("bad2", tokens, memory)]
    )
    assert poisoned.correction(*KEY) == good.correction(*KEY)


def test_another_namespace_s_jobs_do_not_move_this_namespace_s_plans() -> None:
    mine = calibration(*(sample(f"a{i}", 0.9) for i in range(MIN_RUNS)))
    theirs = mine
    for i in range(KEEP_PER_FAMILY + 10):  # another team's many jobs, all reporting slow
        theirs = theirs.record(sample(f"b{i}", 0.5, namespace="team-b"))
    assert theirs.correction(*KEY, "team-a") == mine.correction(*KEY, "team-a")
    assert [s.uid for s in theirs.runs(KEY, "team-a")] == ["a0", "a1", "a2"], "none of team-a's pushed out"
    assert len(theirs.runs(KEY, "team-b")) == KEEP_PER_FAMILY, "team-b's own oldest went instead"
    correction = theirs.correction(*KEY, "team-b")
    assert correction is not None and correction.tokens_factor == 0.5
    assert (
        calibration(*(sample(f"b{i}", 0.5, namespace="team-b") for i in range(5))).correction(*KEY, "team-c")
        is None
    ), "a namespace with no runs of its own plans on the model"


def test_the_opt_in_pool_counts_each_namespace_with_a_few_votes() -> None:
    cal = calibration(
        *(sample(f"a{i}", 0.9) for i in range(MIN_RUNS)),
        *(sample(f"b{i}", 0.5, namespace="team-b") for i in range(KEEP_PER_FAMILY)),
    )
    pooled = cal.runs(KEY, "team-a", pooled=True)
    assert sum(s.namespace == "team-b" for s in pooled) == POOL_PER_NAMESPACE
    assert sum(s.namespace == "team-a" for s in pooled) == MIN_RUNS
    # Twenty slow jobs of team-b are three votes: the median stays within team-a's and team-b's spread.
    correction = cal.correction(*KEY, "team-a", pooled=True)
    assert correction is not None and correction.runs == MIN_RUNS + POOL_PER_NAMESPACE
    # Without the pool (the default) team-b counts for nothing in team-a.
    assert cal.correction(*KEY, "team-a") == calibration(*cal.runs(KEY, "team-a")).correction(*KEY, "team-a")


def test_one_namespace_cannot_fill_the_store_for_the_others() -> None:
    cal = calibration(sample("a0", 0.9))
    families = [(r, a) for r in PrecisionRecipe for a in ActivationCheckpointing]
    for i in range(MAX_PER_NAMESPACE + 30):
        recipe, ac = families[i % len(families)]
        cal = cal.record(sample(f"b{i}", 0.8, recipe=recipe, ac=ac, namespace="team-b"))
    assert sum(s.namespace == "team-b" for s in cal.samples) == MAX_PER_NAMESPACE
    assert [s.uid for s in cal.samples if s.namespace == "team-a"] == ["a0"]


def test_many_busy_namespaces_do_not_push_out_a_quiet_one_s_samples() -> None:
    # A quiet namespace measured first, then enough busy namespaces to fill the whole store past its cap:
    # dropping the oldest of all would take the quiet namespace's three, its only corrections.
    quiet = [sample(f"q{i}", 0.7, namespace="quiet") for i in range(MIN_RUNS)]
    cal = calibration(*quiet)
    families = [(r, a) for r in PrecisionRecipe for a in ActivationCheckpointing]
    busy = MAX_SAMPLES // MAX_PER_NAMESPACE + 5
    for n in range(busy):
        for i in range(MAX_PER_NAMESPACE):
            recipe, ac = families[i % len(families)]
            cal = cal.record(sample(f"b{n}-{i}", 0.9, recipe=recipe, ac=ac, namespace=f"busy-{n}"))
    assert len(cal.samples) == MAX_SAMPLES
    assert [s.uid for s in cal.samples if s.namespace == "quiet"] == ["q0", "q1", "q2"]
    assert cal.correction(*KEY, namespace="quiet") is not None
    # The busy ones share what is left evenly, each losing its own oldest first.
    held = {s.namespace: 0 for s in cal.samples if s.namespace != "quiet"}
    for s in cal.samples:
        if s.namespace != "quiet":
            held[s.namespace] += 1
    assert max(held.values()) - min(held.values()) <= 1
    assert all(f"b{n}-{MAX_PER_NAMESPACE - 1}" in {s.uid for s in cal.samples} for n in range(busy))


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
    # 840 sequences per rank: every micro-batch up to 8 divides it, so memory alone picks the size.
    spec.training.global_batch_tokens = 8192 * 16 * 840
    before = plan_job(spec)
    overshoot = calibration(*(sample(f"j{i}", 1.0, MEMORY_BOUNDS[1]) for i in range(MIN_RUNS)))
    after = plan_job(spec, cluster=overshoot.corrector(spec.cluster.instance_type))
    assert after.cluster_correction is not None and after.cluster_correction.memory_factor == MEMORY_BOUNDS[1]
    assert after.chosen.micro_batch_size < before.chosen.micro_batch_size
    assert any("peak memory x1.30" in line for line in after.explanation)
