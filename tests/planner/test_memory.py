"""Memory model components against hand calculations."""

from __future__ import annotations

import pytest

from blackwell_operator.calibrate.fit import with_constants
from blackwell_operator.calibration import load_calibration
from blackwell_operator.planner.memory import (
    activation_bytes_per_token_layer,
    estimate_memory,
    loss_bytes,
)
from blackwell_operator.units import GIB
from blackwell_trainer.plan.config import ActivationCheckpointing as AC
from blackwell_trainer.plan.config import PrecisionRecipe
from tests.support.specs import fsdp_on_one_gpu, hardware, layout, setting, shapes

BTJ = load_calibration("btj-trainer")
REF = load_calibration("h200-reference")
P8B = 8_030_261_248


def test_model_states_are_16_bytes_per_parameter_over_the_shard_degree() -> None:
    hw = hardware(nodes=2)
    for sharding, degree in (("full", 16), ("hybrid", 8), ("none", 1)):
        st = setting(sharding=sharding)
        mem = estimate_memory(shapes(), BTJ, st, layout(st, hw), 4096)
        assert mem.parameters == pytest.approx(4 * P8B / degree, abs=1)
        assert mem.optimizer_states == pytest.approx(8 * P8B / degree, abs=1)
        assert mem.gradient_bytes == pytest.approx(4 * P8B / degree, abs=1)


def test_activation_bytes_per_token_and_layer_by_checkpointing_mode() -> None:
    sh = shapes()  # Llama-3.1-8B: h 4096, q 4096, kv 1024, F 14336, 32 heads
    m = REF.memory
    none = m.act_hidden * 4096 + m.act_q * 4096 + m.act_kv * 1024 + m.act_ffn * 14336 + m.act_heads * 32
    assert activation_bytes_per_token_layer(sh, REF, AC.NONE) == none
    # Same order as Korthikanti's ~34 bytes x h per token per layer (modern-architecture correction): the
    # fitted profiles differ (eager SwiGLU keeps more, compiled blocks less) but stay physical.
    for cal in (REF, BTJ):
        assert 20 < activation_bytes_per_token_layer(sh, cal, AC.NONE) / 4096 < 60
    assert activation_bytes_per_token_layer(sh, REF, AC.FULL) == m.full_hidden * 4096
    for cal in (REF, BTJ):
        full = activation_bytes_per_token_layer(sh, cal, AC.FULL)
        selective = activation_bytes_per_token_layer(sh, cal, AC.SELECTIVE)
        assert full < selective < activation_bytes_per_token_layer(sh, cal, AC.NONE)


def test_saved_activations_scale_with_layers_tokens_and_context_parallel() -> None:
    sh, hw = shapes(), hardware()
    per = activation_bytes_per_token_layer(sh, BTJ, AC.NONE)
    st = setting(mbs=2)
    mem = estimate_memory(sh, BTJ, st, layout(st, hw), 8192)
    tokens = 2 * 8192
    outside = BTJ.memory.outside_layers_hidden * 4096
    assert mem.saved_activations == pytest.approx(tokens * (32 * per + outside), rel=1e-9)
    cp = setting(mbs=2, cp=2)
    assert estimate_memory(sh, BTJ, cp, layout(cp, hw), 8192).saved_activations == pytest.approx(
        mem.saved_activations / 2, rel=1e-9
    )


def test_loss_spike_full_logits_versus_chunked() -> None:
    sh = shapes()
    tokens = 4 * 4096
    # Unchunked (reference trainer): tokens x vocab x 11.2 bytes (bf16 logits, fp32 copy, fp32 grad).
    assert loss_bytes(sh, REF, tokens) == pytest.approx(tokens * 128256 * 11.2)
    # Chunked at the profile's 4,096 tokens: only one chunk's logits exist at a time.
    per_logit = BTJ.memory.chunked_loss_bytes_per_logit
    assert BTJ.trainer.loss_chunk_tokens == 4096
    assert loss_bytes(sh, BTJ, tokens) == pytest.approx(4096 * 128256 * per_logit)
    assert loss_bytes(sh, BTJ, 1000) == pytest.approx(1000 * 128256 * per_logit)


def test_fsdp_transient_holds_the_root_and_two_blocks_in_bf16() -> None:
    sh, hw = shapes(), hardware()
    st = setting(mbs=1)
    mem = estimate_memory(sh, BTJ, st, layout(st, hw), 4096)
    assert mem.peak_phase == "backward"
    assert mem.fsdp_transient == pytest.approx(2 * (sh.root_params + 2 * sh.block_params), abs=2)
    # Root = input embedding + output head + final norm for an untied model.
    assert sh.root_params == 2 * 128256 * 4096 + 4096


def test_workspace_counts_nccl_groups_and_the_cuda_context() -> None:
    sh = shapes()
    one = hardware("ml.p5en.48xlarge", gpus_per_node=1)
    st = setting()
    alone = estimate_memory(sh, BTJ, st, layout(st, one), 4096)
    assert alone.outside_allocator == BTJ.memory.cuda_context_bytes
    hw2 = hardware(nodes=2)
    hybrid = setting(sharding="hybrid")
    two = estimate_memory(sh, BTJ, hybrid, layout(hybrid, hw2), 4096)
    assert two.outside_allocator == BTJ.memory.cuda_context_bytes + 2 * BTJ.memory.nccl_bytes_per_group


def test_precision_overhead_is_low_precision_copies_of_in_flight_weights() -> None:
    sh, hw = shapes(), hardware()
    bf16 = setting()
    fp8 = setting(precision="fp8", recipe="delayed")
    mx = setting(precision="mxfp8", recipe="mxfp8-block")
    m_bf16 = estimate_memory(sh, BTJ, bf16, layout(bf16, hw), 4096)
    m_fp8 = estimate_memory(sh, BTJ, fp8, layout(fp8, hw), 4096)
    m_mx = estimate_memory(sh, BTJ, mx, layout(mx, hw), 4096)
    assert m_bf16.precision_overhead == 0
    weight_bytes = BTJ.memory.precision_weight_bytes
    delayed, mxfp8 = weight_bytes[PrecisionRecipe.DELAYED], weight_bytes[PrecisionRecipe.MXFP8_BLOCK]
    assert m_fp8.precision_overhead == pytest.approx(2 * delayed * sh.block_linear_params, abs=1)
    assert m_mx.precision_overhead == pytest.approx(2 * mxfp8 * sh.block_linear_params, abs=1)
    # FP8-family formats barely move peak memory (docs/reference/tuning-anchors.md §2.2): under 2% even at
    # mbs 1.
    assert m_fp8.peak_reserved / m_bf16.peak_reserved - 1 < 0.02


def test_components_add_up_to_the_peak() -> None:
    sh, hw = shapes(), hardware()
    for ac in ("none", "selective", "full"):
        st = setting(ac=ac, mbs=3)
        m = estimate_memory(sh, BTJ, st, layout(st, hw), 8192)
        parts = (
            m.parameters
            + m.gradients
            + m.optimizer_states
            + m.activations
            + m.loss
            + m.fsdp_transient
            + m.precision_overhead
            + m.workspace
            + m.fragmentation
        )
        assert parts == pytest.approx(m.peak_reserved, abs=16)
        assert m.peak_allocated + m.fragmentation + m.outside_allocator == pytest.approx(
            m.peak_reserved, abs=4
        )


def test_optimizer_step_is_the_peak_for_8b_on_one_h200_with_full_checkpointing() -> None:
    # Reference grid: 123.6 GiB allocated at every micro-batch (1, 2, 4) with full AC.
    sh, hw = shapes(), hardware("ml.p5en.48xlarge", gpus_per_node=1)
    for mbs in (1, 2, 4):
        st = setting(ac="full", mbs=mbs, compile_blocks=False)
        m = estimate_memory(sh, REF, st, layout(st, hw), 4096)
        assert m.peak_phase == "optimizer"
        assert m.peak_allocated / GIB == pytest.approx(123.6, rel=0.01)
        # 16 bytes per parameter (119.7 GiB) plus the root's unsharded copies.
        assert m.peak_allocated == pytest.approx(
            16 * P8B + 4 * sh.root_params + REF.memory.allocator_workspace_bytes, abs=4
        )


def test_gradients_persist_through_forward_when_accumulating() -> None:
    sh, hw = shapes(), hardware()
    st = setting(mbs=2)
    one = estimate_memory(sh, BTJ, st, layout(st, hw), 4096, gradient_accumulation_steps=1)
    acc = estimate_memory(sh, BTJ, st, layout(st, hw), 4096, gradient_accumulation_steps=4)
    assert acc.backward_allocated - one.backward_allocated == pytest.approx(4 * P8B / 8, abs=2)


def test_reserved_exceeds_allocated_by_the_fitted_fragmentation() -> None:
    sh, hw = shapes("llama3.2-1b"), hardware("ml.p5en.48xlarge", gpus_per_node=1)
    st = setting(mbs=8, compile_blocks=False)
    m = estimate_memory(sh, REF, st, layout(st, hw), 4096)
    frag = REF.memory
    expected = frag.fragmentation_base_bytes + frag.fragmentation_transient * m.transient
    expected += (
        frag.fragmentation_gradients * m.gradient_bytes + frag.fragmentation_dynamic * m.saved_activations
    )
    assert m.fragmentation == pytest.approx(expected, abs=4)
    assert 1.05 < m.allocator_reserved / m.peak_allocated < 1.25


def test_torchao_float8_keeps_saved_linear_inputs_in_fp8() -> None:
    sh, hw = shapes(), hardware()
    bf16 = setting(mbs=2)
    fp8 = setting(mbs=2, precision="fp8", recipe="torchao-tensorwise")
    te = setting(mbs=2, precision="fp8", recipe="delayed")
    m_bf16, m_fp8, m_te = (estimate_memory(sh, BTJ, s, layout(s, hw), 4096) for s in (bf16, fp8, te))
    inputs_per_token_layer = 2 * 4096 + 4096 + 14336  # QKV and gate/up inputs (h), o-proj (q), down (F)
    saving = BTJ.memory.precision_activation_saving[PrecisionRecipe.TORCHAO_TENSORWISE]
    expected = 2 * 4096 * 32 * inputs_per_token_layer * saving
    assert m_bf16.saved_activations - m_fp8.saved_activations == pytest.approx(expected, abs=2)
    assert m_te.saved_activations == m_bf16.saved_activations  # TE: not assumed (not measured)


def test_one_roomy_gpu_keeps_every_blocks_bf16_weights_as_the_trainer_does() -> None:
    from blackwell_trainer.plan.config import keeps_gathered_weights

    one = hardware("ml.p5en.48xlarge", gpus_per_node=1)
    st = setting(mbs=1)
    small = shapes("llama3.2-1b")
    kept = estimate_memory(small, BTJ, st, layout(st, one), 4096, gpu_memory_bytes=one.gpu.memory_bytes)
    # The trainer's rule (config.keeps_gathered_weights) holds for 1B on an H200: all bf16 copies count.
    assert keeps_gathered_weights(small.total_params, 1, one.gpu.memory_bytes)
    assert kept.fsdp_transient == pytest.approx(BTJ.memory.compute_param_bytes * small.total_params, abs=2)
    # A trainer profile without the behaviour (the plain-PyTorch reference) counts the root and two blocks.
    ref = estimate_memory(small, REF, st, layout(st, one), 4096, gpu_memory_bytes=one.gpu.memory_bytes)
    assert ref.fsdp_transient == pytest.approx(
        REF.memory.compute_param_bytes * (small.root_params + 2 * small.block_params), abs=2
    )
    # 8B's states (18 bytes/parameter, 145 GB) exceed 60% of the GPU: trainer and model reshard.
    big = shapes("llama3.1-8b")
    assert not keeps_gathered_weights(big.total_params, 1, one.gpu.memory_bytes)
    resharded = estimate_memory(big, BTJ, st, layout(st, one), 4096, gpu_memory_bytes=one.gpu.memory_bytes)
    # Its transient is then the root's copies (the optimizer phase's, 4.5 bytes per root parameter),
    # well under the 16 GB that keeping every block's bf16 weights would hold.
    assert resharded.fsdp_transient < BTJ.memory.compute_param_bytes * big.total_params / 2
    # Sharded over 8 GPUs nothing is kept, however much room there is.
    eight = hardware("ml.p5en.48xlarge")
    assert not keeps_gathered_weights(small.total_params, 8, eight.gpu.memory_bytes)


def test_collective_stream_pools_are_reserved_only_when_parameters_are_sharded() -> None:
    sh = shapes()
    st = setting(mbs=1)
    one = hardware("ml.p5en.48xlarge", gpus_per_node=1)
    two = hardware("ml.p5en.48xlarge", gpus_per_node=2)
    # FSDP2 on one GPU: its gradients' stream pool without the collectives' (the single-device path has
    # neither: tests/planner/test_single_device_model.py).
    alone = estimate_memory(sh, fsdp_on_one_gpu(BTJ), st, layout(st, one), 4096)
    sharded = estimate_memory(sh, BTJ, st, layout(st, two), 4096)
    comm = BTJ.memory.fragmentation_comm_bytes
    assert comm > 0
    extra_alone = alone.backward_reserved - alone.outside_allocator - alone.backward_allocated
    extra_sharded = sharded.backward_reserved - sharded.outside_allocator - sharded.backward_allocated
    # Sharding halves the gradients (and their pool) but adds the collectives' pools.
    grads_pool = BTJ.memory.fragmentation_gradients * (alone.gradient_bytes - sharded.gradient_bytes)
    assert extra_alone - extra_sharded == pytest.approx(grads_pool - comm, rel=0.02)


def test_a_checkpointed_blocks_backward_holds_its_activations_times_the_factor() -> None:
    sh, hw = shapes(), hardware()
    # mbs 16: the recomputed block (not the loss chunk) is the larger backward transient.
    fp8_full = setting(ac="full", mbs=16, precision="fp8", recipe="torchao-tensorwise")
    tokens = 16 * 4096
    bf16_layer = activation_bytes_per_token_layer(sh, BTJ, AC.NONE)
    fsdp_bwd = BTJ.memory.fsdp_grad_bytes * sh.block_params
    per_element = BTJ.memory.precision_activation_saving[PrecisionRecipe.TORCHAO_TENSORWISE]
    saving = per_element * (2 * sh.hidden + sh.q_dim + sh.ffn)
    for share in (0.0, 0.5):
        cal = with_constants(BTJ, {"memory.recompute_saving_share": share})
        mem = estimate_memory(sh, cal, fp8_full, layout(fp8_full, hw), 4096)
        expected = cal.memory.recompute_transient_factor * tokens * (bf16_layer - share * saving)
        assert expected > loss_bytes(sh, cal, tokens)
        # The recomputed block's low-precision linear inputs save `share` of the saved inputs' saving.
        assert mem.transient == pytest.approx(expected + fsdp_bwd, rel=1e-6)


def test_the_output_projections_gradient_is_held_through_backward() -> None:
    sh, hw = shapes(), hardware()
    s = setting(ac="none", mbs=2)
    mem = estimate_memory(sh, BTJ, s, layout(s, hw), 4096)
    assert mem.peak_phase == "backward"
    # One step, no accumulation: the only gradient at the start of backward is the head's.
    assert mem.gradients == round(BTJ.memory.compute_param_bytes * sh.vocab * sh.hidden)
