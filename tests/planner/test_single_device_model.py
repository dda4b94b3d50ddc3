"""The planner's model of the trainer's single-device path (calibration trainer.single_device_path).

Off in the shipped btj-trainer profile until one-GPU runs of the path are measured (docs/trainer.md); these
tests switch it on to check what it changes, and that records of FSDP2 on one rank keep their prediction.
"""

from __future__ import annotations

import pytest

from blackwell_operator.calibrate.predict import as_ran
from blackwell_operator.calibrate.records import CalibrationRecord, RecordStatus
from blackwell_operator.calibration import Calibration, load_calibration
from blackwell_operator.catalogs import get_preset
from blackwell_operator.planner.memory import estimate_memory
from blackwell_operator.planner.throughput import estimate_time
from blackwell_trainer.config import Candidate
from tests.planner.conftest import hardware, layout, setting, shapes

BTJ = load_calibration("btj-trainer")


def _on(cal: Calibration) -> Calibration:
    return cal.model_copy(update={"trainer": cal.trainer.model_copy(update={"single_device_path": True})})


ON = _on(BTJ)


def test_the_shipped_profile_keeps_the_path_off_until_it_is_measured() -> None:
    assert not BTJ.trainer.single_device_path


def test_one_gpu_drops_the_fsdp2_copies_and_the_gradient_pool() -> None:
    one = hardware("ml.p5en.48xlarge", gpus_per_node=1)
    sh, st = shapes("llama3.2-3b"), setting(mbs=2)
    off, on = (estimate_memory(sh, c, st, layout(st, one), 4096, gpu_memory_bytes=one.gpu.memory_bytes)
               for c in (BTJ, ON))  # fmt: skip
    # The gradients go back to the compute stream's pool: their fragmentation term is gone.
    dropped = off.allocator_reserved - on.allocator_reserved
    grads = BTJ.memory.gradient_bytes * sh.total_params
    assert dropped == pytest.approx(BTJ.memory.fragmentation_gradients * grads, rel=1e-6)
    assert on.peak_allocated == off.peak_allocated  # the same tensors are allocated
    slow, fast = (estimate_time(sh, c, one, st, layout(st, one), 4096) for c in (BTJ, ON))
    bandwidth = one.gpu.hbm_bandwidth * BTJ.throughput.memory_bandwidth_efficiency
    cast = BTJ.trainer.single_device_cast_bytes_per_param * sh.total_params / bandwidth
    assert fast.breakdown["fsdp_copies"] == pytest.approx(cast)
    assert fast.breakdown["fsdp_copies"] < slow.breakdown["fsdp_copies"] / 3
    assert fast.tokens_per_second_per_gpu > slow.tokens_per_second_per_gpu


@pytest.mark.parametrize("gpus,recipe", [(2, "none"), (1, "delayed")], ids=["two-gpus", "te-recipe"])
def test_fsdp2_layouts_and_transformer_engine_are_unchanged(gpus: int, recipe: str) -> None:
    hw = hardware("ml.p5en.48xlarge", gpus_per_node=gpus)
    sh = shapes("llama3.2-3b")
    st = setting(mbs=2, precision="bf16" if recipe == "none" else "fp8", recipe=recipe)
    assert estimate_memory(sh, ON, st, layout(st, hw), 4096, gpu_memory_bytes=hw.gpu.memory_bytes) == (
        estimate_memory(sh, BTJ, st, layout(st, hw), 4096, gpu_memory_bytes=hw.gpu.memory_bytes)
    )
    assert estimate_time(sh, ON, hw, st, layout(st, hw), 4096) == estimate_time(
        sh, BTJ, hw, st, layout(st, hw), 4096
    )


def test_a_record_of_fsdp2_on_one_rank_is_predicted_as_it_ran() -> None:
    preset = get_preset("llama3.2-3b")
    record = CalibrationRecord(
        source="synthetic",
        model_name=preset.name,
        architecture=preset.architecture,
        instance_type="ml.p5en.48xlarge",
        gpus_per_node=1,
        sequence_length=4096,
        candidate=Candidate(
            precision="bf16",
            precision_recipe="none",
            activation_checkpointing="none",
            micro_batch_size=2,
            gradient_accumulation_steps=1,
            sharding="full",
            shard_degree=1,
            replicate_degree=1,
        ),
        status=RecordStatus.OK,
    )
    assert not as_ran(record, ON).trainer.single_device_path  # made before the path: FSDP2
    assert as_ran(record.model_copy(update={"single_device_path": True}), ON) is ON
    assert as_ran(record, BTJ) is BTJ
