"""planner/cluster_figures.py: the one place a cluster correction is applied and read back out."""

from __future__ import annotations

import pytest

from blackwell_operator.planner import plan_job
from blackwell_operator.planner.cluster_figures import (
    Factors,
    corrected_peak,
    corrected_time,
    factors_of,
    figures_of,
)
from blackwell_operator.planner.throughput import TimeEstimate
from blackwell_trainer.plan.config import ActivationCheckpointing, ClusterCorrection, PrecisionRecipe
from tests.support.specs import make_spec

B200 = "ml.p6-b200.48xlarge"


def _every_family(tokens: float, memory: float) -> ClusterCorrection:
    return ClusterCorrection(
        instance_type=B200,
        precision_recipe=PrecisionRecipe.NONE,
        activation_checkpointing=ActivationCheckpointing.SELECTIVE,
        runs=3,
        tokens_factor=tokens,
        memory_factor=memory,
    )


def test_a_factor_of_one_changes_nothing() -> None:
    time = TimeEstimate(2.0, 1000.0, 0.4, {"gemm": 1.5})
    assert corrected_time(time, Factors()) is time
    assert corrected_peak(7.0, factors_of(None)) == 7.0


def test_the_tokens_factor_scales_throughput_up_and_times_down() -> None:
    time = TimeEstimate(2.0, 1000.0, 0.4, {"gemm": 1.5, "comm": 0.5})
    fast = corrected_time(time, Factors(tokens=1.25))
    assert fast.tokens_per_second_per_gpu == pytest.approx(1250.0)
    assert fast.model_flops_utilization == pytest.approx(0.5)
    assert fast.step_time_seconds == pytest.approx(1.6)
    assert fast.breakdown == pytest.approx({"gemm": 1.2, "comm": 0.4})
    assert corrected_peak(100.0, Factors(memory=1.1)) == pytest.approx(110.0)


def test_a_corrected_plan_gives_back_the_model_s_own_figures() -> None:
    spec = make_spec(nodes=2, seq=8192, precision="bf16", activationCheckpointing="selective")
    plain = plan_job(spec)
    correction = _every_family(0.8, 1.05)
    corrected = plan_job(
        spec,
        cluster=lambda recipe, ac: correction.model_copy(
            update={"precision_recipe": recipe, "activation_checkpointing": ac}
        ),
    )
    assert corrected.chosen == plain.chosen  # the same factor for every family keeps the ranking
    figures, model = figures_of(corrected), figures_of(plain)
    # The plan stores the corrected throughput and the modelled peak; both sides are read in one place.
    assert corrected.predicted.tokens_per_second_per_gpu == pytest.approx(
        0.8 * plain.predicted.tokens_per_second_per_gpu, abs=0.05 + 0.8 * 0.05
    )  # (both plans keep tokens/s to one decimal: each side may be 0.05 off, the plain one scaled by 0.8)
    assert figures.corrected_tokens_per_second_per_gpu == corrected.predicted.tokens_per_second_per_gpu
    assert figures.modelled_tokens_per_second_per_gpu == pytest.approx(
        model.modelled_tokens_per_second_per_gpu, abs=0.05 / 0.8 + 0.05
    )  # (read back from the rounded corrected figure over 0.8)
    assert figures.modelled_peak_reserved == model.modelled_peak_reserved
    assert figures.corrected_peak_reserved == pytest.approx(1.05 * model.modelled_peak_reserved)
    assert model.factors == Factors() and figures.factors == Factors(0.8, 1.05)
