"""What a trainer's probe result teaches (pure): read from a pod's termination message, it becomes
status.probe, the `Probed` Event, one cluster-calibration sample per measured family, a memory reading of
every other candidate measured (lifecycle/memory_readings.py) and the plan ConfigMap's copy
(`plan.probe.result`), all decided here as one ProbePass (docs/probe.md). The first result for a plan's
candidates settles them; one with figures no GPU can give is refused whole."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from blackwell_operator.calibration.cluster import Sample, implausible, over_memory, unphysical
from blackwell_operator.calibration.learned_memory import MemoryReading
from blackwell_operator.lifecycle.child_apply import supporting_patch
from blackwell_operator.lifecycle.child_record import owned_by
from blackwell_operator.lifecycle.failures import belongs_to
from blackwell_operator.lifecycle.memory_readings import probe_readings
from blackwell_operator.lifecycle.ownership import Lineage
from blackwell_operator.lifecycle.plan_columns import put_plan
from blackwell_operator.lifecycle.replan import candidate_line
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
# The warning Event of a result whose figures were refused (the job trains the planner's pick).
REFUSED_REASON = "ProbeRefused"


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


def _not_numbers(result: ProbeResult) -> str | None:
    """The first figure of a result that is not a finite number (the wire model already refuses NaN and
    negative ones: such a line is not a result at all)."""
    for m in result.measurements:
        for name, value in (
            ("predicted tokens/s", m.predicted_tokens_per_second_per_gpu),
            ("tokens/s", m.tokens_per_second_per_gpu),
            ("wall time", m.seconds),
        ):
            if value is not None and not math.isfinite(value):
                return f"candidate {m.index}'s {name} is {value}, not a number"
    if not math.isfinite(result.seconds):
        return f"the probe's wall time is {result.seconds}, not a number"
    return None


def out_of_bounds(plan: Plan, result: ProbeResult) -> str | None:
    """Why a usable result's figures cannot be what the job's GPUs did (None: they can): a figure that is
    not a finite number; a measured rate that is not positive or whose MFU, at the planner's FLOPs per
    token for that candidate, is above the GPU's dense peak for its recipe; a peak reserved above the card's
    memory (calibration.cluster's rules, which the measure loop applies to a running job's readings)."""
    problem = _not_numbers(result)
    if problem is not None:
        return problem
    assert plan.probe is not None
    options = plan.probe.options
    for m in result.measurements:
        option = options[m.index]
        ran = plan.model_copy(update={"chosen": option.candidate, "predicted": option.prediction})
        if m.outcome is ProbeOutcome.MEASURED:
            problem = unphysical(ran, m.tokens_per_second_per_gpu or 0.0, m.peak_reserved_bytes or 0)
        else:
            problem = over_memory(ran, m.peak_reserved_bytes or 0)
        if problem is not None:
            return f"candidate {m.index}: {problem}"
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


def _pick_line(plan: Plan) -> str:
    """The planner's pick (probe candidate 0) in a few words, with its predicted peak."""
    assert plan.probe is not None
    pick = plan.probe.options[0]
    return candidate_line(pick.candidate, pick.prediction.memory.peak_reserved)


def _verdict(plan: Plan, result: ProbeResult) -> str:
    """How the winner came about: the pick won, or how far it was behind, or that nothing fit."""
    outcomes = {m.outcome for m in result.measurements}
    if outcomes == {ProbeOutcome.OUT_OF_MEMORY}:
        return f"every candidate ran out of memory; training the planner's pick, which is {_pick_line(plan)}"
    if _rate(result, result.winner) is None:
        return (
            "no candidate was measured within the memory budget; training the planner's pick, which is "
            + _pick_line(plan)
        )
    behind = pick_behind(result)
    if result.winner == 0:
        return "the planner's pick won"
    if behind is not None:
        return f"the planner's pick measured {behind:.1%} slower"
    return "the planner's pick was not measured"


def probed_event(plan: Plan, result: ProbeResult) -> tuple[str, str] | None:
    """(reason, message) of the Event: the winner, and how far the model's pick was from it (or that
    every candidate ran out of memory and the job trains the planner's pick)."""
    if not _usable(plan, result):
        return None
    won = _rate(result, result.winner)
    dropped = [
        f"{m.index} {m.outcome.value}" for m in result.measurements if m.outcome != ProbeOutcome.MEASURED
    ]
    parts = [
        f"probed {len(result.measurements)} candidates in {result.seconds:.0f} s: training with candidate "
        f"{result.winner}" + (f" at {won:,.0f} tokens/s per GPU" if won else ""),
        _verdict(plan, result),
    ]
    if dropped:
        parts.append("dropped: " + ", ".join(dropped))
    if result.stopped_early:
        parts.append("stopped at its time budget")
    return EVENT_REASON, "; ".join(parts)


def _all_failed(result: ProbeResult) -> bool:
    """Whether no candidate was measured within the memory budget (the job trains the pick unmeasured)."""
    return _rate(result, result.winner) is None


def probe_samples(
    meta: Mapping[str, Any], plan: Plan, result: ProbeResult, now: str
) -> tuple[list[Sample], list[str], set[int]]:
    """One measured-over-modelled sample per measured family (the winner for its own family, else the
    first measured candidate of each, in probe order), the model's own figure taken from
    planner.cluster_figures; why any measurement was refused (not physical: the measure loop's rule); and
    the candidates those samples (or refusals) took. Memory ratios come with a CUDA reading.

    The winner's family is keyed by the BTJ's uid, as the measure loop keys the job's own sample, so the
    steady reading of the running job later replaces it (one job, one sample per family, and the winner's
    configuration one memory reading); the others are keyed `<uid>/probe-<index>`."""
    if not _usable(plan, result):
        return [], [], set()
    assert plan.probe is not None
    options = plan.probe.options
    won = options[result.winner].candidate
    won_family = (won.precision_recipe, won.activation_checkpointing)
    samples: list[Sample] = []
    refused: list[str] = []
    families: set[tuple[Any, Any]] = set()
    taken: set[int] = set()
    job = f"{meta.get('namespace')}/{meta.get('name')}"
    winner_first = sorted(result.measurements, key=lambda m: m.index != result.winner)
    for m in winner_first:
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
        taken.add(m.index)
        if problem is not None:  # a misreading teaches nothing (the measure loop's rule)
            refused.append(f"{job} probe candidate {m.index}: {problem}")
            continue
        families.add(family)
        samples.append(sample)
    return samples, refused, taken


def probe_status(
    plan: Plan,
    result: ProbeResult,
    *,
    child_uid: str | None,
    generation: int | None,
    now: str,
    summary: str | None = None,
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
        summary=summary,
    )


def pick_result(plan: Plan, seconds: float = 0.0) -> ProbeResult:
    """The choice a refused result leaves: the planner's pick (candidate 0), nothing measured."""
    assert plan.probe is not None
    return ProbeResult(winner=0, chosen=plan.probe.options[0].candidate, seconds=seconds)


def result_of(status: ProbeStatus) -> ProbeResult:
    """The trainer's ProbeResult that status.probe holds (the plan ConfigMap's copy); for refused figures,
    the planner's pick with nothing measured."""
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


def _kept_result(plan: Plan, kept: ProbeStatus) -> ProbeResult | None:
    """The choice status.probe holds for `plan`'s candidates, or None when they are other candidates
    (a re-plan made them): the trainer's result, or for refused figures the planner's pick."""
    assert plan.probe is not None
    if kept.refused is not None:
        pick = pick_result(plan, kept.seconds)
        return pick if kept.chosen == pick.chosen else None
    result = result_of(kept)
    return result if _usable(plan, result) else None


def with_probe_result(plan: Plan, stored: BlackwellTrainingJobStatus, generation: int) -> Plan:
    """The plan with the choice this generation's probe made (`plan.probe.result`), when the status holds
    one measured among this plan's candidates: the ConfigMap then carries it and a restart trains with it.
    The plan unchanged otherwise (a new generation, or a re-plan that made other candidates, probes anew)."""
    kept = stored.probe
    if plan.probe is None or kept is None or kept.generation != generation:
        return plan
    result = _kept_result(plan, kept)
    if result is None or plan.probe.result == result:
        return plan
    probe = plan.probe.model_copy(update={"result": result})
    return plan.model_copy(update={"probe": probe})


@dataclass(frozen=True)
class ProbePass:
    """What one pod's probe result decides: the status change (None: status.probe holds it already, or
    holds this generation's first result for these candidates), and, when it is new, the Event (`warning`:
    figures refused, or nothing measured within the budget), the calibration samples and memory readings
    (and the refused readings) and the plan the ConfigMap carries with its copy. `problem`: why the
    result was not taken (logged)."""

    change: StatusChange | None = None
    event: tuple[str, str] | None = None
    warning: bool = False
    samples: tuple[Sample, ...] = ()
    readings: tuple[MemoryReading, ...] = ()
    refused: tuple[str, ...] = ()
    plan: Plan | None = None
    problem: str | None = None

    @property
    def new(self) -> bool:
        """Whether the status does not say it yet (its effects are due)."""
        return self.change is not None


def settled(plan: Plan, kept: ProbeStatus | None, generation: int | None) -> bool:
    """Whether status.probe already holds this generation's result for `plan`'s candidates: the first one
    read wins. Every worker of a child reports the same agreed result; a later, different one (a worker
    that disagrees, a replacement child's pod) never replaces it, so the job's choice is made once."""
    return kept is not None and kept.generation == generation and _kept_result(plan, kept) is not None


def _already(plan: Plan, kept: ProbeStatus | None, result: ProbeResult) -> ProbePass:
    """Nothing to do for a result when status.probe settled these candidates: quiet when it is the one
    kept (the same pod's next event, a restarted trainer repeating the kept choice), logged otherwise."""
    assert plan.probe is not None and kept is not None
    options = plan.probe.options
    named = (
        result.model_copy(update={"chosen": options[result.winner].candidate})
        if result.winner < len(options)
        else result
    )
    if _kept_result(plan, kept) == named:
        return ProbePass()
    return ProbePass(
        problem=f"status.probe holds this generation's first result (winner {kept.winner}); a later, "
        "different one is not taken"
    )


def _refused_pass(
    plan: Plan, result: ProbeResult, why: str, *, child_uid: str | None, generation: int | None, now: str
) -> ProbePass:
    """A result with figures no GPU can give: none is kept or taught, the job trains the planner's pick."""
    seconds = result.seconds if math.isfinite(result.seconds) else 0.0
    pick = pick_result(plan, seconds)
    message = f"probe result refused, {why}; training the planner's pick, which is {_pick_line(plan)}"
    status = ProbeStatus(
        winner=0,
        chosen=pick.chosen,
        seconds=seconds,
        child_uid=child_uid,
        generation=generation,
        observed_at=now,
        summary=message,
        refused=why,
    )
    kept = _with_result(plan, pick)
    return ProbePass(
        change=_recorded(status, kept),
        event=(REFUSED_REASON, message),
        warning=True,
        plan=kept,
    )


def _recorded(status: ProbeStatus, kept: Plan) -> StatusChange:
    """status.probe and the plan carrying the result, its printer columns now naming what the job trains."""
    change = StatusChange(probe=status)
    put_plan(change, kept)
    return change


def _with_result(plan: Plan, result: ProbeResult) -> Plan:
    assert plan.probe is not None
    return plan.model_copy(update={"probe": plan.probe.model_copy(update={"result": result})})


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
    generation = stored.observed_generation or meta.get("generation")
    if plan is not None and plan.probe is not None and settled(plan, stored.probe, generation):
        return _already(plan, stored.probe, result)
    if plan is None or plan.probe is None or not _usable(plan, result):
        return ProbePass(problem="its candidates are not those of the stored plan (re-planned since)")
    child_uid = found.uid if found else None
    why = out_of_bounds(plan, result)
    if why is not None:
        return _refused_pass(plan, result, why, child_uid=child_uid, generation=generation, now=now)
    event = probed_event(plan, result)
    status = probe_status(
        plan,
        result,
        child_uid=child_uid,
        generation=generation,
        now=now,
        summary=event[1] if event else None,
    )
    samples, refused, taken = probe_samples(meta, plan, result, now)
    readings, unread = probe_readings(meta, plan, result, taken, now)
    kept = _with_result(plan, result)
    return ProbePass(
        change=_recorded(status, kept),
        event=event,
        warning=_all_failed(result),
        samples=tuple(samples),
        readings=tuple(readings),
        refused=(*refused, *unread),
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
