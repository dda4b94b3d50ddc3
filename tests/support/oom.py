"""The trainer's termination message for an out-of-memory stop, made for tests (torch-free)."""

from __future__ import annotations

from blackwell_operator.units import GIB
from blackwell_trainer.plan.config import PERMANENT_ERROR_PREFIX, OomPhase, OomResult, Plan


def oom_message(plan: Plan, *, over: int = 6 * GIB, step: int = 3) -> str:
    """What the trainer writes when `plan` needed `over` bytes more than predicted in backward."""
    peak = plan.predicted.memory.peak_reserved + over - GIB
    result = OomResult(
        phase=OomPhase.BACKWARD,
        step=step,
        requested_bytes=GIB,
        allocated_bytes=peak,
        peak_allocated_bytes=peak,
        peak_reserved_bytes=peak,
        gpu_total_bytes=plan.gpu.memory_bytes,
        predicted_peak_reserved_bytes=plan.predicted.memory.peak_reserved,
        candidate=plan.chosen,
    )
    first = f"{PERMANENT_ERROR_PREFIX}CUDA out of memory in backward of step {step} on rank 0: ..."
    return f"{first}\n{result.to_line()}"
