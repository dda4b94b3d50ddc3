"""The cluster calibration: running jobs' measured-over-modelled ratios and the bounded correction they give.

One sample per job (its latest steady reading), keyed by instance type and recipe family (precision
recipe and activation-checkpointing mode: the two choices the models' constants depend on most). A
correction needs MIN_RUNS jobs, takes the median (one odd job cannot move it) and is clamped, so a
misread or a job starved by a noisy neighbour can at worst shift a plan within those bounds. The memory
factor is the GPU type's, learned from every family's readings (calibration/learned_memory.py).

Tenants: a plan learns only from its own namespace's jobs unless the operator pools them (opt-in); in the
pool each namespace counts with at most POOL_PER_NAMESPACE jobs per family. A sample outside what a
reading can physically be (not finite, below a floor, above what the GPU's peak allows) is never stored
nor counted.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

from pydantic import Field

from blackwell_operator.calibration.learned_memory import (
    MAX_RATIO,
    LearnedMemory,
    MemoryReading,
    MemorySource,
    implausible_ratio,
    learned_memory,
)
from blackwell_trainer.plan.config import (
    ActivationCheckpointing,
    ClusterCorrection,
    Plan,
    PrecisionRecipe,
    WireModel,
)

CLUSTER_CALIBRATION_API_VERSION = "training.blackwell.dev/cluster-calibration/v1"
# Jobs of one family needed before its plans are corrected.
MIN_RUNS = 3
# Tokens/s: the models were within 9% on the H200 grid; a cluster at half the modelled speed is a real
# finding (slower interconnect, throttled GPUs), one at more than 1.2x more likely a misreading.
TOKENS_BOUNDS = (0.5, 1.2)
# Memory: MEMORY_BOUNDS, learned per GPU type (calibration/learned_memory.py).
# Newest samples kept per namespace and family: enough for a stable median; one namespace's many jobs
# push out only its own older samples, never another namespace's.
KEEP_PER_FAMILY = 20
# Samples kept per namespace over all its families, and in all, oldest dropped first: far below a
# ConfigMap's 1 MiB (a sample is about 300 bytes), and no namespace can fill it for the others.
MAX_PER_NAMESPACE = 100
MAX_SAMPLES = 2000
# In the opt-in cluster-wide pool, the newest jobs per namespace and family that count: twenty jobs of one
# team are still POOL_PER_NAMESPACE votes beside another team's.
POOL_PER_NAMESPACE = 3
# What a reading can physically be. Below a twentieth of the model is a stalled or starved job, not a
# property of the cluster (memory: MIN_MEMORY_RATIO, a tenth of the model).
MIN_TOKENS_RATIO = 0.05
# Dense peak of each recipe's GEMMs over the BF16 dense peak (the MFU the plans state is against BF16):
# a measured MFU above it is more work than the GPU can do, so the reading is wrong.
PEAK_OVER_BF16 = {PrecisionRecipe.NONE: 1.0, PrecisionRecipe.NVFP4_BLOCK: 4.0}
FP8_PEAK_OVER_BF16 = 2.0

FamilyKey = tuple[str, PrecisionRecipe, ActivationCheckpointing]
# The correction a search applies to one family of one instance type (None: the model as it is).
Corrector = Callable[[PrecisionRecipe, ActivationCheckpointing], ClusterCorrection | None]


class Sample(WireModel):
    """One job's measured over modelled figures."""

    job: str = Field(description="namespace/name of the BlackwellTrainingJob.")
    uid: str = Field(description="The BTJ's uid (one sample per job).")
    instance_type: str
    precision_recipe: PrecisionRecipe
    activation_checkpointing: ActivationCheckpointing
    tokens_ratio: float = Field(gt=0, description="Measured over modelled tokens/s per GPU.")
    memory_ratio: float | None = Field(
        default=None, gt=0, description="Measured over modelled peak reserved (None on CPU, no reading)."
    )
    observed_at: str = Field(description="RFC 3339 time of the reading.")

    @property
    def key(self) -> FamilyKey:
        return (self.instance_type, self.precision_recipe, self.activation_checkpointing)

    @property
    def namespace(self) -> str:
        """The namespace of the job it was measured on (the source its caps count by)."""
        return self.job.partition("/")[0]


def implausible(sample: Sample) -> str | None:
    """Why a sample cannot be a real reading (None: it can): not finite, under the floors, over MAX_RATIO."""
    if not math.isfinite(sample.tokens_ratio):
        return f"tokens ratio {sample.tokens_ratio} is not finite"
    if not MIN_TOKENS_RATIO <= sample.tokens_ratio <= MAX_RATIO:
        return f"tokens ratio {sample.tokens_ratio:g} is outside [{MIN_TOKENS_RATIO}, {MAX_RATIO}]"
    return implausible_ratio(sample.memory_ratio) if sample.memory_ratio is not None else None


def peak_over_bf16(recipe: PrecisionRecipe) -> float:
    """The recipe's dense GEMM peak over the BF16 dense peak (1 for BF16, 2 for FP8, 4 for NVFP4)."""
    return PEAK_OVER_BF16.get(recipe, FP8_PEAK_OVER_BF16)


# Peak reserved memory may read a little above the catalog's usable memory (the driver's own share is
# outside both), never much more.
RESERVED_SLACK = 1.05


def unphysical(plan: Plan, tokens_per_s: float, reserved_bytes: int) -> str | None:
    """Why a job's reading cannot be what its GPUs did (None: it can): a rate that is not finite or not
    positive, one whose MFU is above the GPU's peak for the plan's recipe, or more memory reserved than
    the GPU has. The plan's predicted MFU scales with its predicted rate, so the measured MFU follows."""
    if not math.isfinite(tokens_per_s) or tokens_per_s <= 0:
        return f"{tokens_per_s:g} tokens/s per GPU is not a rate"
    predicted = plan.predicted.tokens_per_second_per_gpu
    mfu = plan.predicted.model_flops_utilization * tokens_per_s / predicted if predicted > 0 else 0.0
    ceiling = peak_over_bf16(plan.chosen.precision_recipe)
    if mfu > ceiling:
        return (
            f"{tokens_per_s:,.0f} tokens/s per GPU is {mfu:.2f} of the BF16 dense peak, above the "
            f"{ceiling:g} the GPU can do with recipe {plan.chosen.precision_recipe.value}"
        )
    return over_memory(plan, reserved_bytes)


def over_memory(plan: Plan, reserved_bytes: int) -> str | None:
    """Why a peak reserved reading cannot be the plan's GPU's (None: it can): more than the card has."""
    if reserved_bytes > RESERVED_SLACK * plan.gpu.memory_bytes:
        return f"{reserved_bytes} bytes reserved is more than the GPU's {plan.gpu.memory_bytes}"
    return None


class ImplausibleSample(ValueError):
    """A sample no real reading can give: it is not stored."""


class _Kept(Protocol):
    @property
    def namespace(self) -> str: ...


Kept = TypeVar("Kept", bound=_Kept)


def _within_total(samples: Sequence[Kept]) -> list[Kept]:
    """`samples` (oldest first) cut to MAX_SAMPLES by dropping, one at a time, the oldest sample of the
    namespace holding the most. Dropping the oldest of all instead would let the jobs of many busy
    namespaces push out a quiet namespace's only samples: a namespace at or under its share of the
    store (MAX_SAMPLES over the namespaces in it) never loses one to the others. The same for memory
    readings (their own list)."""
    kept = list(samples)
    while len(kept) > MAX_SAMPLES:
        counts = Counter(s.namespace for s in kept)
        largest = max(counts.values())
        # The first sample (the oldest) of a namespace holding the most.
        kept.pop(next(i for i, s in enumerate(kept) if counts[s.namespace] == largest))
    return kept


def _clamp(value: float, bounds: tuple[float, float]) -> float:
    return min(max(value, bounds[0]), bounds[1])


class ClusterCalibration(WireModel):
    """Every job's sample: what the operator keeps in its ConfigMap, `btj calibrate cluster export` writes."""

    api_version: str = Field(default=CLUSTER_CALIBRATION_API_VERSION)
    samples: list[Sample] = Field(default_factory=list)
    memory: list[MemoryReading] = Field(
        default_factory=list,
        description="Memory readings beside the samples' own: a probe's other candidates, out-of-memory "
        "runs.",
    )

    def record(self, sample: Sample) -> ClusterCalibration:
        """A copy with `sample` replacing the job's earlier one; beyond KEEP_PER_FAMILY samples of its
        namespace and family, that namespace's oldest dropped (the same for MAX_PER_NAMESPACE over all its
        families); beyond MAX_SAMPLES, the oldest of the namespace that holds the most. ImplausibleSample
        for one no reading can give (nothing stored)."""
        problem = implausible(sample)
        if problem is not None:
            raise ImplausibleSample(f"{sample.job}: {problem}")
        others = [s for s in self.samples if s.uid != sample.uid]
        own = [s for s in others if s.namespace == sample.namespace]
        same = [s for s in own if s.key == sample.key]
        drop = {id(s) for s in same[: max(0, len(same) + 1 - KEEP_PER_FAMILY)]}
        own = [s for s in own if id(s) not in drop]
        drop |= {id(s) for s in own[: max(0, len(own) + 1 - MAX_PER_NAMESPACE)]}
        kept = _within_total([*(s for s in others if id(s) not in drop), sample])
        return ClusterCalibration(samples=kept, memory=self.memory)

    def record_memory(self, reading: MemoryReading) -> ClusterCalibration:
        """A copy with `reading` replacing the one of the same key; beyond MAX_PER_NAMESPACE readings of
        its namespace, that namespace's oldest dropped; beyond MAX_SAMPLES, the oldest of the namespace that
        holds the most. ImplausibleSample for a ratio no reading can give (nothing stored)."""
        problem = implausible_ratio(reading.ratio)
        if problem is not None:
            raise ImplausibleSample(f"{reading.job}: {problem}")
        others = [r for r in self.memory if r.uid != reading.uid]
        own = [r for r in others if r.namespace == reading.namespace]
        drop = {id(r) for r in own[: max(0, len(own) + 1 - MAX_PER_NAMESPACE)]}
        kept = _within_total([*(r for r in others if id(r) not in drop), reading])
        return ClusterCalibration(samples=self.samples, memory=kept)

    def runs(self, key: FamilyKey, namespace: str | None = None, *, pooled: bool = False) -> list[Sample]:
        """The family's plausible samples that count for a plan in `namespace`: that namespace's own, or
        with `pooled` every namespace's newest POOL_PER_NAMESPACE. Without a namespace (the CLI's view of
        the whole store), every plausible sample."""
        family = [s for s in self.samples if s.key == key and implausible(s) is None]
        if not pooled:
            return family if namespace is None else [s for s in family if s.namespace == namespace]
        counted: dict[str, list[Sample]] = {}
        for s in reversed(family):  # newest first
            votes = counted.setdefault(s.namespace, [])
            if len(votes) < POOL_PER_NAMESPACE:
                votes.append(s)
        return [s for s in family if any(s is v for votes in counted.values() for v in votes)]

    def memory_evidence(
        self, instance_type: str, namespace: str | None = None, *, pooled: bool = False
    ) -> tuple[list[float], list[float]]:
        """The memory readings (the running jobs' memory ratios and the probes' peaks of every family) and
        the out-of-memory floors on `instance_type` that count for a plan in `namespace` (every
        namespace's with `pooled`, or without a namespace); implausible ones left out."""

        def counts(of: str) -> bool:
            return pooled or namespace is None or of == namespace

        ratios = [
            s.memory_ratio
            for s in self.samples
            if s.instance_type == instance_type
            and s.memory_ratio is not None
            and counts(s.namespace)
            and implausible(s) is None
        ]
        readings = [
            r
            for r in self.memory
            if r.instance_type == instance_type and counts(r.namespace) and implausible_ratio(r.ratio) is None
        ]
        ratios += [r.ratio for r in readings if r.source is MemorySource.PROBE]
        return ratios, [r.ratio for r in readings if r.source is MemorySource.OUT_OF_MEMORY]

    def learned_memory(
        self, instance_type: str, namespace: str | None = None, *, pooled: bool = False
    ) -> LearnedMemory | None:
        """The GPU type's memory factor for a plan in `namespace` (calibration/learned_memory.py's rule on
        `memory_evidence`)."""
        return learned_memory(*self.memory_evidence(instance_type, namespace, pooled=pooled))

    def correction(
        self,
        instance_type: str,
        recipe: PrecisionRecipe,
        ac: ActivationCheckpointing,
        namespace: str | None = None,
        *,
        pooled: bool = False,
    ) -> ClusterCorrection | None:
        """The correction of a plan in `namespace` for one family: its bounded median tokens factor once
        MIN_RUNS jobs of it count (`runs` says which), and the GPU type's learned memory factor (any
        family's readings); None with neither."""
        runs = self.runs((instance_type, recipe, ac), namespace, pooled=pooled)
        memory = self.learned_memory(instance_type, namespace, pooled=pooled)
        if len(runs) < MIN_RUNS and memory is None:
            return None
        tokens = (
            _clamp(statistics.median(s.tokens_ratio for s in runs), TOKENS_BOUNDS)
            if len(runs) >= MIN_RUNS
            else 1.0
        )
        return ClusterCorrection(
            instance_type=instance_type,
            precision_recipe=recipe,
            activation_checkpointing=ac,
            runs=len(runs),
            tokens_factor=round(tokens, 4),
            memory_factor=memory.factor if memory else 1.0,
            memory_readings=memory.readings if memory else 0,
            memory_floor=memory.floor if memory else None,
        )

    def corrector(
        self, instance_type: str, namespace: str | None = None, *, pooled: bool = False
    ) -> Corrector:
        """The correction lookup a search on `instance_type` for a BTJ in `namespace` uses."""
        instance = str(instance_type)  # the spec's enum member reads as its value
        return lambda recipe, ac: self.correction(instance, recipe, ac, namespace, pooled=pooled)


def speed_measured(correction: ClusterCorrection | None) -> bool:
    """Whether a correction's family was measured by enough jobs for its tokens factor (then it counts as
    measured on this cluster: auto does not probe it); a learned memory factor alone does not."""
    return correction is not None and correction.runs >= MIN_RUNS


def learned_on_gpu(correction: ClusterCorrection) -> bool:
    """Whether a correction carries a memory factor learned for its GPU type (every family's), not one of
    its family only (a plan made before memory was learned per GPU type)."""
    return correction.memory_readings > 0 or correction.memory_floor is not None


def frozen(correction: ClusterCorrection | None) -> Corrector:
    """A lookup that gives only `correction` (a job re-planned within one generation keeps its factors):
    for its family whole; for the other families only its GPU type's learned memory factor."""

    def lookup(recipe: PrecisionRecipe, ac: ActivationCheckpointing) -> ClusterCorrection | None:
        if correction is None:
            return None
        if (correction.precision_recipe, correction.activation_checkpointing) == (recipe, ac):
            return correction
        if not learned_on_gpu(correction):
            return None
        update = {"precision_recipe": recipe, "activation_checkpointing": ac, "runs": 0, "tokens_factor": 1.0}
        return correction.model_copy(update=update)

    return lookup


def describe_memory(c: ClusterCorrection) -> str:
    """Where a correction's memory factor came from, in a few words ("" for a family's own factor)."""
    parts = []
    if c.memory_readings:
        s = "" if c.memory_readings == 1 else "s"
        parts.append(f"learned from {c.memory_readings} measured peak{s} on this GPU type")
    if c.memory_floor is not None:
        parts.append(f"at least x{c.memory_floor:.2f}, where a configuration ran out of memory")
    return f" ({'; '.join(parts)})" if parts else ""


def describe_correction(c: ClusterCorrection) -> str:
    """The plan's and status's one line for an applied correction."""
    family = f"recipe {c.precision_recipe.value}, AC {c.activation_checkpointing.value}"
    memory = f"peak memory x{c.memory_factor:.2f}{describe_memory(c)}"
    if speed_measured(c):
        return (
            f"corrected from {c.runs} runs on this cluster ({c.instance_type}, {family}): "
            f"tokens/s x{c.tokens_factor:.2f}, {memory}"
        )
    return (
        f"corrected on this cluster ({c.instance_type}): {memory}; tokens/s as modelled ({c.runs} of "
        f"{MIN_RUNS} runs of {family})"
    )
