"""The cluster calibration: running jobs' measured-over-modelled ratios and the bounded correction they give.

One sample per job (its latest steady reading), keyed by instance type and recipe family (precision
recipe and activation-checkpointing mode: the two choices the models' constants depend on most). A
correction needs MIN_RUNS jobs, takes the median (one odd job cannot move it) and is clamped, so a
misread or a job starved by a noisy neighbour can at worst shift a plan within those bounds.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

from pydantic import Field

from blackwell_trainer.config import ActivationCheckpointing, ClusterCorrection, PrecisionRecipe, WireModel

CLUSTER_CALIBRATION_API_VERSION = "training.blackwell.dev/cluster-calibration/v1"
# Jobs of one family needed before its plans are corrected.
MIN_RUNS = 3
# Tokens/s: the models were within 9% on the H200 grid; a cluster at half the modelled speed is a real
# finding (slower interconnect, throttled GPUs), one at more than 1.2x more likely a misreading.
TOKENS_BOUNDS = (0.5, 1.2)
# Memory: never trust much less than modelled (a plan packed tighter than the model OOMs), allow up to
# 30% more (the fragmentation of a driver or allocator version the grid did not see).
MEMORY_BOUNDS = (0.9, 1.3)
# Newest samples kept per family: enough for a stable median, bounded in a ConfigMap (1 MiB).
KEEP_PER_FAMILY = 20

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


def _clamp(value: float, bounds: tuple[float, float]) -> float:
    return min(max(value, bounds[0]), bounds[1])


class ClusterCalibration(WireModel):
    """Every job's sample: what the operator keeps in its ConfigMap, `btj calibrate cluster export` writes."""

    api_version: str = Field(default=CLUSTER_CALIBRATION_API_VERSION)
    samples: list[Sample] = Field(default_factory=list)

    def record(self, sample: Sample) -> ClusterCalibration:
        """A copy with `sample` replacing the job's earlier one; the oldest of its family beyond the limit
        dropped."""
        others = [s for s in self.samples if s.uid != sample.uid]
        family = [s for s in others if s.key == sample.key]
        drop = {id(s) for s in family[: max(0, len(family) + 1 - KEEP_PER_FAMILY)]}
        kept = [s for s in others if id(s) not in drop]
        return ClusterCalibration(samples=[*kept, sample])

    def runs(self, key: FamilyKey) -> list[Sample]:
        return [s for s in self.samples if s.key == key]

    def correction(
        self, instance_type: str, recipe: PrecisionRecipe, ac: ActivationCheckpointing
    ) -> ClusterCorrection | None:
        """The family's bounded median correction, or None with fewer than MIN_RUNS jobs."""
        runs = self.runs((instance_type, recipe, ac))
        if len(runs) < MIN_RUNS:
            return None
        tokens = _clamp(statistics.median(s.tokens_ratio for s in runs), TOKENS_BOUNDS)
        memories = [s.memory_ratio for s in runs if s.memory_ratio is not None]
        memory = _clamp(statistics.median(memories), MEMORY_BOUNDS) if len(memories) >= MIN_RUNS else 1.0
        return ClusterCorrection(
            instance_type=instance_type,
            precision_recipe=recipe,
            activation_checkpointing=ac,
            runs=len(runs),
            tokens_factor=round(tokens, 4),
            memory_factor=round(memory, 4),
        )

    def corrector(self, instance_type: str) -> Corrector:
        """The correction lookup a search on `instance_type` uses."""
        instance = str(instance_type)  # the spec's enum member reads as its value
        return lambda recipe, ac: self.correction(instance, recipe, ac)


def frozen(correction: ClusterCorrection | None) -> Corrector:
    """A lookup that gives only `correction` (a job re-planned within one generation keeps its factors)."""

    def lookup(recipe: PrecisionRecipe, ac: ActivationCheckpointing) -> ClusterCorrection | None:
        if correction is None:
            return None
        same = (correction.precision_recipe, correction.activation_checkpointing) == (recipe, ac)
        return correction if same else None

    return lookup


def describe_correction(c: ClusterCorrection) -> str:
    """The plan's and status's one line for an applied correction."""
    return (
        f"corrected from {c.runs} runs on this cluster ({c.instance_type}, recipe "
        f"{c.precision_recipe.value}, AC {c.activation_checkpointing.value}): "
        f"tokens/s x{c.tokens_factor:.2f}, peak memory x{c.memory_factor:.2f}"
    )
