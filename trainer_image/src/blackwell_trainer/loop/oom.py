"""A CUDA out-of-memory error as a structured result: where, what was measured, what was planned."""

from __future__ import annotations

import re

import torch

from blackwell_trainer.plan.config import OomPhase, OomResult, Plan
from blackwell_trainer.plan.units import GIB, KIB, MIB, TIB

# PyTorch's caching allocator words its error (c10/cuda/CUDACachingAllocator.cpp) as "CUDA out of memory.
# Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 139.81 GiB of which 1.23 GiB is free.
# Including non-PyTorch memory, this process has 138.57 GiB memory in use. Of the allocated memory 135.20
# GiB is allocated by PyTorch, and 2.10 GiB is reserved by PyTorch but unallocated. ..."
_SIZE = r"([0-9]+(?:\.[0-9]+)?) ?(B|bytes|KiB|MiB|GiB|TiB)"
_UNITS = {"B": 1, "bytes": 1, "KiB": KIB, "MiB": MIB, "GiB": GIB, "TiB": TIB}
_REQUESTED = re.compile(r"Tried to allocate " + _SIZE)
_TOTAL = re.compile(r"total capacity of " + _SIZE)
_IN_USE = re.compile(r"this process has " + _SIZE + " memory in use")
_BY_PYTORCH = re.compile(_SIZE + r" is allocated by PyTorch, and " + _SIZE + " is reserved by PyTorch")


def _bytes(number: str, unit: str) -> int:
    return round(float(number) * _UNITS[unit])


def parse_message(text: str) -> dict[str, int]:
    """The sizes an allocator OOM message names (requested, total, in use, reserved), those it has."""
    found: dict[str, int] = {}
    for key, pattern in (("requested", _REQUESTED), ("total", _TOTAL), ("in_use", _IN_USE)):
        match = pattern.search(text)
        if match:
            found[key] = _bytes(*match.groups())
    match = _BY_PYTORCH.search(text)
    if match:
        allocated, unallocated = _bytes(*match.groups()[:2]), _bytes(*match.groups()[2:])
        found["reserved"] = allocated + unallocated
    return found


class PhaseTracker:
    """Which phase of which step the trainer is in, so that an OOM can say where it happened."""

    def __init__(self) -> None:
        self.phase = OomPhase.SETUP
        self.step = 0
        self.compiling = False

    def mark(self, phase: OomPhase, step: int, *, compiling: bool = False) -> None:
        """The trainer enters `phase` of `step` (1 = the first)."""
        self.phase, self.step, self.compiling = phase, step, compiling


def oom_result(
    err: torch.OutOfMemoryError, tracker: PhaseTracker, plan: Plan, device: torch.device, rank: int
) -> OomResult:
    """The structured result of `err`, with the allocator's figures read now (before anything is freed)."""
    sizes = parse_message(str(err))
    allocated = peak_allocated = peak_reserved = 0
    total = sizes.get("total")
    if device.type == "cuda":
        stats = torch.cuda.memory_stats(device)
        allocated = int(stats.get("allocated_bytes.all.current", 0))
        peak_allocated = int(stats.get("allocated_bytes.all.peak", 0))
        peak_reserved = int(stats.get("reserved_bytes.all.peak", 0))
        total = total or int(torch.cuda.get_device_properties(device).total_memory)
    non_pytorch = None
    if "in_use" in sizes and "reserved" in sizes:
        non_pytorch = max(sizes["in_use"] - sizes["reserved"], 0)
    return OomResult(
        phase=tracker.phase,
        step=tracker.step,
        compiling=tracker.compiling,
        rank=rank,
        requested_bytes=sizes.get("requested"),
        allocated_bytes=allocated,
        peak_allocated_bytes=peak_allocated,
        peak_reserved_bytes=max(peak_reserved, sizes.get("reserved", 0)),
        non_pytorch_bytes=non_pytorch,
        gpu_total_bytes=total,
        predicted_peak_reserved_bytes=plan.predicted.memory.peak_reserved,
        candidate=plan.chosen.model_copy(deep=True),
    )


class GpuOutOfMemory(RuntimeError):
    """The GPU ran out of memory: a permanent error for this plan (the same plan runs out again)."""

    def __init__(self, result: OomResult, *, earlier: bool = False) -> None:
        self.result = result
        asked = ""
        if result.requested_bytes:
            asked = f"tried to allocate {result.requested_bytes / GIB:.2f} GiB, "
        first = " (the first step, with torch.compile)" if result.compiling else ""
        where = f"in {result.phase.value} of step {result.step}"
        if result.phase is OomPhase.SETUP:
            where = "during setup"
        again = (
            "not run again: an earlier start of this pod ran out of memory with this plan, "
            if earlier
            else ""
        )
        super().__init__(
            f"{again}CUDA out of memory {where}{first} on rank {result.rank}: {asked}"
            f"{result.needed_bytes / GIB:.1f} GiB needed at least, the plan predicted a "
            f"{result.predicted_peak_reserved_bytes / GIB:.1f} GiB peak; a restart with this plan runs out "
            "again. The operator re-plans with less memory; by hand: a smaller spec.tuning.microBatchSize "
            "or a larger spec.tuning.memoryHeadroom"
        )


def earlier_result(text: str | None, plan: Plan) -> OomResult | None:
    """The OOM result in an earlier termination message of this pod, if it is this very plan's.

    torchrun restarts its workers in place (spec.maxRetries) with the same plan; the termination file
    outlives them, so a plan that ran out is refused at once instead of being built and run out again.
    """
    result = OomResult.find(text)
    if result is None or result.candidate != plan.chosen:
        return None
    return result if result.predicted_peak_reserved_bytes == plan.predicted.memory.peak_reserved else None
