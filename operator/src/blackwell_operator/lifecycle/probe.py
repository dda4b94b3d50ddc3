"""What a trainer's probe result teaches (pure): read from a pod's termination message, it becomes
status.probe, the `Probed` Event, one cluster-calibration sample per measured family and the plan
ConfigMap's copy (`plan.probe.result`), all decided here as one ProbePass (docs/probe.md)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from blackwell_operator.calibration.cluster import Sample, implausible, unphysical
from blackwell_operator.lifecycle.child_apply import supporting_patch
from blackwell_operator.lifecycle.child_record import owned_by
from blackwell_operator.lifecycle.failures import belongs_to
from blackwell_operator.lifecycle.ownership import Lineage
from blackwell_operator.lifecycle.status_read import read_status
from blackwell_operator.models.status import (
    BlackwellTrainingJobStatus,
    ProbedCandidate,
    ProbeStatus,
    StatusChange,
)
from blackwell_operator.planner.cluster_figures import candidate_figures
from blackwell_operator.render.children import plan_config_map
from blackwell_trainer.plan.config import Plan, ProbeMeasurement, ProbeOutcome, ProbeResult

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
    """Whether `result` was measured among this plan's probe options (the trainer's own rule)."""
    probe = plan.probe
    if probe is None or result.winner >= len(probe.options) or not result.measurements:
        return False
    if any(m.index >= len(probe.options) for m in result.measurements):
        return False
    return result.chosen is None or result.chosen == probe.options[result.winner].candidate


def unreadable(result: ProbeResult) -> str | None:
    """Why a result's figures cannot be real (None: they can): a figure that is not finite."""
    for m in result.measurements:
        for name, value in (
            ("predicted tokens/s", m.predicted_tokens_per_second_per_gpu),
            ("tokens/s", m.tokens_per_second_per_gpu),
        ):
            if value is not None and not math.isfinite(value):
                return f"candidate {m.index}'s {name} is {value}, not a number"
    if not math.isfinite(result.seconds):
        return f"the probe's wall time is {result.seconds}, not a number"
    return None


def _rate(result: ProbeResult, index: int) -> float | None:
    found = next((m for m in result.measurements if m.index == index), None)
    if found is None or found.outcome is not ProbeOutcome.MEASURED:
        return None
    return found.tokens_per_second_per_gpu


def pick_behind(result: ProbeResult) -> float | None:
    """How far the planner's pick (candidate 0) measured behind the winner; None when it won or either
    was not measured."""
    won, pick = _rate(result, result.winner), _rate(result, 0)
    if result.winner == 0 or not won or pick is None:
        return None
    return round(max(0.0, 1.0 - pick / won), 4)


def probed_event(plan: Plan, result: ProbeResult) -> tuple[str, str] | None:
    """(reason, message) of the Event: the winner, and how far the model's pick was from it."""
    if not _usable(plan, result):
        return None
    won, behind = _rate(result, result.winner), pick_behind(result)
    if result.winner == 0:
        gap = "the planner's pick won"
    elif behind is not None:
        gap = f"the planner's pick measured {behind:.1%} slower"
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


def probe_samples(
    meta: Mapping[str, Any], plan: Plan, result: ProbeResult, now: str
) -> tuple[list[Sample], list[str]]:
    """One measured-over-modelled sample per measured family (the first measured candidate of each, in
    probe order), the model's own figure taken from planner.cluster_figures; and why any measurement was
    refused (not physical: the measure loop's rule). Memory ratios come with a CUDA reading.

    The winner's family is keyed by the BTJ's uid, as the measure loop keys the job's own sample, so the
    steady reading of the running job later replaces it (one job, one sample per family); the others are
    keyed `<uid>/probe-<index>`."""
    if not _usable(plan, result):
        return [], []
    assert plan.probe is not None
    options = plan.probe.options
    won = options[result.winner].candidate
    won_family = (won.precision_recipe, won.activation_checkpointing)
    samples: list[Sample] = []
    refused: list[str] = []
    families: set[tuple[Any, Any]] = set()
    job = f"{meta.get('namespace')}/{meta.get('name')}"
    for m in result.measurements:
        if m.outcome != ProbeOutcome.MEASURED or not m.tokens_per_second_per_gpu:
            continue
        c = options[m.index]
        family = (c.candidate.precision_recipe, c.candidate.activation_checkpointing)
        figures = candidate_figures(c)
        modelled, peak = figures.modelled_tokens_per_second_per_gpu, figures.modelled_peak_reserved
        if family in families or modelled <= 0:
            continue
        ran = plan.model_copy(update={"chosen": c.candidate, "predicted": c.prediction})
        problem = unphysical(ran, m.tokens_per_second_per_gpu, m.peak_reserved_bytes or 0)
        sample = Sample(
            job=job,
            uid=str(meta.get("uid")) if family == won_family else f"{meta.get('uid')}/probe-{m.index}",
            instance_type=plan.instance_type,
            precision_recipe=c.candidate.precision_recipe,
            activation_checkpointing=c.candidate.activation_checkpointing,
            tokens_ratio=round(m.tokens_per_second_per_gpu / modelled, 4),
            memory_ratio=round(m.peak_reserved_bytes / peak, 4) if m.peak_reserved_bytes and peak else None,
            observed_at=now,
        )
        problem = problem or implausible(sample)
        if problem is not None:  # a misreading teaches nothing (the measure loop's rule)
            refused.append(f"{job} probe candidate {m.index}: {problem}")
            continue
        families.add(family)
        samples.append(sample)
    return samples, refused


def probe_status(
    plan: Plan, result: ProbeResult, *, child_uid: str | None, generation: int | None, now: str
) -> ProbeStatus:
    """status.probe for a usable result: each candidate's configuration, prediction and measurement."""
    assert plan.probe is not None
    options = plan.probe.options
    return ProbeStatus(
        winner=result.winner,
        chosen=options[result.winner].candidate,
        pick_behind=pick_behind(result),
        candidates=[
            ProbedCandidate(**dict(m), configuration=options[m.index].candidate) for m in result.measurements
        ],
        seconds=result.seconds,
        stopped_early=result.stopped_early,
        child_uid=child_uid,
        generation=generation,
        observed_at=now,
    )


def result_of(status: ProbeStatus) -> ProbeResult:
    """The trainer's ProbeResult that status.probe holds (the plan ConfigMap's copy)."""
    measurements = [
        ProbeMeasurement(**{k: v for k, v in dict(c).items() if k != "configuration"})
        for c in status.candidates
    ]
    return ProbeResult(
        winner=status.winner,
        chosen=status.chosen,
        measurements=measurements,
        seconds=status.seconds,
        stopped_early=status.stopped_early,
    )


def with_probe_result(plan: Plan, stored: BlackwellTrainingJobStatus, generation: int) -> Plan:
    """The plan with the choice this generation's probe made (`plan.probe.result`), when the status holds
    one measured among this plan's candidates: the ConfigMap then carries it and a restart trains with it.
    The plan unchanged otherwise (a new generation, or a re-plan that made other candidates, probes anew)."""
    kept = stored.probe
    if plan.probe is None or kept is None or kept.generation != generation:
        return plan
    result = result_of(kept)
    if not _usable(plan, result) or plan.probe.result == result:
        return plan
    probe = plan.probe.model_copy(update={"result": result})
    return plan.model_copy(update={"probe": probe})


def _same(a: ProbeStatus | None, b: ProbeStatus) -> bool:
    """The same probe (the time it was read aside)."""
    return a is not None and a.model_copy(update={"observed_at": ""}) == b.model_copy(
        update={"observed_at": ""}
    )


@dataclass(frozen=True)
class ProbePass:
    """What one pod's probe result decides: the status change (None: status.probe holds it already), and,
    when it is new, the Event, the calibration samples (and the refused readings) and the plan the
    ConfigMap carries with its copy. `problem`: why the result was not taken (logged)."""

    change: StatusChange | None = None
    event: tuple[str, str] | None = None
    samples: tuple[Sample, ...] = ()
    refused: tuple[str, ...] = ()
    plan: Plan | None = None
    problem: str | None = None

    @property
    def new(self) -> bool:
        """Whether the status does not say it yet (its effects are due)."""
        return self.change is not None


def probe_pass(
    btj: Mapping[str, Any], pod: Mapping[str, Any], result: ProbeResult, *, found: Lineage | None, now: str
) -> ProbePass:
    """The probe result of `pod` (a worker of `btj`'s current child, by its verified owner chain `found`)
    against the BTJ as it is now."""
    meta = btj.get("metadata") or {}
    if meta.get("deletionTimestamp") or not belongs_to(pod, btj, found):
        return ProbePass()
    stored = read_status(btj.get("status")).status
    plan = stored.plan
    if plan is None or plan.probe is None or not _usable(plan, result):
        return ProbePass(problem="its candidates are not those of the stored plan (re-planned since)")
    problem = unreadable(result)
    if problem is not None:
        return ProbePass(problem=problem)
    generation = stored.observed_generation or meta.get("generation")
    status = probe_status(
        plan, result, child_uid=found.uid if found else None, generation=generation, now=now
    )
    if _same(stored.probe, status):
        return ProbePass()
    samples, refused = probe_samples(meta, plan, result, now)
    probe = plan.probe.model_copy(update={"result": result})
    kept = plan.model_copy(update={"probe": probe})
    return ProbePass(
        change=StatusChange(probe=status, plan=kept),
        event=probed_event(plan, result),
        samples=tuple(samples),
        refused=tuple(refused),
        plan=kept,
    )


def joined(failure: StatusChange | None, probe: StatusChange | None) -> StatusChange | None:
    """One status change for a pod event that ended a worker and carried a probe result: the failure's,
    with status.probe added (and the plan's copy of the result, unless the failure re-planned)."""
    if failure is None or probe is None:
        return failure or probe
    merged = failure.model_copy(update={"probe": probe.probe})
    if "plan" not in failure.model_fields_set:
        merged.plan = probe.plan
    return merged


def config_map_copy(
    existing: Mapping[str, Any], btj: Mapping[str, Any], plan: Plan
) -> tuple[dict[str, Any] | None, str | None]:
    """The merge patch (on the resourceVersion read) that brings the plan ConfigMap to `plan`, the plan
    with its probe result, rendered as the reconciler renders it (so its next pass finds it current); None
    when it holds it already. The second item says why not when the ConfigMap is not this BTJ's."""
    meta = btj.get("metadata") or {}
    found = existing.get("metadata") or {}
    if not owned_by(existing, str(meta.get("uid") or "")):
        return None, f"ConfigMap {found.get('name')} is not this BlackwellTrainingJob's: left as it is"
    wanted = plan_config_map(
        str(meta.get("name")),
        str(meta.get("namespace")),
        plan,
        parent_labels=meta.get("labels"),
        uid=str(meta.get("uid") or ""),
    )
    patch = supporting_patch(existing, wanted)
    if patch is None:
        return None, None
    patch["metadata"]["resourceVersion"] = found.get("resourceVersion")
    return patch, None
