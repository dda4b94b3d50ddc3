"""Step-time model: GEMMs by precision and shape, attention, recompute, memory-bound work, comms."""

from __future__ import annotations

from dataclasses import dataclass, field

from blackwell_operator.calibration import Calibration, RecipeConstants, ThroughputConstants
from blackwell_operator.planner.layout import Hardware, Layout, Setting
from blackwell_operator.planner.memory import single_device_path, tokens_per_gpu, trainer_keeps_weights
from blackwell_operator.planner.shapes import Shapes
from blackwell_trainer.plan.config import ActivationCheckpointing, Precision, PrecisionRecipe

AC = ActivationCheckpointing


@dataclass(frozen=True)
class TimeEstimate:
    """Predicted step time and throughput per GPU."""

    step_time_seconds: float
    tokens_per_second_per_gpu: float
    model_flops_utilization: float
    breakdown: dict[str, float] = field(default_factory=dict)


def linear_time(
    tokens: int, k: int, n: int, rc: RecipeConstants, peak: float, bandwidth: float
) -> tuple[float, float]:
    """GPU seconds of one linear's forward and backward (3 GEMMs), and the forward share.

    FLOPs over the format's peak times the recipe's efficiency, plus a fixed cost per GEMM and the
    memory-bound casting/scaling traffic: small GEMMs gain little or lose from low precision. The forward
    pays ``forward_cast_share`` of the casts (what full AC's recompute pays again).
    """
    flops = 2.0 * tokens * k * n
    cast = rc.quant_bytes_per_element * (tokens * k + k * n + tokens * n) / bandwidth
    one = flops / (peak * rc.efficiency) + rc.gemm_overhead_seconds
    return 3.0 * one + cast, one + cast * rc.forward_cast_share


def _collective_seconds(payload: float, group: int, bandwidth: float) -> float:
    """Ring all-gather / reduce-scatter time of `payload` bytes (the full, unsharded size) over `group`."""
    if group <= 1:
        return 0.0
    return payload * (group - 1) / group / bandwidth


def _exposed(comm: float, compute: float, t: ThroughputConstants) -> float:
    """Collective seconds the step still pays beside `compute` seconds it overlaps with."""
    return max(comm - t.comm_overlap * compute, t.comm_interference * comm, 0.0)


def estimate_time(
    shapes: Shapes,
    cal: Calibration,
    hw: Hardware,
    setting: Setting,
    layout: Layout,
    sequence_length: int,
    gradient_accumulation_steps: int = 1,
    *,
    document_mask: bool = False,
) -> TimeEstimate:
    """Predict one optimizer step of a setting (`document_mask`: packed chat rows, FlexAttention)."""
    t = cal.throughput
    gpu = hw.gpu
    bandwidth = gpu.hbm_bandwidth * t.memory_bandwidth_efficiency
    tokens = tokens_per_gpu(setting, sequence_length)
    rc = cal.recipe(gpu.major, setting.recipe)
    rc_bf16 = cal.recipe(gpu.major, PrecisionRecipe.NONE)
    peak = gpu.peak_for(setting.precision)
    peak_bf16 = gpu.peak_for(Precision.BF16)

    gemm_block = gemm_block_fwd = 0.0
    # Recipes that keep some blocks in BF16 for accuracy (NVFP4: the last ~15%) mix the two speeds.
    mix = rc.bf16_layer_fraction
    for k, n in shapes.linears:
        total, fwd = linear_time(tokens, k, n, rc, peak, bandwidth)
        if mix:
            hi_total, hi_fwd = linear_time(tokens, k, n, rc_bf16, peak_bf16, bandwidth)
            total, fwd = (1 - mix) * total + mix * hi_total, (1 - mix) * fwd + mix * hi_fwd
        gemm_block += total
        gemm_block_fwd += fwd
    # The output head stays in BF16 (as in torchtitan/TE practice); it runs once per micro-batch.
    head, _ = linear_time(tokens, shapes.hidden, shapes.vocab, rc_bf16, peak_bf16, bandwidth)

    # Flash attention, causal: forward 2*s^2*q_dim per sequence, backward 2.5x the forward.
    # Short rows (or short CP chunks) run flash attention below its large-sequence efficiency.
    seqs = setting.micro_batch_size / setting.context_parallel
    chunk = sequence_length / setting.context_parallel
    attn_eff = t.attention_efficiency * chunk / (chunk + t.attention_short_sequence_tokens)
    if document_mask:
        # FlexAttention with a block mask instead of the dense causal kernel; the FLOPs are counted as a
        # full causal row (conversations filling it), which the mask's skipped blocks only lower.
        attn_eff *= t.document_mask_attention_factor
    attn_fwd = 2.0 * seqs * sequence_length * sequence_length * shapes.q_dim / (peak_bf16 * attn_eff)
    if setting.context_parallel > 1:
        # Ring attention runs cp smaller kernels per layer and balances causal work imperfectly.
        cp = setting.context_parallel
        attn_fwd *= 1.0 + t.cp_attention_overhead * (cp - 1) / cp
    attn_block = 3.5 * attn_fwd

    # A recipe the trainer runs eager (TE modules are not compiled) loses the compile fusion even when the
    # candidate asks for compile; a calibration fitted to an eager trainer has no fusion to lose.
    compiled = cal.trainer.compiles(setting.recipe, setting.compile)
    eager = 1.0 if compiled or not cal.trainer.compile else t.eager_elementwise_factor
    elementwise = (
        eager * tokens * (t.elementwise_bytes_hidden * shapes.hidden + t.elementwise_bytes_ffn * shapes.ffn)
    )
    elementwise_block = elementwise / bandwidth
    loss = tokens * shapes.vocab * t.loss_traffic_bytes_per_logit / bandwidth

    # Selective AC measured as AC none under some recipes (trainer.selective_recomputes_nothing).
    mode = cal.trainer.modelled_checkpointing(setting.activation_checkpointing, setting.recipe)
    # Selective AC keeps the matmul outputs the op-level policy can see; a recipe whose GEMMs it cannot see
    # (TE) has them all recomputed, the attention outputs still kept.
    unsaved = setting.recipe in cal.trainer.selective_recomputes_gemms
    selective_gemm = 1.0 if unsaved else t.selective_recompute_gemm_fraction
    if mode is AC.FULL:
        recompute_block = t.full_recompute_share * (
            gemm_block_fwd + attn_fwd + t.elementwise_forward_fraction * elementwise_block
        )
    elif mode is AC.SELECTIVE:
        recompute_block = (
            selective_gemm * gemm_block_fwd
            + t.selective_recompute_elementwise_fraction * t.elementwise_forward_fraction * elementwise_block
        )
    else:
        recompute_block = 0.0

    layers = shapes.layers
    gemm = layers * gemm_block + head
    attention = layers * attn_block
    memory_bound = layers * elementwise_block + loss
    recompute = layers * recompute_block
    gpu_micro = gemm + attention + memory_bound + recompute
    # Host time to issue the work; the GPU waits when it is larger (small shapes, eager, TE modules).
    linears = len(shapes.linears)
    cpu_layer = linears * rc.cpu_seconds_per_linear + t.cpu_seconds_per_layer
    reissued = mode is AC.FULL or (mode is AC.SELECTIVE and unsaved)
    cpu_micro = layers * cpu_layer * (1.5 if reissued else 1.0)
    host_stall = max(0.0, cpu_micro - gpu_micro)

    # FSDP2 per micro-batch: all-gather bf16 params in forward and again in backward, reduce-scatter fp32
    # grads; HSDP/replicas all-reduce across nodes. Overlaps with compute except the first gather.
    comm_bw_shard = hw.gpu.nvlink_bandwidth if layout.shard_within_node else hw.efa_bandwidth_per_gpu
    comm_bw_shard *= t.nccl_bus_efficiency
    psi = shapes.total_params
    gather = 2.0 * _collective_seconds(2.0 * psi, layout.shard_degree, comm_bw_shard)
    scatter = _collective_seconds(4.0 * psi, layout.shard_degree, comm_bw_shard)
    replica_bw = hw.gpu.nvlink_bandwidth if layout.replicate_within_node else hw.efa_bandwidth_per_gpu
    replica_bw *= t.nccl_bus_efficiency
    allreduce = 2.0 * _collective_seconds(
        4.0 * psi / layout.shard_degree, layout.replicate_degree, replica_bw
    )
    fsdp_comm = gather + scatter + allreduce
    first_gather = gather / 2.0 / max(layers, 1)
    # Overlap hides a collective's latency, not its cost: its kernels share the SMs and HBM with the
    # compute beside them, so at least comm_interference of it shows in the step (two H200s: 13B loses
    # about 0.05 s per step at every micro-batch size, which compute-bound overlap alone cannot explain).
    exposed_fsdp = _exposed(fsdp_comm, gpu_micro, t) + first_gather

    # Ring context parallelism passes K/V chunks (and dK/dV in backward) around the cp ranks per layer.
    exposed_cp = 0.0
    if setting.context_parallel > 1:
        cp = setting.context_parallel
        kv_bytes = 3.0 * (cp - 1) * tokens * shapes.kv_dim * 2 * 2
        cp_bw = hw.gpu.nvlink_bandwidth if cp <= hw.gpus_per_node else hw.efa_bandwidth_per_gpu
        cp_comm = layers * kv_bytes / (cp_bw * t.nccl_bus_efficiency)
        exposed_cp = _exposed(cp_comm, attention, t)

    # Weights resharded after forward are cast and split again in backward; a trainer that keeps them on one
    # roomy GPU (the same rule the memory model counts) copies them once.
    kept = trainer_keeps_weights(cal, psi, layout.shard_degree, gpu.memory_bytes)
    copy_bytes = t.fsdp_copy_bytes_per_param + (0.0 if kept else t.fsdp_regather_bytes_per_param)
    if single_device_path(cal, layout, setting.recipe):  # no FSDP2: a cast each way, nothing gathered
        copy_bytes = t.single_device_cast_bytes_per_param
    fsdp_copies = copy_bytes * psi / bandwidth
    micro = gpu_micro + host_stall + exposed_fsdp + exposed_cp + fsdp_copies
    optimizer = t.optimizer_bytes_per_param * psi / layout.shard_degree / bandwidth
    ga = gradient_accumulation_steps
    # Every micro-batch after the first adds its gradients into the held ones: a pass over this rank's
    # gradients that one micro-batch a step never pays (on one H100, 3B FP8 at micro-batch 2 gained 1.8%
    # from 4 accumulated where a per-step cost alone would give 12%).
    accumulate = (ga - 1) * t.gradient_accumulation_bytes_per_param * psi / layout.shard_degree / bandwidth
    step = ga * micro + accumulate + optimizer + t.step_overhead_seconds
    step_tokens = ga * tokens
    tps = step_tokens / step
    mfu = tps * shapes.model_flops_per_token(sequence_length) / peak_bf16
    breakdown = {
        "gemm": ga * gemm,
        "attention": ga * attention,
        "memory_bound": ga * memory_bound,
        "recompute": ga * recompute,
        "host_stall": ga * host_stall,
        "fsdp_copies": ga * fsdp_copies,
        "fsdp_comm_exposed": ga * exposed_fsdp,
        "cp_comm_exposed": ga * exposed_cp,
        "gradient_accumulation": accumulate,
        "optimizer": optimizer,
        "step_overhead": t.step_overhead_seconds,
    }
    return TimeEstimate(step, tps, mfu, breakdown)
