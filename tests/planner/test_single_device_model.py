"""The planner's model of the trainer's single-device path (calibration trainer.single_device_path).

On in the shipped btj-trainer profile since the path ran on one H200 (2026-12-02, docs/trainer.md): one GPU
is planned as the trainer now runs it. These tests compare it with the path off (FSDP2 on one rank), and
check that records keep the prediction of the path they ran.
"""

from __future__ import annotations

import pytest

from blackwell_operator.calibrate.predict import as_ran
from blackwell_operator.calibrate.records import CalibrationRecord, RecordStatus
from blackwell_operator.calibration import load_calibration
from blackwell_operator.catalogs import get_preset
from blackwell_operator.planner.memory import estimate_memory
from blackwell_operator.planner.throughput import estimate_time
from blackwell_trainer.plan.config import Candidate
from tests.support.specs import fsdp_on_one_gpu, hardware, layout, setting, shapes

BTJ = load_calibration("btj-trainer")


ON, OFF = BTJ, fsdp_on_one_gpu(BTJ)


def test_the_shipped_profile_plans_one_gpu_on_the_single_device_path() -> None:
    assert BTJ.trainer.single_device_path
    # Fitted to the path's H200 runs: more than its code's floor of 12 bytes, less than FSDP2's copies.
    t = BTJ.throughput
    assert 12.0 < t.single_device_cast_bytes_per_param < t.fsdp_copy_bytes_per_param


def test_one_gpu_drops_the_fsdp2_copies_and_the_gradient_pool() -> None:
    one = hardware("ml.p5en.48xlarge", gpus_per_node=1)
    sh, st = shapes("llama3.2-3b"), setting(mbs=2)
    off, on = (estimate_memory(sh, c, st, layout(st, one), 4096, gpu_memory_bytes=one.gpu.memory_bytes)
               for c in (OFF, ON))  # fmt: skip
    # The gradients go back to the compute stream's pool: their fragmentation term is gone.
    dropped = off.allocator_reserved - on.allocator_reserved
    grads = BTJ.memory.gradient_bytes * sh.total_params
    assert dropped == pytest.approx(BTJ.memory.fragmentation_gradients * grads, rel=1e-6)
    assert on.peak_allocated == off.peak_allocated  # BF16: the same tensors are allocated
    slow, fast = (estimate_time(sh, c, one, st, layout(st, one), 4096) for c in (OFF, ON))
    bandwidth = one.gpu.hbm_bandwidth * BTJ.throughput.memory_bandwidth_efficiency
    cast = BTJ.throughput.single_device_cast_bytes_per_param * sh.total_params / bandwidth
    assert fast.breakdown["fsdp_copies"] == pytest.approx(cast)
    assert fast.breakdown["fsdp_copies"] < slow.breakdown["fsdp_copies"]
    assert fast.tokens_per_second_per_gpu > slow.tokens_per_second_per_gpu


def test_torchao_float8_on_one_gpu_keeps_no_bf16_copy_of_the_block_linears() -> None:
    one = hardware("ml.p5en.48xlarge", gpus_per_node=1)
    sh, st = shapes("llama3.2-3b"), setting(mbs=2, precision="fp8", recipe="torchao-tensorwise")
    off, on = (estimate_memory(sh, c, st, layout(st, one), 4096, gpu_memory_bytes=one.gpu.memory_bytes)
               for c in (OFF, ON))  # fmt: skip
    # Its Linears quantise the fp32 weight; FSDP2 gathers a bf16 copy first (H200: 5.3 GiB for 3B untied).
    copies = BTJ.memory.compute_param_bytes * sh.layers * sh.block_linear_params
    assert off.peak_allocated - on.peak_allocated == pytest.approx(copies, abs=2)


@pytest.mark.parametrize("recipe", ["none", "torchao-tensorwise"])
def test_the_optimizer_phase_on_one_gpu_has_no_fsdp2_root_copies_nor_its_fragmentation(recipe: str) -> None:
    one = hardware("ml.p5en.48xlarge", gpus_per_node=1)
    sh = shapes("llama3.1-8b")
    st = setting(mbs=2, ac="full", precision="bf16" if recipe == "none" else "fp8", recipe=recipe)
    off, on = (estimate_memory(sh, c, st, layout(st, one), 4096, gpu_memory_bytes=one.gpu.memory_bytes)
               for c in (OFF, ON))  # fmt: skip
    m = BTJ.memory
    # The end of backward: every state, the embedding's bf16 gradient beside its fp32 cast, the workspace
    # (H200, 8B full AC, BF16 and FP8, mbs 2 and 4: 120.7 GiB allocated; this counts 120.9).
    states = (m.master_param_bytes + m.gradient_bytes + m.optimizer_bytes) * sh.total_params
    table = m.compute_param_bytes * sh.vocab * sh.hidden
    assert on.peak_phase == off.peak_phase == "optimizer"
    assert on.peak_allocated == pytest.approx(states + table + m.allocator_workspace_bytes, abs=2)
    assert on.allocator_reserved == pytest.approx(on.peak_allocated + m.fragmentation_base_bytes, abs=2)
    assert on.fsdp_transient == 0 and on.precision_overhead == 0
    # FSDP2 on one rank keeps its root copies and its optimizer-phase fragmentation.
    root = m.optimizer_phase_root_bytes * sh.root_params
    assert off.fsdp_transient == round(root)
    assert off.allocator_reserved - off.peak_allocated > m.fragmentation_optimizer * off.peak_allocated


@pytest.mark.parametrize("gpus,recipe", [(2, "none"), (1, "delayed")], ids=["two-gpus", "te-recipe"])
def test_fsdp2_layouts_and_transformer_engine_are_unchanged(gpus: int, recipe: str) -> None:
    hw = hardware("ml.p5en.48xlarge", gpus_per_node=gpus)
    sh = shapes("llama3.2-3b")
    st = setting(mbs=2, precision="bf16" if recipe == "none" else "fp8", recipe=recipe)
    assert estimate_memory(sh, ON, st, layout(st, hw), 4096, gpu_memory_bytes=hw.gpu.memory_bytes) == (
        estimate_memory(sh, OFF, st, layout(st, hw), 4096, gpu_memory_bytes=hw.gpu.memory_bytes)
    )
    assert estimate_time(sh, ON, hw, st, layout(st, hw), 4096) == estimate_time(
        sh, OFF, hw, st, layout(st, hw), 4096
    )


def _one_gpu_record(*, loss_chunk_tokens: int, single_device_path: bool = False) -> CalibrationRecord:
    """A synthetic record of 3B BF16, AC none, micro-batch 2 on one H200, at the loss chunk it ran."""
    preset = get_preset("llama3.2-3b")
    return CalibrationRecord(
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
            loss_chunk_tokens=loss_chunk_tokens,
        ),
        status=RecordStatus.OK,
        single_device_path=single_device_path,
    )


def test_a_record_is_predicted_on_the_path_it_ran_whatever_the_profile_plans_with() -> None:
    record = _one_gpu_record(loss_chunk_tokens=ON.trainer.loss_chunk_tokens)
    assert not as_ran(record, ON).trainer.single_device_path  # made before the path: FSDP2
    assert as_ran(record, OFF) is OFF
    single = record.model_copy(update={"single_device_path": True})
    assert as_ran(single, ON) is ON
    assert as_ran(single, OFF).trainer.single_device_path  # a record of the path, predicted as it ran
    assert single.key == record.key + "_single"


def test_a_record_is_predicted_with_the_loss_chunk_it_ran() -> None:
    """The profile's chunk went from 8,192 to 4,096 tokens (2026-12-07); the records made before keep theirs,
    so a fit of them is not moved by the change, and their loss transient is the one they measured."""
    assert ON.trainer.loss_chunk_tokens == 4096
    record = _one_gpu_record(loss_chunk_tokens=8192, single_device_path=True)
    ran = as_ran(record, ON)
    assert ran.trainer.loss_chunk_tokens == 8192 and ran.trainer.single_device_path
    assert as_ran(_one_gpu_record(loss_chunk_tokens=4096, single_device_path=True), ON) is ON
    # The transient it predicts: a chunk's bf16 logits and gradient, 4 bytes a logit, for 4,096 more tokens.
    one = hardware("ml.p5en.48xlarge", gpus_per_node=1)
    sh, st = shapes("llama3.2-3b"), setting(mbs=2)
    old, new = (estimate_memory(sh, c, st, layout(st, one), 4096, gpu_memory_bytes=one.gpu.memory_bytes)
                for c in (ran, ON))  # fmt: skip
    assert old.peak_allocated - new.peak_allocated == pytest.approx(
        4096 * sh.vocab * ON.memory.chunked_loss_bytes_per_logit, rel=0.01
    )
