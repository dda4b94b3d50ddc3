"""What a trainer's probe result teaches (pure): the `Probed` Event and one cluster-calibration sample per
measured candidate (docs/probe.md). Reading it from a pod's termination message is here too."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from blackwell_operator.calibration.cluster import Sample, implausible
from blackwell_operator.planner.cluster_figures import candidate_figures
from blackwell_trainer.config import Plan, ProbeOutcome, ProbeResult

EVENT_REASON = "Probed"


def probe_result_of(pod: Mapping[str, Any]) -> ProbeResult | None:
    """The probe line of any terminated trainer container's message (now or the last time), else None."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if not isinstance(status, Mapping):
            continue
        for state in (status.get("state"), status.get("lastState")):
            terminated = (state or {}).get("terminated") if isinstance(state, Mapping) else None
            found = ProbeResult.find((terminated or {}).get("message")) if terminated else None
            if found is not None:
                return found
    return None


def _usable(plan: Plan, result: ProbeResult) -> bool:
    probe = plan.probe
    return probe is not None and result.winner < len(probe.options) and len(result.measurements) > 0


def probed_event(plan: Plan, result: ProbeResult) -> tuple[str, str] | None:
    """(reason, message) of the Event: the winner, and how far the model's pick was from it."""
    if not _usable(plan, result):
        return None
    rates = {m.index: m.tokens_per_second_per_gpu for m in result.measurements}
    won, pick = rates.get(result.winner), rates.get(0)
    if result.winner == 0:
        gap = "the planner's pick won"
    elif won and pick:
        gap = f"the planner's pick measured {1 - pick / won:.1%} slower"
    else:
        gap = "the planner's pick was not measured"
    dropped = [
        f"{m.index} {m.outcome.value}" for m in result.measurements if m.outcome != ProbeOutcome.MEASURED
    ]
    parts = [
        f"probed {len(result.measurements)} candidates in {result.seconds:.0f} s: training with candidate "
        f"{result.winner}" + (f" at {won:,.0f} tokens/s per GPU" if won else ""),
        gap,
    ]
    if dropped:
        parts.append("dropped: " + ", ".join(dropped))
    if result.stopped_early:
        parts.append("stopped at its time budget")
    return EVENT_REASON, "; ".join(parts)


def probe_samples(meta: Mapping[str, Any], plan: Plan, result: ProbeResult, now: str) -> list[Sample]:
    """One measured-over-modelled sample per measured candidate (its own family), the model's own figure
    taken from planner.cluster_figures. Memory ratios come with a CUDA reading.
    A candidate's sample is keyed `<uid>/probe-<index>`, so a job's probe adds one per family."""
    if not _usable(plan, result):
        return []
    assert plan.probe is not None
    options = plan.probe.options
    samples = []
    for m in result.measurements:
        if m.outcome != ProbeOutcome.MEASURED or not m.tokens_per_second_per_gpu:
            continue
        if m.index >= len(options):  # not of this plan's probe: nothing to compare it with
            continue
        c = options[m.index]
        figures = candidate_figures(c)
        modelled, peak = figures.modelled_tokens_per_second_per_gpu, figures.modelled_peak_reserved
        if modelled <= 0:
            continue
        sample = Sample(
            job=f"{meta.get('namespace')}/{meta.get('name')}",
            uid=f"{meta.get('uid')}/probe-{m.index}",
            instance_type=plan.instance_type,
            precision_recipe=c.candidate.precision_recipe,
            activation_checkpointing=c.candidate.activation_checkpointing,
            tokens_ratio=round(m.tokens_per_second_per_gpu / modelled, 4),
            memory_ratio=round(m.peak_reserved_bytes / peak, 4) if m.peak_reserved_bytes and peak else None,
            observed_at=now,
        )
        if implausible(sample) is None:  # a misreading teaches nothing (the measure loop's rule)
            samples.append(sample)
    return samples
