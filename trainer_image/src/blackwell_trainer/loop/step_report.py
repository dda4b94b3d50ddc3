"""What one step did, as metrics, rank 0's log line and a warning when the GPU was full."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import torch

from blackwell_trainer.parallel.runtime import Runtime
from blackwell_trainer.plan.config import Plan
from blackwell_trainer.plan.units import GIB

if TYPE_CHECKING:  # the exporter is imported where run() needs it, not at start-up
    from blackwell_trainer.loop.metrics import TrainerMetrics

# The step lines are the training loop's: they keep its logger name, which log queries match.
log = logging.getLogger("blackwell_trainer")


@dataclass
class StepResult:
    """What one optimizer step did on this rank."""

    loss: float
    seconds: float
    tokens: int  # tokens this rank processed
    mfu: float


class AllocatorStats(NamedTuple):
    """What the CUDA caching allocator reports since start (zeros off CUDA)."""

    peak_allocated: int
    peak_reserved: int
    # Frees-and-retries because the GPU was full: the run reached the GPU's capacity.
    retries: int


def allocator_stats(device: torch.device) -> AllocatorStats:
    """Peaks and retries from one memory_stats() read (max_memory_allocated and co. each read it again)."""
    if device.type != "cuda":
        return AllocatorStats(0, 0, 0)
    stats = torch.cuda.memory_stats(device)
    return AllocatorStats(
        int(stats.get("allocated_bytes.all.peak", 0)),
        int(stats.get("reserved_bytes.all.peak", 0)),
        int(stats.get("num_alloc_retries", 0)),
    )


def warn_at_capacity(retries: int, warned: int, step: int) -> int:
    """Log (once per new burst) that the GPU was full; returns the count already warned about."""
    if retries > warned:
        # Measured on H200 (docs/calibration/README.md): runs at the cap lost up to 36% of their speed.
        log.warning(
            "step %d: the GPU was full %d time(s) so far (the CUDA caching allocator freed its cache and "
            "retried); steps at the GPU's capacity run slowly. Re-plan with a smaller micro-batch or a "
            "larger spec.tuning.memoryHeadroom.",
            step,
            retries,
        )
        return retries
    return warned


class StepReport:
    """Each step's metrics, rank 0's line every plan.logEverySteps, and a warning when the GPU was full."""

    def __init__(self, plan: Plan, runtime: Runtime, metrics: TrainerMetrics) -> None:
        self.plan, self.runtime, self.metrics = plan, runtime, metrics
        self.retries_warned = 0

    def step(self, step: int, result: StepResult, *, lr: float) -> None:
        allocated, reserved, retries = allocator_stats(self.runtime.device)
        self.metrics.record_step(
            tokens=result.tokens,
            step_seconds=result.seconds,
            loss=result.loss,
            mfu=result.mfu,
            peak_allocated_bytes=allocated,
            peak_reserved_bytes=reserved,
            alloc_retries=retries,
            step=step,
        )
        if self.runtime.rank != 0:
            return
        self.retries_warned = warn_at_capacity(retries, self.retries_warned, step)
        if step % self.plan.log_every_steps == 0 or step == self.plan.steps:
            log.info(
                "step %d/%d loss %.4f lr %.3g tokens/s/gpu %.0f mfu %.1f%% step %.3fs "
                "peak allocated %.1f GiB reserved %.1f GiB",
                step,
                self.plan.steps,
                result.loss,
                lr,
                result.tokens / result.seconds,
                100 * result.mfu,
                result.seconds,
                allocated / GIB,
                reserved / GIB,
            )
