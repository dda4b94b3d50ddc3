"""Turn the single-device model into the plan's training model: precision, AC, compile, FSDP2, then init.

The order is fixed (see ``parallelize``) and each technique is one ``apply_*`` function.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from blackwell_trainer.model.transformer import (
    Attention,
    FeedForward,
    Linear,
    Transformer,
    can_fuse,
    causal_attention,
    ordered_attention,
)
from blackwell_trainer.model.wide_grad import mixed_mm_available
from blackwell_trainer.parallel.precision import PrecisionSetup, apply_precision
from blackwell_trainer.plan.config import ActivationCheckpointing, Candidate, Sharding, keeps_gathered_weights

log = logging.getLogger(__name__)


class ParallelismError(ValueError):
    """A plan whose parallel layout does not fit the job's processes; the message is one actionable line."""


def _aten_ops(*names: str) -> set[Any]:
    """The aten overload packets that exist in this torch build (names differ between versions)."""
    ops: set[Any] = set()
    for name in names:
        op = getattr(torch.ops.aten, name, None)
        if op is not None:
            ops.add(op.default)
    return ops


# Selective AC saves the outputs of the expensive ops (matmuls and attention) and recomputes the cheap,
# memory-heavy ones (norms, RoPE, SiLU, products) in the backward pass; torchtitan's op-level SAC idea.
_SAVE_OPS = _aten_ops(
    "mm",
    "addmm",
    "bmm",
    "_scaled_mm",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_flash_attention_for_cpu",
)
# Context parallelism's K/V all-gather is NOT saved: its output is the full sequence's K/V, cp times the
# local K/V, for every layer; gathering again in the backward pass costs (cp-1)/cp of one layer's K/V
# bytes, small next to the attention it feeds at the sequence lengths that need CP.


def _selective_policy(_ctx: Any, op: Any, *_args: Any, **_kwargs: Any) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in _SAVE_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def _selective_context() -> Any:
    return create_selective_checkpoint_contexts(_selective_policy)  # type: ignore[no-untyped-call]


def apply_ac(blocks: nn.ModuleDict, mode: ActivationCheckpointing, *, te: bool = False) -> None:
    """Wrap each block for activation checkpointing (none: untouched; full: recompute the whole block).

    ``te``: the blocks hold Transformer Engine modules. Their recompute then goes through TE's own
    checkpoint, which re-enters the forward's FP8 autocast with the forward's scaling factors; torch's
    checkpoint would recompute in the backward pass, outside the autocast, so in BF16 (other saved
    tensors than the FP8 forward's). TE's GEMMs are not aten ops, so the selective policy there saves
    only attention outputs and recomputes the linears.
    """
    if mode == ActivationCheckpointing.NONE:
        return
    # checkpoint_wrapper keeps parameter FQNs stable in state_dict (its hooks strip the wrapper prefix).
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    if te:
        from transformer_engine.pytorch.distributed import checkpoint as te_checkpoint

        for key, block in list(blocks.items()):
            kwargs: dict[str, Any] = {"use_reentrant": False}
            if mode == ActivationCheckpointing.SELECTIVE:
                kwargs["context_fn"] = _selective_context
            blocks[key] = checkpoint_wrapper(block, checkpoint_fn=te_checkpoint, **kwargs)
        return
    for key, block in list(blocks.items()):
        # Non-reentrant checkpoint (the wrapper's default); no RNG state to preserve (no dropout).
        if mode == ActivationCheckpointing.FULL:
            wrapped = checkpoint_wrapper(block, preserve_rng_state=False)
        else:
            wrapped = checkpoint_wrapper(block, preserve_rng_state=False, context_fn=_selective_context)
        blocks[key] = wrapped


def apply_compile(blocks: nn.ModuleDict, mode: str = "default") -> None:
    """torch.compile each block in place (``Module.compile`` keeps FQNs; identical blocks share one graph).

    ``mode``: torch.compile's mode (tuning.COMPILE_MODES); "default" passes none.
    """
    for block in blocks.values():
        block.compile(fullgraph=True, mode=None if mode == "default" else mode)


def apply_fused_projections(model: Transformer) -> int:
    """Q/K/V and gate/up as one matmul each in every block whose Linears are the model's own (not float8
    or TE modules); the single-device path only, where each weight is cast (copied) at use anyway."""
    fused = 0
    for block in model.layers.modules():
        if isinstance(block, Attention):
            block.fuse = can_fuse(block.wq, block.wk, block.wv)
        elif isinstance(block, FeedForward):
            block.fuse = can_fuse(block.w1, block.w3)
        else:
            continue
        fused += block.fuse
    return fused


def apply_bf16_gradients(model: Transformer) -> int:
    """Keep the gradients of every matrix the single-device path casts to bf16 in bf16 (``grad_dtype``):
    the block Linears (each block then runs on copies cast before it, recast.call_cast), the embedding
    and the output head. The number of parameters changed; 0 where this torch has no ``grad_dtype``."""
    if not hasattr(torch.Tensor, "grad_dtype") or model.compute_dtype is None:
        return 0
    matrices: list[torch.Tensor] = [
        p for block in model.layers.values() for p in block.parameters() if p.dim() >= 2
    ]
    matrices.append(model.tok_embeddings.weight)
    if model.output is not None:
        matrices.append(model.output.weight)
    for param in matrices:
        param.grad_dtype = model.compute_dtype
    model.cast_blocks = True
    return len(matrices)


def fp32_weight_gradients_blocked(
    model: Transformer, activation_checkpointing: ActivationCheckpointing, *, bf16_gradients: bool
) -> str | None:
    """Why the block matrices' weight gradients cannot come from their GEMMs in fp32 here, or None."""
    if model.compute_dtype is None:
        return "the blocks compute in their parameters' own dtype"
    if bf16_gradients:
        return "bf16_gradients keeps them in bf16"
    if activation_checkpointing == ActivationCheckpointing.SELECTIVE:
        return "selective AC's policy does not see the matmul it would run"
    return None


def apply_fp32_weight_gradients(model: Transformer, *, keep: bool) -> int:
    """Every block's own Linear (not a float8 or TE replacement) takes its weight gradient in fp32 from its
    GEMM (model/wide_grad.py), keeping the bf16 copy for backward (``keep``) or its fp32 parameter. The
    number of Linears changed."""
    changed = 0
    for module in model.layers.modules():
        if type(module) is Linear and module.bias is None:
            module.wide_keep = keep
            changed += 1
    return changed


def apply_attention_backend(model: Transformer, backend: str) -> int:
    """Every block's causal attention with SDPA's kernels in ``backend``'s order (model.ordered_attention);
    context parallelism's own attention is left alone. The number of blocks changed."""
    changed = 0
    if backend == "default":
        return changed
    attend = ordered_attention(backend)
    for module in model.layers.modules():
        if isinstance(module, Attention) and module.attend is causal_attention:
            module.attend = attend
            changed += 1
    return changed


def _wide_weight_gradients(
    model: Transformer, ac: ActivationCheckpointing, device: torch.device, bf16_gradients: bool
) -> None:
    """``fp32_weight_gradients`` on the single-device path where it can act; one log line either way."""
    blocked = fp32_weight_gradients_blocked(model, ac, bf16_gradients=bf16_gradients)
    blocked = blocked or mixed_mm_available(device)
    if blocked:
        log.warning("fp32_weight_gradients off: %s; autograd casts the bf16 weight gradients", blocked)
        return
    # Where recast_blocks would free each block's bf16 copies after forward, the op saves the fp32
    # parameter instead and casts again in backward: the same memory, so it takes recast's place.
    keep = not model.recast_blocks
    model.recast_blocks = False
    changed = apply_fp32_weight_gradients(model, keep=keep)
    saved = "its bf16 copy" if keep else "its fp32 parameter, cast again in backward"
    log.info("fp32_weight_gradients: %d block matrices take fp32 gradients from their GEMMs, saving %s",
             changed, saved)  # fmt: skip


def validate_layout(candidate: Candidate, world_size: int, *, sequence_length: int | None = None) -> None:
    """Refuse a parallel layout that does not fit the job's processes (pure: no process group needed).

    Context parallelism (cp > 1) lies across the data-parallel layout: the cp consecutive ranks of a
    group hold parts of the same sequences, and FSDP shards and reduces over them like over any rank.
    """
    cp = candidate.context_parallel
    if world_size % cp:
        raise ParallelismError(
            f"chosen.contextParallel ({cp}) must divide the job's {world_size} processes; re-plan"
        )
    if sequence_length is not None and sequence_length % (2 * cp):
        raise ParallelismError(
            f"chosen.contextParallel ({cp}) needs a sequenceLength divisible by {2 * cp} (2 chunks per "
            f"rank), not {sequence_length}; re-plan"
        )
    if candidate.sharding == Sharding.HYBRID and candidate.shard_degree % cp:
        raise ParallelismError(
            f"chosen.contextParallel ({cp}) must divide chosen.shardDegree ({candidate.shard_degree}) with "
            "hybrid sharding (a cp group stays inside one shard group); re-plan"
        )
    if candidate.shard_degree * candidate.replicate_degree != world_size:
        raise ParallelismError(
            f"chosen.shardDegree ({candidate.shard_degree}) x chosen.replicateDegree "
            f"({candidate.replicate_degree}) must equal the job's {world_size} processes; re-plan"
        )
    if candidate.sharding == Sharding.FULL and candidate.replicate_degree != 1:
        raise ParallelismError("chosen.sharding 'full' needs chosen.replicateDegree 1; re-plan")
    if candidate.sharding == Sharding.NONE and candidate.shard_degree != 1:
        raise ParallelismError("chosen.sharding 'none' needs chosen.shardDegree 1; re-plan")


def build_mesh(candidate: Candidate, world_size: int, device_type: str) -> DeviceMesh:
    """The data-parallel mesh: 1-D for full shard, 2-D (replicate, shard) for hybrid and none."""
    validate_layout(candidate, world_size)
    if candidate.sharding == Sharding.FULL:
        return init_device_mesh(device_type, (world_size,), mesh_dim_names=("dp_shard",))
    return init_device_mesh(
        device_type,
        (candidate.replicate_degree, candidate.shard_degree),
        mesh_dim_names=("dp_replicate", "dp_shard"),
    )


def apply_fsdp(
    model: Transformer,
    mesh: DeviceMesh,
    *,
    param_dtype: torch.dtype = torch.bfloat16,
    reduce_dtype: torch.dtype = torch.float32,
    reshard_after_forward: bool = True,
) -> None:
    """FSDP2 per block and at the root: bf16 compute copies, fp32 gradient reduction, fp32 master weights.

    With a 2-D mesh FSDP2 shards over "dp_shard" and replicates over "dp_replicate" (HSDP; a shard
    dimension of 1 is plain replication).
    """
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    keys = list(model.layers.keys())
    for i, key in enumerate(keys):
        # The last block's parameters are needed again as soon as the backward starts: keep them gathered.
        reshard = reshard_after_forward and i < len(keys) - 1
        fully_shard(model.layers[key], mesh=mesh, mp_policy=mp, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=False)


def _should_reshard(
    model: Transformer,
    mesh: DeviceMesh | None,
    device: torch.device,
    gpu_memory_bytes: int | None = None,
) -> bool:
    """Free each block's gathered bf16 weights after forward, unless `keeps_gathered_weights` says keep.

    Decided on the plan's GPU memory when given (the figure the planner decided on, so both agree at the
    boundary), else on what CUDA reports.
    """
    if device.type != "cuda":
        return True
    total = gpu_memory_bytes or torch.cuda.get_device_properties(device).total_memory
    shard = 1 if mesh is None else mesh.size(-1)
    return not keeps_gathered_weights(model.arch.parameter_count(), shard, total)


def parallelize(
    model: Transformer,
    candidate: Candidate,
    mesh: DeviceMesh | None,
    *,
    device: torch.device,
    amax_group: Any = None,
    seed: int = 0,
    gpu_memory_bytes: int | None = None,
    compute_dtype: torch.dtype | None = None,
    compile_mode: str = "default",
    fp8_pow2_scales: bool = False,
    fp8_all_gather: bool = False,
    fp8_skip_small: bool = False,
    fuse_projections: bool = False,
    recast_blocks: bool = False,
    bf16_gradients: bool = False,
    fp32_weight_gradients: bool = False,
    attention: str = "default",
) -> PrecisionSetup:
    """Apply every technique in ONE fixed order, then materialise and initialise the weights.

    ``mesh`` None: the single-device path. Nothing is sharded or wrapped: the module keeps fp32
    parameters (what the optimizer steps and checkpoints hold, as FSDP2's shards are) and computes in
    ``compute_dtype`` by casting each weight at use (model.Linear, RMSNorm, the embedding), which is what
    FSDP2's mixed precision does on one rank without its per-block all-gather and reduce-scatter copies,
    their buffers and hooks. ``compute_dtype``: bf16 on GPUs, fp32 on CPU unless given (tests).
    ``fp8_all_gather``: FSDP2 all-gathers the torchao tensorwise weights as float8 (needs a mesh).
    ``bf16_gradients``: the single-device path keeps the matrices' gradients in bf16 where it computes
    in bf16 without AC (apply_bf16_gradients; the caller has checked accumulation and clipping).
    ``fp32_weight_gradients``: the single-device path's block Linears take their weight gradients in fp32
    from their GEMMs (apply_fp32_weight_gradients), unless ``fp32_weight_gradients_blocked`` says why not.

    1. precision: swaps nn.Linear for TE / torchao float8 modules. Module swaps go first so that the
       wrappers below wrap the final modules (torchtitan applies its float8 converter before anything).
    2. activation checkpointing: wraps each block (op-level selective policy or whole block).
    3. torch.compile per block: after AC so the compiled graph contains the recompute decisions (the
       checkpoint becomes part of the traced graph), before FSDP so FSDP's hooks stay outside the graph.
    4. FSDP2: last, so it shards the final parameters (float8 / TE weights included) and wraps the
       compiled blocks.
    5. init: ``to_empty`` gives the meta tensors (now DTensor shards) storage; ``init_weights`` fills them.
    """
    if fp8_all_gather and mesh is None:
        raise ParallelismError("FSDP2's float8 all-gather needs FSDP2; the single-device path has no gather")
    setup = apply_precision(
        model,
        candidate,
        blocks=model.layers,
        amax_group=amax_group,
        pow2_scales=fp8_pow2_scales,
        fp8_all_gather=fp8_all_gather,
        skip_small=fp8_skip_small,
    )
    apply_attention_backend(model, attention)  # before compile: the blocks trace the kernel order
    apply_ac(model.layers, candidate.activation_checkpointing, te=setup.backend == "te")
    if candidate.compile and setup.compile_ok:
        apply_compile(model.layers, compile_mode)
    elif candidate.compile:
        log.warning("compile skipped: %s modules do not trace under torch.compile", setup.backend)
    # BF16 compute on GPUs; fp32 on CPU, where the gloo tests run and bf16 brings nothing but noise.
    dtype = compute_dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
    if mesh is not None:
        apply_fsdp(
            model,
            mesh,
            param_dtype=dtype,
            reshard_after_forward=_should_reshard(model, mesh, device, gpu_memory_bytes),
        )
        if fp32_weight_gradients:
            log.warning("fp32_weight_gradients off: FSDP2 hands the blocks bf16 copies of its own")
    else:
        if dtype != torch.float32:
            model.compute_dtype = dtype
        if fuse_projections:
            apply_fused_projections(model)
        # Without AC the compiled blocks would keep every bf16 copy until backward: free them after each
        # block's forward where FSDP2 would reshard (too little room beside the rest), or when asked.
        # Not under AC: it recomputes the casts anyway, and its recompute would run the block on the
        # fp32 parameters the swap has restored.
        free = recast_blocks or (
            device.type == "cuda" and _should_reshard(model, None, device, gpu_memory_bytes)
        )
        none = candidate.activation_checkpointing == ActivationCheckpointing.NONE
        model.recast_blocks = free and none and model.compute_dtype is not None
        # Not under AC: the recompute runs after functional_call has put the fp32 parameters back.
        if bf16_gradients and not none:
            log.warning("bf16_gradients off: AC recomputes on the fp32 parameters; the gradients stay fp32")
        bf16_gradients = bf16_gradients and none
        if fp32_weight_gradients:
            _wide_weight_gradients(model, candidate.activation_checkpointing, device, bf16_gradients)
    model.to_empty(device=device)
    # Same seed on every rank: DTensor's RNG tracker then gives each shard its slice of one global init.
    torch.manual_seed(seed)
    model.init_weights(buffer_device=device)
    # After to_empty, which may give the parameters new tensors.
    if mesh is None and bf16_gradients:
        kept = apply_bf16_gradients(model)
        if kept:
            log.info("bf16_gradients: %d matrices keep their gradients in bf16", kept)
            if setup.backend == "torchao" and not model.recast_blocks:
                # torchao's float8 matmul saves the weight it was handed for backward: here the bf16 copy,
                # 2 more bytes a block parameter. recast_blocks would keep the parameters instead, but on one
                # H100 it cost 7.5% at 3B FP8 batch 2 for 1.5 GiB (docs/benchmarks/titan_h100.md): the
                # user's choice, not forced.
                log.info("bf16_gradients with torchao float8: the blocks' bf16 copies are kept for backward")
        else:
            log.warning("bf16_gradients off: fp32 compute, or a torch without Tensor.grad_dtype")
    return setup
