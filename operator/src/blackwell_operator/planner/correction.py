"""The memory correction an out-of-memory run teaches the planner: learned from its result, then applied."""

from __future__ import annotations

from blackwell_operator.calibration import Calibration
from blackwell_operator.models.status import MemoryCorrection
from blackwell_operator.units import GIB
from blackwell_trainer.plan.config import Candidate, OomPhase, OomResult, Plan

# The correction covers the measured overshoot and this much more: the measurement is a lower bound (the
# run stopped at the first allocation that failed, not at its real peak).
MARGIN = 0.25
# The overshoot is at least this share of the GPU, and at least the allocation that failed: an OOM where
# the process held less than the plan predicted (memory taken outside it, fragmentation) still means the
# plan needs less.
MIN_OVERSHOOT_FRACTION = 0.02
# The MemoryConstants that scale with the tokens a GPU holds: saved activations, the loss transient and
# (through the act_* per-layer bytes) a recomputed block. Scaling them scales the whole dynamic part.
ACTIVATION_CONSTANTS = (
    "act_hidden",
    "act_q",
    "act_kv",
    "act_ffn",
    "act_heads",
    "selective_hidden",
    "selective_q",
    "selective_kv",
    "selective_ffn",
    "selective_heads",
    "full_hidden",
    "outside_layers_hidden",
    "loss_bytes_per_logit",
    "chunked_loss_bytes_per_logit",
)


def overshoot_bytes(result: OomResult, failed: Plan) -> int:
    """How far the run's need went past the plan's prediction, at least the failed request (or a floor)."""
    floor = max(result.requested_bytes or 0, round(MIN_OVERSHOOT_FRACTION * failed.gpu.memory_bytes))
    return max(result.needed_bytes - failed.predicted.memory.peak_reserved, floor)


def learn(
    current: MemoryCorrection | None, result: OomResult, failed: Plan, *, generation: int
) -> MemoryCorrection:
    """The correction after `failed` ran out of memory as `result` says, on top of `current` (if the same
    spec generation).

    The rule: the failed plan's prediction must rise by the overshoot plus MARGIN. An OOM in forward or
    backward lies in the part that grows with the micro-batch, so the activation bytes are scaled by what
    that takes (then a smaller micro-batch, more recomputation or more sharding fits); one in setup or
    the optimizer step is in the static part, which is raised by a reserve. A GPU that has less memory than
    the catalog says adds the difference to the reserve. The failed configuration is excluded outright.
    """
    base = current if current is not None and current.generation == generation else None
    scale = base.activation_scale if base else 1.0
    reserve = base.reserve_bytes if base else 0
    excluded = list(base.excluded) if base else []
    extra = (1.0 + MARGIN) * overshoot_bytes(result, failed)
    memory = failed.predicted.memory
    dynamic = memory.activations + memory.loss
    if result.phase in (OomPhase.FORWARD, OomPhase.BACKWARD) and dynamic > 0:
        scale *= 1.0 + extra / dynamic
    else:
        reserve += round(extra)
    if result.gpu_total_bytes is not None and result.gpu_total_bytes < failed.gpu.memory_bytes:
        reserve += failed.gpu.memory_bytes - result.gpu_total_bytes
    if result.candidate not in excluded:
        excluded.append(result.candidate)
    return MemoryCorrection(
        generation=generation,
        activation_scale=round(scale, 4),
        reserve_bytes=reserve,
        excluded=excluded,
        replans=(base.replans if base else 0) + 1,
    )


def corrected_calibration(cal: Calibration, correction: MemoryCorrection) -> Calibration:
    """`cal` with the activation constants scaled and the reserve added outside the allocator."""
    m = cal.memory
    scale = correction.activation_scale
    update: dict[str, object] = {name: getattr(m, name) * scale for name in ACTIVATION_CONSTANTS}
    update["precision_activation_saving"] = {k: v * scale for k, v in m.precision_activation_saving.items()}
    update["cuda_context_bytes"] = m.cuda_context_bytes + correction.reserve_bytes
    return cal.model_copy(update={"memory": m.model_copy(update=update)})


def family_key(candidate: Candidate) -> tuple[str, str, str, str, int]:
    """The search's family of a candidate (planner.layout.Setting.family): all but the micro-batch."""
    return (
        candidate.precision.value,
        candidate.precision_recipe.value,
        candidate.activation_checkpointing.value,
        candidate.sharding.value,
        candidate.context_parallel,
    )


def micro_batch_limits(correction: MemoryCorrection) -> dict[tuple[str, str, str, str, int], int]:
    """Per family, the largest micro-batch still allowed: below the smallest one that ran out of memory."""
    limits: dict[tuple[str, str, str, str, int], int] = {}
    for candidate in correction.excluded:
        key = family_key(candidate)
        limits[key] = min(limits.get(key, candidate.micro_batch_size), candidate.micro_batch_size)
    return {key: mbs - 1 for key, mbs in limits.items()}


def describe_correction(correction: MemoryCorrection) -> str:
    """One line for the plan's explanation."""
    parts = []
    if correction.activation_scale > 1.0:
        parts.append(f"activations x{correction.activation_scale:.2f}")
    if correction.reserve_bytes:
        parts.append(f"{correction.reserve_bytes / GIB:.1f} GiB reserved")
    shown = ", ".join(
        f"{c.precision.value}/{c.activation_checkpointing.value}/{c.sharding.value} micro-batch "
        f"{c.micro_batch_size}"
        for c in correction.excluded
    )
    runs = "run" if correction.replans == 1 else "runs"
    return (
        f"memory corrected after {correction.replans} out-of-memory {runs} on this job: "
        f"{', '.join(parts) or 'no change'}; excluded (and larger micro-batches of each): {shown}"
    )
