"""What the trainer's probe reports for a plan, made for tests: each candidate measured at a share of its
predicted speed, with a peak of the test's choosing (torch-free)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from blackwell_trainer.plan.config import Plan, ProbeCandidate, ProbeMeasurement, ProbeOutcome, ProbeResult


def measured_probe(
    plan: Plan,
    *,
    speed: Sequence[float],
    peak: Callable[[ProbeCandidate], float],
    winner: int,
    seconds_each: float,
    seconds: float,
) -> ProbeResult:
    """The first `len(speed)` candidates measured: tokens/s at `speed[i]` times the prediction (rounded to
    0.1), peak reserved `peak(candidate)` bytes; `winner` is the candidate the probe chose."""
    assert plan.probe is not None, "the plan probes"
    measurements = [
        ProbeMeasurement(
            index=i,
            outcome=ProbeOutcome.MEASURED,
            predicted_tokens_per_second_per_gpu=c.prediction.tokens_per_second_per_gpu,
            predicted_peak_reserved_bytes=c.prediction.memory.peak_reserved,
            tokens_per_second_per_gpu=round(speed[i] * c.prediction.tokens_per_second_per_gpu, 1),
            peak_reserved_bytes=int(peak(c)),
            seconds=seconds_each,
        )
        for i, c in enumerate(plan.probe.candidates[: len(speed)])
    ]
    return ProbeResult(
        winner=winner,
        chosen=plan.probe.candidates[winner].candidate,
        measurements=measurements,
        seconds=seconds,
    )
