"""The memory factor a GPU type learns on the user's cluster: measured peaks, and out-of-memory floors.

The model's peak reserved memory is corrected per GPU type (instance type) and namespace, over every
recipe family: what the model gets wrong on a GPU it was not fitted on (the CUDA context, library
workspaces, the allocator's rounding and caching) belongs to the GPU and its software, not to one family.

The rule (docs/cluster-calibration.md, "Memory: learned per GPU type"):

- A reading is one configuration measured by one job: each candidate a probe measured (its fullest rank's
  peak reserved), and a running job's steady reading. A probe that measured three candidates gives three
  readings: each is a separate point of the memory model (another micro-batch, AC mode or recipe), and a
  peak reserved is what the allocator did for that configuration, not a rate that a slow node or a noisy
  neighbour moves, so one probe needs no other job beside it. The same configuration of the same job is
  one reading (the running job's reading replaces its probe's).
- The factor is the largest reading, clamped to MEMORY_BOUNDS, once there are MIN_READINGS. The largest,
  not the median: a plan packed tighter than any configuration measured here would run out of memory,
  while one too loose costs at most a micro-batch step; and a reading read too low can never lower the
  model on its own (it takes another, higher one to apply anything, and then the higher one counts).
- An out-of-memory run of a configuration is a lower bound: its true peak was above what the GPU has, so
  the factor is never below the one that makes that configuration's corrected peak exceed the card (then
  it fits no budget). That floor stops at MEMORY_BOUNDS' top: a configuration far below the card that
  still ran out (memory taken outside the job, a faulty GPU) says nothing of the model, and the job's own
  re-plan (status.memoryCorrection) deals with it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from pydantic import Field

from blackwell_trainer.plan.config import WireModel

# Never trust much less than modelled (the 0.9 stops a plan packed 10% tighter than the model), allow
# up to 30% more (the fragmentation of a driver or allocator version the grid did not see).
MEMORY_BOUNDS = (0.9, 1.3)
# Readings a GPU type needs before its memory is corrected: one misreading alone never moves a plan.
MIN_READINGS = 2
# What a reading can physically be: below a tenth of the model is a misreading; above MAX_RATIO too.
MIN_MEMORY_RATIO = 0.1
MAX_RATIO = 10.0
# Ratios are stored with this many decimals; a floor is rounded up past its bound (strictly above it).
DECIMALS = 4


class MemorySource(StrEnum):
    """Where a memory reading came from."""

    PROBE = "probe"
    OUT_OF_MEMORY = "outOfMemory"


class MemoryReading(WireModel):
    """One configuration's measured (or, after an out-of-memory run, least) peak over the modelled one,
    beside the running jobs' samples (whose memory ratios are readings too)."""

    job: str = Field(description="namespace/name of the BlackwellTrainingJob.")
    uid: str = Field(
        description="One reading per key: `<BTJ uid>/peak-<candidate>` for a probe's candidate, "
        "`<BTJ uid>/oom-<configuration>` for an out-of-memory run."
    )
    instance_type: str
    source: MemorySource
    ratio: float = Field(
        gt=0,
        description="Measured over modelled peak reserved; for an out-of-memory run, the least the ratio "
        "can have been (the card's memory over the modelled peak).",
    )
    configuration: str = Field(default="", description="The configuration, in a few words.")
    observed_at: str = Field(description="RFC 3339 time of the reading.")

    @property
    def namespace(self) -> str:
        """The namespace of the job it was measured on."""
        return self.job.partition("/")[0]


def implausible_ratio(ratio: float) -> str | None:
    """Why a memory ratio cannot be a real reading (None: it can)."""
    if not (math.isfinite(ratio) and MIN_MEMORY_RATIO <= ratio <= MAX_RATIO):
        return f"memory ratio {ratio:g} is outside [{MIN_MEMORY_RATIO}, {MAX_RATIO}]"
    return None


def floor_ratio(capacity_bytes: float, modelled_peak_bytes: float) -> float | None:
    """The least factor that puts a configuration modelled at `modelled_peak_bytes` strictly above
    `capacity_bytes` (the card's memory): an out-of-memory run's lower bound. None without a figure."""
    if capacity_bytes <= 0 or modelled_peak_bytes <= 0:
        return None
    scale = 10.0**DECIMALS
    return (math.floor(capacity_bytes / modelled_peak_bytes * scale) + 1) / scale


@dataclass(frozen=True)
class LearnedMemory:
    """A GPU type's memory factor, the readings it came from (0: only an out-of-memory floor) and the
    floor that bounds it from below (None: no out-of-memory run)."""

    factor: float
    readings: int
    floor: float | None


def learned_memory(ratios: Sequence[float], floors: Sequence[float]) -> LearnedMemory | None:
    """The module's rule on a GPU type's readings and out-of-memory floors (None: memory as modelled)."""
    low, high = MEMORY_BOUNDS
    measured = min(max(max(ratios), low), high) if len(ratios) >= MIN_READINGS else None
    floor = min(max(floors), high) if floors else None
    if measured is None and floor is None:
        return None
    factor = max(measured if measured is not None else 1.0, floor if floor is not None else 0.0)
    return LearnedMemory(
        factor=round(factor, DECIMALS),
        readings=len(ratios) if measured is not None else 0,
        floor=floor,
    )
