"""The 8B FP8 B200 prediction against Megatron-Bridge's published figure (issue 39; docs/planner.md).

Megatron-Bridge publishes 30,624 tokens/s per GPU for Llama 3 8B FP8 (current scaling) on eight B200 at
sequence 8192, micro-batch 2, DDP (performance summary, release 25.11; docs/reference/tuning-anchors.md
section 3.4). The planner's figure is modelled (no B200 ran this trainer); docs/planner.md says why it is
above the anchor: the micro-batch it chooses, which the anchor did not run. These tests hold that account.
"""

from __future__ import annotations

from typing import Any

from blackwell_operator.models.spec import BlackwellTrainingJobSpec
from blackwell_operator.planner import plan_job

MEGATRON_BRIDGE_8B_FP8_B200 = 30_624


def _plan(**tuning: Any) -> Any:
    spec = BlackwellTrainingJobSpec.model_validate(
        {
            "model": {"preset": "llama3.1-8b"},
            "cluster": {"instanceType": "ml.p6-b200.48xlarge", "nodes": 1},
            "training": {"sequenceLength": 8192, "steps": 1000},
            "tuning": {"precision": "fp8", **tuning},
        }
    )
    return plan_job(spec)


def test_at_the_anchors_micro_batch_the_model_is_below_the_published_figure() -> None:
    plan = _plan(microBatchSize=2)
    assert plan.chosen.micro_batch_size == 2
    predicted = plan.predicted.tokens_per_second_per_gpu
    assert 0.85 * MEGATRON_BRIDGE_8B_FP8_B200 < predicted < MEGATRON_BRIDGE_8B_FP8_B200


def test_the_chosen_plan_is_above_it_by_its_larger_micro_batch_only() -> None:
    plan = _plan()
    assert plan.chosen.micro_batch_size > 2 and plan.prediction_basis == "modelled"
    predicted = plan.predicted.tokens_per_second_per_gpu
    assert MEGATRON_BRIDGE_8B_FP8_B200 < predicted < 1.1 * MEGATRON_BRIDGE_8B_FP8_B200
    # The same plan at micro-batch 2 is below it: the excess is the micro-batch's gain.
    at_two = _plan(microBatchSize=2, activationCheckpointing=plan.chosen.activation_checkpointing.value)
    assert at_two.predicted.tokens_per_second_per_gpu < MEGATRON_BRIDGE_8B_FP8_B200
