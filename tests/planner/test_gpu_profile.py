"""Constants measured on one GPU model (gpus.<GPU>): used for that GPU only, before corrections."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from blackwell_operator.calibration import Calibration, load_calibration
from blackwell_operator.models.spec import BlackwellTrainingJobSpec
from blackwell_operator.models.status import MemoryCorrection
from blackwell_operator.planner import plan_job
from blackwell_trainer.plan.config import PrecisionRecipe

EFFICIENCY = "throughput.recipes.9.none.efficiency"


def _with_gpu(constants: dict[str, float], sources: dict[str, str] | None = None) -> Calibration:
    data = load_calibration().model_dump(mode="json")
    data["gpus"] = {
        "H100": {
            "description": "test",
            "constants": constants,
            "sources": {k: "test" for k in constants} if sources is None else sources,
        }
    }
    return Calibration.model_validate(data)


def _spec(instance: str, **tuning: Any) -> BlackwellTrainingJobSpec:
    return BlackwellTrainingJobSpec.model_validate(
        {
            "model": {"preset": "llama3.2-1b"},
            "cluster": {"instanceType": instance, "nodes": 1, "gpusPerNode": 1},
            "training": {"sequenceLength": 4096, "globalBatchTokens": 4096 * 32},
            "tuning": {"precision": "bf16", **tuning},
        }
    )


def test_the_gpus_constants_replace_the_shared_ones_with_their_source() -> None:
    cal = _with_gpu({EFFICIENCY: 0.8, "memory.act_hidden": 7.0})
    h100 = cal.for_gpu("H100")
    assert h100.recipe(9, PrecisionRecipe.NONE).efficiency == 0.8
    assert h100.memory.act_hidden == 7.0 and h100.sources[EFFICIENCY] == "test"
    assert h100.gpus == {} and h100.for_gpu("H100") is h100  # applied once, whoever calls again
    # Another GPU, and the shared profile itself, keep the shared constants.
    assert cal.for_gpu("H200") is cal
    assert cal.memory.act_hidden == load_calibration().memory.act_hidden


def test_a_job_on_that_gpu_plans_with_them_and_a_job_on_another_does_not() -> None:
    faster = _with_gpu({EFFICIENCY: 0.9})
    shared = load_calibration()
    on_h100 = [plan_job(_spec("ml.p5.48xlarge"), calibration=c).predicted for c in (shared, faster)]
    on_h200 = [plan_job(_spec("ml.p5en.48xlarge"), calibration=c).predicted for c in (shared, faster)]
    assert on_h100[1].tokens_per_second_per_gpu > on_h100[0].tokens_per_second_per_gpu * 1.05
    assert on_h200[1] == on_h200[0]


def test_an_oom_correction_scales_what_the_gpu_measured() -> None:
    # The GPU's activation bytes are what the correction scales: applying them after it would undo the
    # correction and plan the size that ran out of memory again.
    smaller = _with_gpu({"memory.act_hidden": 6.0, "memory.act_ffn": 5.0})
    spec = _spec("ml.p5.48xlarge", activationCheckpointing="none")
    plain = plan_job(spec, calibration=smaller)
    corrected = plan_job(
        spec, calibration=smaller, correction=MemoryCorrection(generation=1, activation_scale=1.3)
    )
    assert corrected.predicted.memory.activations > plain.predicted.memory.activations * 1.2


@pytest.mark.parametrize(
    ("constants", "sources", "match"),
    [
        ({"memory.act_hiden": 7.0}, None, r"no constant 'memory\.act_hiden'"),
        ({"trainer.compile": 1.0}, None, r"not a memory\.\* or throughput\.\* constant"),
        ({"throughput.recipes.9": 1.0}, None, r"no constant"),
        ({EFFICIENCY: 0.8}, {}, r"gpus\.H100: no source for throughput\.recipes\.9\.none\.efficiency"),
    ],
)
def test_a_wrong_gpu_constant_is_refused_on_load(
    constants: dict[str, float], sources: dict[str, str] | None, match: str
) -> None:
    with pytest.raises(ValidationError, match=match):
        _with_gpu(constants, sources)
