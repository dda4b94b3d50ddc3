"""One home for a plan's modelled and cluster-corrected figures, and for applying the cluster's factors.

The planner plans with what the user's cluster measured (calibration/cluster.py): a family's step time,
tokens/s and MFU are the model's divided or multiplied by its tokens factor, and a setting fits when the
model's peak times its memory factor fits the budget. The plan then stores the corrected throughput (what
the job should do here) beside the modelled peak memory (the breakdown the memory model gives). Which is
which is said here once: the search applies the factors with `corrected_time` and `corrected_peak`, and the
measure loop takes the model's own figures from `figures_of` (its calibration samples are measured over
modelled, so that the calibration never chases its own corrections). Nothing else multiplies or divides by
a factor.
"""

from __future__ import annotations

from dataclasses import dataclass

from blackwell_operator.planner.throughput import TimeEstimate
from blackwell_trainer.plan.config import ClusterCorrection, Plan, Prediction, ProbeCandidate


@dataclass(frozen=True)
class Factors:
    """What a cluster correction scales: tokens/s (and so step time and MFU) and the peak memory."""

    tokens: float = 1.0
    memory: float = 1.0


def factors_of(correction: ClusterCorrection | None) -> Factors:
    """The factors of a correction; 1 and 1 without one."""
    if correction is None:
        return Factors()
    return Factors(correction.tokens_factor, correction.memory_factor)


def corrected_time(time: TimeEstimate, factors: Factors) -> TimeEstimate:
    """The model's time estimate as this cluster runs it (the model's, unchanged, at a factor of 1)."""
    f = factors.tokens
    if f == 1.0:
        return time
    return TimeEstimate(
        time.step_time_seconds / f,
        time.tokens_per_second_per_gpu * f,
        time.model_flops_utilization * f,
        {k: v / f for k, v in time.breakdown.items()},
    )


def corrected_peak(peak_reserved: float, factors: Factors) -> float:
    """The model's peak reserved memory as this cluster measures it (what must fit the budget)."""
    return peak_reserved * factors.memory


@dataclass(frozen=True)
class PlanFigures:
    """A plan's throughput and peak memory, as the model gives them and as the cluster corrects them."""

    modelled_tokens_per_second_per_gpu: float
    corrected_tokens_per_second_per_gpu: float
    modelled_peak_reserved: int
    corrected_peak_reserved: float
    factors: Factors


def figures_of(plan: Plan) -> PlanFigures:
    """Both figures of a plan: it stores the corrected tokens/s (status.plan.predicted) and the modelled
    peak; the other of each follows from the factors it was planned with (status.plan.clusterCorrection)."""
    return _figures(plan.predicted, factors_of(plan.cluster_correction))


def candidate_figures(candidate: ProbeCandidate) -> PlanFigures:
    """Both figures of a probe candidate: its prediction carries its family's tokens factor
    (ProbeCandidate.tokensFactor) and the modelled peak, as a plan's does."""
    return _figures(candidate.prediction, Factors(tokens=candidate.tokens_factor))


def _figures(prediction: Prediction, factors: Factors) -> PlanFigures:
    """A prediction stores the corrected tokens/s and the modelled peak: the other of each follows."""
    corrected = prediction.tokens_per_second_per_gpu
    peak = prediction.memory.peak_reserved
    return PlanFigures(
        modelled_tokens_per_second_per_gpu=corrected / factors.tokens,
        corrected_tokens_per_second_per_gpu=corrected,
        modelled_peak_reserved=peak,
        corrected_peak_reserved=corrected_peak(peak, factors),
        factors=factors,
    )


def probe_winner(plan: Plan) -> ProbeCandidate | None:
    """The probe option a probed job trains with, once its result is known (plan.probe.result, the
    operator's copy): the same rule as the trainer's (the result's configuration must be the plan's
    option at that index). None without a probe result that fits this plan."""
    probe = plan.probe
    result = probe.result if probe is not None else None
    if probe is None or result is None:
        return None
    options = probe.options
    if result.winner >= len(options):
        return None
    won = options[result.winner]
    return won if result.chosen is None or result.chosen == won.candidate else None
