"""Per-GPU memory model: named components, the phase that holds the peak, and allocator fragmentation."""

from __future__ import annotations

import math
from dataclasses import dataclass

from blackwell_operator.calibration import Calibration
from blackwell_operator.planner.layout import Layout, Setting
from blackwell_operator.planner.shapes import Shapes
from blackwell_trainer.plan.config import (
    ActivationCheckpointing,
    MemoryBreakdown,
    PrecisionRecipe,
    keeps_gathered_weights,
)

AC = ActivationCheckpointing


@dataclass(frozen=True)
class MemoryEstimate:
    """Predicted per-GPU memory, bytes. peak_reserved is what must fit in the GPU."""

    parameters: int
    gradients: int
    optimizer_states: int
    activations: int
    loss: int
    fsdp_transient: int
    precision_overhead: int
    workspace: int
    fragmentation: int
    peak_phase: str
    peak_allocated: int
    allocator_reserved: int
    outside_allocator: int
    # Phase internals, for calibration fits and tests: allocated bytes at each phase and the backward
    # phase's split into saved activations, the transient (loss or recompute) and the gradients.
    backward_allocated: int = 0
    optimizer_allocated: int = 0
    saved_activations: int = 0
    transient: int = 0
    gradient_bytes: int = 0
    backward_reserved: int = 0

    @property
    def peak_reserved(self) -> int:
        """Everything that must fit: the allocator's reserved pool plus CUDA context and NCCL buffers."""
        return self.allocator_reserved + self.outside_allocator

    def to_breakdown(self) -> MemoryBreakdown:
        """The wire form carried in the plan."""
        return MemoryBreakdown(
            parameters=self.parameters,
            gradients=self.gradients,
            optimizer_states=self.optimizer_states,
            activations=self.activations,
            loss=self.loss,
            fsdp_transient=self.fsdp_transient,
            precision_overhead=self.precision_overhead,
            workspace=self.workspace,
            fragmentation=self.fragmentation,
            peak_phase=self.peak_phase,
            peak_allocated=self.peak_allocated,
            peak_reserved=self.peak_reserved,
        )


def tokens_per_gpu(setting: Setting, sequence_length: int) -> int:
    """Tokens one GPU holds per micro-batch (a context-parallel rank holds 1/cp of each sequence)."""
    return setting.micro_batch_size * sequence_length // setting.context_parallel


def activation_bytes_per_token_layer(
    shapes: Shapes, cal: Calibration, mode: ActivationCheckpointing, recipe: PrecisionRecipe | None = None
) -> float:
    """Saved activation bytes per token per block for a checkpointing mode (and precision recipe)."""
    m = cal.memory
    if mode is AC.FULL:
        return m.full_hidden * shapes.hidden
    if mode is AC.SELECTIVE and recipe in cal.trainer.selective_recomputes_gemms:
        # The save policy cannot see this recipe's GEMMs: only the block input and attention's outputs stay.
        return m.full_hidden * shapes.hidden + m.selective_q * shapes.q_dim + m.selective_heads * shapes.heads
    if mode is AC.SELECTIVE:
        return (
            m.selective_hidden * shapes.hidden
            + m.selective_q * shapes.q_dim
            + m.selective_kv * shapes.kv_dim
            + m.selective_ffn * shapes.ffn
            + m.selective_heads * shapes.heads
        )
    return (
        m.act_hidden * shapes.hidden
        + m.act_q * shapes.q_dim
        + m.act_kv * shapes.kv_dim
        + m.act_ffn * shapes.ffn
        + m.act_heads * shapes.heads
    )


def trainer_keeps_weights(
    cal: Calibration, params: int, shard_degree: int, gpu_memory_bytes: int | None
) -> bool:
    """Whether this calibration's trainer keeps every block's bf16 weights from forward to backward.

    The trainer's own rule (`keeps_gathered_weights`), for trainers that have the behaviour; memory and
    throughput both follow it (the weights held, and the second gather's copies not made).
    """
    return (
        cal.trainer.keeps_unsharded_weights
        and gpu_memory_bytes is not None
        and keeps_gathered_weights(params, shard_degree, gpu_memory_bytes)
    )


def single_device_path(cal: Calibration, layout: Layout, recipe: PrecisionRecipe) -> bool:
    """Whether this calibration's trainer runs the setting without FSDP2 (its single-device path)."""
    return cal.trainer.single_device_path and layout.one_device and recipe not in cal.trainer.eager_recipes


def loss_bytes(shapes: Shapes, cal: Calibration, tokens: int) -> float:
    """The logits/cross-entropy transient: full fp32 logits, or one chunk of them."""
    chunk = cal.trainer.loss_chunk_tokens
    if chunk <= 0:
        return tokens * shapes.vocab * cal.memory.loss_bytes_per_logit
    return min(tokens, chunk) * shapes.vocab * cal.memory.chunked_loss_bytes_per_logit


def estimate_memory(
    shapes: Shapes,
    cal: Calibration,
    setting: Setting,
    layout: Layout,
    sequence_length: int,
    gradient_accumulation_steps: int = 1,
    gpu_memory_bytes: int | None = None,
) -> MemoryEstimate:
    """Predict the per-GPU memory of one setting at its peak phase (on a GPU of gpu_memory_bytes)."""
    m = cal.memory
    shard = layout.shard_degree
    psi = shapes.total_params
    params = math.ceil(m.master_param_bytes * psi / shard)
    grads = math.ceil(m.gradient_bytes * psi / shard)
    optim = math.ceil(m.optimizer_bytes * psi / shard)

    tokens = tokens_per_gpu(setting, sequence_length)
    # Selective AC measured as AC none under some recipes (trainer.selective_recomputes_nothing).
    mode = cal.trainer.modelled_checkpointing(setting.activation_checkpointing, setting.recipe)
    # Recipes that keep the saved inputs of the block's linears in FP8 (torchao float8) save bytes on
    # every such element: the QKV, gate/up (h each), output-projection (q) and down-projection (F) inputs.
    saving = m.precision_activation_saving.get(setting.recipe, 0.0)
    saving *= 2 * shapes.hidden + shapes.q_dim + shapes.ffn
    full_layer = activation_bytes_per_token_layer(shapes, cal, AC.NONE) - saving
    # (Selective AC keeps matmul outputs rather than their inputs: no saving assumed there.)
    per_layer = (
        full_layer if mode is AC.NONE else activation_bytes_per_token_layer(shapes, cal, mode, setting.recipe)
    )
    saved = tokens * (shapes.layers * per_layer + m.outside_layers_hidden * shapes.hidden)
    # During a checkpointed block's backward its full activations exist again, for one block at a time,
    # and a low-precision recipe's recomputed linear inputs are low precision again. Measured on H200
    # (torchao float8, full AC): 1B at 512K tokens allocated 103.8 GiB against 109.8 in BF16, 3B at 128K
    # 79.0 against 80.8; recompute_saving_share is fitted to such pairs.
    recompute_layer = (
        activation_bytes_per_token_layer(shapes, cal, AC.NONE) - m.recompute_saving_share * saving
    )
    recompute = 0.0 if mode is AC.NONE else m.recompute_transient_factor * tokens * recompute_layer
    loss = loss_bytes(shapes, cal, tokens)

    # FSDP2 keeps the root (embeddings, head) unsharded through forward and backward, and gathers blocks
    # one or two ahead; backward adds one block's unsharded gradients before the reduce-scatter.
    fsdp_fwd = m.compute_param_bytes * (shapes.root_params + m.fsdp_blocks_in_flight * shapes.block_params)
    single = single_device_path(cal, layout, setting.recipe)
    if trainer_keeps_weights(cal, psi, shard, gpu_memory_bytes):
        # Unsharded on a roomy GPU, the trainer keeps every block's bf16 copy until backward reaches it.
        fsdp_fwd = m.compute_param_bytes * psi
        if single and setting.recipe is not PrecisionRecipe.NONE:
            # Without FSDP2 a torchao float8 Linear quantises its fp32 weight directly: no bf16 copy of the
            # block linears exists to keep (the only low-precision recipes on this path: TE runs FSDP2).
            # Measured on H200 (3B untied, FP8, batch 2 and 4): 5.3 GiB less allocated than FSDP2 on one
            # rank, 2 bytes x the 2.82e9 block-linear parameters (benchmarks/results/trainer_ab_h200.json).
            fsdp_fwd -= m.compute_param_bytes * shapes.layers * shapes.block_linear_params
    fsdp_bwd = m.fsdp_grad_bytes * shapes.block_params
    precision = (
        m.precision_weight_bytes.get(setting.recipe, 0.0)
        * shapes.block_linear_params
        * (m.fsdp_blocks_in_flight)
    )
    workspace_inside = m.allocator_workspace_bytes
    outside = m.cuda_context_bytes + m.nccl_bytes_per_group * layout.process_groups

    # Phase 1, start of backward: every saved activation, then the larger of the loss spike and one
    # recomputed block with its unsharded gradients (they do not coexist).
    accumulating = grads if gradient_accumulation_steps > 1 else 0
    # The output projection's gradient exists from the loss (the trainer's chunked loss accumulates it in
    # forward, autograd makes it first in backward) until the root's gradients are reduced at the end.
    head_grad = m.compute_param_bytes * shapes.vocab * shapes.hidden
    static = params + optim + accumulating + head_grad
    loss_path = loss >= recompute + fsdp_bwd
    transient = loss if loss_path else recompute + fsdp_bwd
    dynamic = saved + transient
    backward = static + dynamic + fsdp_fwd + precision + workspace_inside
    # Phase 2, end of backward into the optimizer step: all states plus the root's unsharded copies.
    root_copies = m.optimizer_phase_root_bytes * shapes.root_params
    optimizer = params + grads + optim + root_copies + precision + workspace_inside
    if single:
        # Without FSDP2 nothing is gathered: no root copies, and no FP8 weights outside a block's own
        # forward and backward (float8 quantises the fp32 weight at use). The peak is the last step of
        # backward: the embedding lookup ran on the table's bf16 cast, so its gradient is a dense bf16
        # table (tied: the head's gradient summed in) that is alive while its fp32 cast, the parameter's
        # .grad, is made; the fused AdamW step and clipping then work in place. Measured on H200 (8B
        # full AC, BF16 and FP8, mbs 2 and 4): 16 bytes x parameters + 1.12-1.24 GB allocated, where
        # this bf16 table is 1.05 GB (benchmarks/results/trainer_h200_single.json).
        root_copies = m.compute_param_bytes * shapes.vocab * shapes.hidden
        optimizer = params + grads + optim + root_copies + workspace_inside

    # Pools of the collectives' CUDA streams: a block freed on one stream serves only that stream, so the
    # all-gather and reduce-scatter buffers of a sharded job stay reserved beside the default pool.
    comm_pools = m.fragmentation_comm_bytes if layout.shard_degree > 1 else 0.0
    reserved_backward = backward + m.fragmentation_base_bytes + comm_pools + m.fragmentation_dynamic * saved
    # Gradients are freed after each step (zero_grad sets them to None) into the pool of the stream that
    # made them (FSDP2's reduce-scatter), which the next forward's activations cannot use: on H200 reserved
    # minus allocated equalled the gradient bytes on every 1B/3B run (docs/calibration/README.md).
    # (Without FSDP2 the gradients come from the compute stream and go back to its pool.)
    stream_grads = 0.0 if single else grads
    reserved_backward += m.fragmentation_transient * transient + m.fragmentation_gradients * stream_grads
    # FSDP2's optimizer-phase fragmentation (fitted on its runs) does not apply to the single-device path:
    # one stream, no gathered or reduce-scattered buffers; its 8B runs reserved 1.1-1.7% over allocated.
    frag_optimizer = 0.0 if single else m.fragmentation_optimizer * optimizer
    reserved_optimizer = optimizer + m.fragmentation_base_bytes + frag_optimizer
    # The caching allocator's pool is a high-water mark: it keeps what the larger phase reserved.
    reserved = max(reserved_backward, reserved_optimizer)
    if backward >= optimizer:
        allocated = backward
        parts = {
            "gradients": accumulating + head_grad,
            "activations": saved + (0.0 if loss_path else recompute),
            "loss": loss if loss_path else 0.0,
            "fsdp_transient": fsdp_fwd + (0.0 if loss_path else fsdp_bwd),
        }
        phase = "backward"
    else:
        allocated = optimizer
        if single:  # the embedding's bf16 gradient, not an FSDP2 copy; no FP8 weights at this point
            parts = {"gradients": grads + root_copies, "activations": 0.0, "loss": 0.0, "fsdp_transient": 0.0}
            precision = 0.0
        else:
            parts = {"gradients": grads, "activations": 0.0, "loss": 0.0, "fsdp_transient": root_copies}
        phase = "optimizer"
    return MemoryEstimate(
        parameters=params,
        gradients=round(parts["gradients"]),
        optimizer_states=optim,
        activations=round(parts["activations"]),
        loss=round(parts["loss"]),
        fsdp_transient=round(parts["fsdp_transient"]),
        precision_overhead=round(precision),
        workspace=round(workspace_inside + outside),
        fragmentation=round(max(reserved, allocated) - allocated),
        peak_phase=phase,
        peak_allocated=round(allocated),
        allocator_reserved=round(max(reserved, allocated)),
        outside_allocator=round(outside),
        backward_allocated=round(backward),
        optimizer_allocated=round(optimizer),
        saved_activations=round(saved),
        transient=round(transient),
        gradient_bytes=grads,
        backward_reserved=round(reserved_backward + outside),
    )
