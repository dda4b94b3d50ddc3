"""Pure re-planning after an out-of-memory run: learn the correction, plan again or fail (a status change)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from blackwell_operator.admission.job import Rejected, validate_body
from blackwell_operator.calibration.cluster import frozen
from blackwell_operator.errors import SpecError
from blackwell_operator.lifecycle.conditions import set_condition
from blackwell_operator.lifecycle.global_batch import kept_tokens
from blackwell_operator.lifecycle.message import set_message
from blackwell_operator.lifecycle.phase import fail
from blackwell_operator.lifecycle.plan_columns import put_plan
from blackwell_operator.lifecycle.status_read import StatusLike, read_status, typed
from blackwell_operator.models.status import (
    PLAN_HISTORY_LIMIT,
    BlackwellTrainingJobStatus,
    ConditionType,
    MemoryCorrection,
    Phase,
    PlanChange,
    StatusChange,
    WorkerFailure,
)
from blackwell_operator.planner import plan_job
from blackwell_operator.planner.correction import learn
from blackwell_operator.units import GIB
from blackwell_trainer.plan.config import Candidate, OomResult, Plan

# The Planned condition's reason while a re-planned job replaces its child.
REPLANNED_REASON = "Replanned"
OUT_OF_MEMORY = "OutOfMemory"
# The reason of a re-plan for another node count (an elastic job: lifecycle/elastic.py).
RESIZED = "Resized"
# What a user can change when re-planning is spent or nothing fits any more.
WHAT_TO_CHANGE = (
    "pin a smaller spec.tuning.microBatchSize, set spec.tuning.activationCheckpointing to full, raise "
    "spec.tuning.memoryHeadroom, or add nodes (spec.cluster.nodes); a spec change starts a new job"
)


def candidate_line(candidate: Candidate, peak_reserved: int | None = None) -> str:
    """One configuration in a few words (and its predicted peak)."""
    text = (
        f"{candidate.precision.value}, micro-batch {candidate.micro_batch_size}, AC "
        f"{candidate.activation_checkpointing.value}, {candidate.sharding.value} sharding"
    )
    if candidate.context_parallel > 1:
        text += f", context parallel {candidate.context_parallel}"
    return f"{text} (predicted {peak_reserved / GIB:.1f} GiB)" if peak_reserved is not None else text


def generation_of(btj: Mapping[str, Any]) -> int:
    """The spec generation the status describes."""
    stored = read_status(btj.get("status")).status
    return int(stored.observed_generation or (btj.get("metadata") or {}).get("generation") or 1)


# What a memory correction was learned for: what sets how much memory a configuration takes. A spec edit
# that changes one of them makes the measurements say nothing of the new job; any other edit (steps,
# learning rate, data, a micro-batch or checkpointing pin, maxReplans, labels) keeps the correction, the
# configurations that ran out and the re-plan count (docs/replan.md, "Lifetime of a correction").
LEARNED_FOR = (
    ("model",),
    ("cluster", "instanceType"),
    ("cluster", "nodes"),
    ("training", "sequenceLength"),
    ("tuning", "precision"),
    ("image",),
)


def learned_for(spec: Any) -> str:
    """The fingerprint of a spec's LEARNED_FOR fields (a missing precision reads as its default, auto)."""
    picked: dict[str, Any] = {}
    for path in LEARNED_FOR:
        value: Any = spec if isinstance(spec, Mapping) else {}
        for key in path:
            value = value.get(key) if isinstance(value, Mapping) else None
        if path == ("tuning", "precision") and value is None:
            value = "auto"
        picked[".".join(path)] = value
    text = json.dumps(picked, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def correction_of(
    btj: Mapping[str, Any], stored: BlackwellTrainingJobStatus | None = None
) -> MemoryCorrection | None:
    """status.memoryCorrection when it applies to the BTJ's current spec: learned on this generation, or
    on an earlier one whose LEARNED_FOR fields this spec keeps (then rebased onto this generation, so that
    a later out-of-memory run adds to it and its re-plan count goes on). Else None.

    One written by another version, or by hand, that does not read is left out (lifecycle/status_read.py):
    the job is planned without it rather than failed. `stored`: the BTJ's status as the caller parsed it
    (a reconcile pass parses it once); parsed here otherwise.
    """
    correction = (stored if stored is not None else read_status(btj.get("status")).status).memory_correction
    if correction is None:
        return None
    generation = int((btj.get("metadata") or {}).get("generation") or 1)
    if correction.generation == generation:
        return correction
    if correction.learned_for is not None and correction.learned_for == learned_for(btj.get("spec")):
        return correction.model_copy(update={"generation": generation})
    return None


# The re-plans that replace the child: their record in status.planHistory is the replacement's intent.
REPLACING_REASONS = frozenset({OUT_OF_MEMORY, RESIZED})


def _replan_record(stored: BlackwellTrainingJobStatus) -> PlanChange | None:
    """The latest re-plan that replaces the child (an entry of another kind is history, not an intent)."""
    return next((e for e in reversed(stored.plan_history) if e.reason in REPLACING_REASONS), None)


def replaced_child_uid(status: StatusLike) -> str | None:
    """The uid of the child a re-plan is replacing, while it is still the recorded one: the replacement's
    unfinished intent (None when there is none).

    A re-plan (an out-of-memory one, a resize) is several requests: the status write that records the new
    plan with its planHistory entry, the DELETE of the child that ran the old plan, the create of the
    child of the new plan, the status write that records it. The entry, written first, names the stale
    child (failedChildUid) and the new plan is status.plan: until status.child names another child,
    every pass (the resync loop, a re-create, a restarted operator) drives the rest to its end
    (lifecycle/child_apply.py deletes the stale child, then creates the planned one).
    """
    stored = typed(status)
    child_uid = stored.child.uid if stored.child is not None else None
    last = _replan_record(stored)
    if last is None or not child_uid or last.replacement is None or last.failed_child_uid != child_uid:
        return None
    return child_uid


def replacing_child(status: StatusLike) -> bool:
    """Whether the recorded child is one a re-plan is replacing (its phases no longer speak for the BTJ)."""
    return replaced_child_uid(status) is not None


def resized_child(status: StatusLike) -> bool:
    """Whether the child being replaced is replaced for another node count (not for memory)."""
    stored = typed(status)
    last = _replan_record(stored)
    return replacing_child(stored) and last is not None and last.reason == RESIZED


def oom_of(failure: Mapping[str, Any] | None) -> OomResult | None:
    """The out-of-memory result of a recorded worker failure, if it has one."""
    raw = (failure or {}).get("outOfMemory")
    if not raw:
        return None
    try:
        return OomResult.model_validate(raw)
    except ValueError:
        return None


def _measured(result: OomResult) -> str:
    where = "setup" if result.step == 0 else f"{result.phase.value} of step {result.step}"
    return (
        f"CUDA out of memory in {where}: at least {result.needed_bytes / GIB:.1f} GiB needed, "
        f"{result.predicted_peak_reserved_bytes / GIB:.1f} GiB predicted"
    )


def replan_changes(
    btj: Mapping[str, Any], failure: Mapping[str, Any], result: OomResult, *, failed_reason: str, now: str
) -> tuple[StatusChange, PlanChange]:
    """The BTJ status change after its worker ran out of GPU memory, and the history entry it adds.

    With re-plans left and a plan that fits the corrected memory model: the new plan, the correction and
    the history, phase Restarting (the caller deletes the child and the reconcile path re-creates it from
    this plan). Otherwise: phase Failed, its condition's reason `failed_reason`, naming what to change.
    `now` (metav1.Time) stamps the history entry and the conditions. The caller checks that status.plan
    reads (a ValueError otherwise).
    """
    status = btj.get("status") or {}
    stored = read_status(status).status
    name = (btj.get("metadata") or {}).get("name", "btj")
    generation = generation_of(btj)
    if stored.plan is None:
        raise ValueError("status.plan is missing or unreadable: nothing to re-plan from")
    failed = stored.plan
    current = correction_of(btj)  # applies to this spec: on top of it, whichever generation it was from
    current = None if current is None else current.model_copy(update={"generation": generation})
    correction = learn(current, result, failed, generation=generation)
    correction.learned_for = learned_for(btj.get("spec"))
    child = status.get("child") or {}  # read leniently: a child recorded without apiVersion names its uid
    entry = PlanChange(
        at=now,
        generation=generation,
        reason=OUT_OF_MEMORY,
        message=_measured(result),
        failed=failed.chosen,
        failed_summary=candidate_line(failed.chosen, failed.predicted.memory.peak_reserved),
        failed_child_uid=child.get("uid"),
    )
    plan: Plan | None = None
    why = ""
    try:
        spec = validate_body(btj)
        limit = spec.tuning.max_replans
        if correction.replans > limit:
            why = (
                f"it ran out of GPU memory after {limit} re-plan{'s' if limit != 1 else ''} "
                f"(spec.tuning.maxReplans {limit})"
            )
        else:
            # The cluster's measured factors the failed plan was made with stay (calibration/cluster.py).
            same_cluster = frozen(failed.cluster_correction)
            # An elastic job keeps its node count: only the memory changed.
            plan = plan_job(
                spec,
                job_name=name,
                correction=correction,
                cluster=same_cluster,
                current=failed.elastic,
                # The global batch stays the job's (status.globalBatch): only the micro-batch moves.
                global_batch=kept_tokens(spec, stored, generation),
            )
    except Rejected as exc:
        why = f"the spec no longer passes admission ({exc.lines[0]})"
    except SpecError as exc:
        why = f"no configuration fits the corrected memory model: {exc.message}"
    change = StatusChange(
        last_failure=WorkerFailure.model_validate(failure),
        memory_correction=correction,
    )
    history = stored.plan_history  # the entry goes last once it is complete
    if plan is None:
        message = f"{_measured(result)} with {entry.failed_summary}, and {why}. Fix: {WHAT_TO_CHANGE}"
        change.plan_history = [*history, entry][-PLAN_HISTORY_LIMIT:]
        return fail(change, stored.conditions, failed_reason, message, generation=generation, now=now), entry
    entry.replacement = plan.chosen
    entry.replacement_summary = candidate_line(plan.chosen, plan.predicted.memory.peak_reserved)
    what = f"{child.get('kind', 'job')} {child.get('name', name)}"
    message = (
        f"Re-planning ({correction.replans} of {spec.tuning.max_replans}): {_measured(result)} with "
        f"{entry.failed_summary}; the new plan is {entry.replacement_summary}; {what} is re-created with it"
    )
    conds = set_condition(
        stored.conditions,
        ConditionType.PLANNED,
        "True",
        REPLANNED_REASON,
        message,
        generation=generation,
        now=now,
    )
    change.phase, change.conditions = Phase.RESTARTING, conds
    set_message(change, message, Phase.RESTARTING)  # the failure is in the headline already
    change.plan_history = [*history, entry][-PLAN_HISTORY_LIMIT:]
    put_plan(change, plan)
    return change, entry
