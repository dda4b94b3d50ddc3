"""The memory a job teaches its GPU type beyond its samples (pure): the peak of every candidate its probe
measured that no sample carries, and a lower bound from each configuration that ran out of memory, in a
probe or in training (calibration/learned_memory.py has the rule that turns them into a factor)."""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Mapping
from typing import Any

from blackwell_operator.calibration.learned_memory import (
    DECIMALS,
    MemoryReading,
    MemorySource,
    floor_ratio,
    implausible_ratio,
)
from blackwell_operator.lifecycle.replan import candidate_line, correction_of
from blackwell_operator.lifecycle.status_read import read_status
from blackwell_operator.planner.cluster_figures import candidate_figures, figures_of
from blackwell_trainer.plan.config import Candidate, OomResult, Plan, ProbeOutcome, ProbeResult

# Outcomes whose peak is a reading: measured, or measured past the plan's budget (a peak all the same).
READ_PEAK = frozenset({ProbeOutcome.MEASURED, ProbeOutcome.OVER_MEMORY})


def _job(meta: Mapping[str, Any]) -> str:
    return f"{meta.get('namespace')}/{meta.get('name')}"


def probe_readings(
    meta: Mapping[str, Any], plan: Plan, result: ProbeResult, counted: Collection[int], now: str
) -> tuple[list[MemoryReading], list[str]]:
    """One reading per candidate the probe measured a peak of, but `counted` (those whose peak a family's
    sample carries already, or whose sample was refused), and one floor per candidate that ran out of
    memory (its modelled peak times the floor exceeds the card); and why any was refused."""
    assert plan.probe is not None
    options = plan.probe.options
    readings: list[MemoryReading] = []
    refused: list[str] = []
    for m in result.measurements:
        option = options[m.index]
        modelled = candidate_figures(option).modelled_peak_reserved
        if m.outcome in READ_PEAK and m.peak_reserved_bytes and modelled > 0 and m.index not in counted:
            source, tag = MemorySource.PROBE, "peak"
            ratio: float | None = round(m.peak_reserved_bytes / modelled, DECIMALS)
        elif m.outcome is ProbeOutcome.OUT_OF_MEMORY:
            source, tag = MemorySource.OUT_OF_MEMORY, "oom-probe"
            ratio = floor_ratio(plan.gpu.memory_bytes, modelled)
        else:
            continue
        if ratio is None:
            continue
        problem = implausible_ratio(ratio)
        if problem is not None:  # a misreading teaches nothing (the measure loop's rule)
            refused.append(f"{_job(meta)} probe candidate {m.index}: {problem}")
            continue
        readings.append(
            MemoryReading(
                job=_job(meta),
                uid=f"{meta.get('uid')}/{tag}-{m.index}",
                instance_type=plan.instance_type,
                source=source,
                ratio=ratio,
                configuration=candidate_line(option.candidate),
                observed_at=now,
            )
        )
    return readings, refused


def _modelled_peak(plan: Plan, candidate: Candidate) -> int | None:
    """The model's peak of the configuration a job trained: the plan's pick or one of its probe options."""
    if candidate == plan.chosen:
        return figures_of(plan).modelled_peak_reserved
    options = plan.probe.options if plan.probe is not None else []
    found = next((o for o in options if o.candidate == candidate), None)
    return candidate_figures(found).modelled_peak_reserved if found is not None else None


def oom_reading(btj: Mapping[str, Any], result: OomResult, now: str) -> MemoryReading | None:
    """The lower bound a training run that ran out of memory sets (None when it sets none here): its true
    peak was above the GPU's memory (and at least what it needed), so the factor that makes its modelled
    peak exceed that is the least the GPU type's factor may be. Only for a plan of the model as it is: one
    that the job's own out-of-memory correction (status.memoryCorrection) changed predicts another peak."""
    meta = btj.get("metadata") or {}
    stored = read_status(btj.get("status")).status
    plan = stored.plan
    if plan is None or correction_of(btj, stored) is not None:
        return None
    modelled = _modelled_peak(plan, result.candidate)
    if not modelled:
        return None
    capacity = min(plan.gpu.memory_bytes, result.gpu_total_bytes or plan.gpu.memory_bytes)
    ratio = floor_ratio(max(capacity, result.needed_bytes), modelled)
    if ratio is None or implausible_ratio(ratio) is not None:
        return None
    configuration = candidate_line(result.candidate)
    key = hashlib.sha256(result.candidate.model_dump_json().encode()).hexdigest()[:12]
    return MemoryReading(
        job=_job(meta),
        uid=f"{meta.get('uid')}/oom-{key}",
        instance_type=plan.instance_type,
        source=MemorySource.OUT_OF_MEMORY,
        ratio=ratio,
        configuration=configuration,
        observed_at=now,
    )
