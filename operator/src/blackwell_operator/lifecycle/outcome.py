"""One reconcile pass's outcome: the status it writes, the Events it posts, when to look again (pure).

handlers/reconcile.py reads, plans, makes the child calls and gathers what it decided into one
PassOutcome; it then posts the Events `events_to_post` keeps and writes status once (`status_change`,
against the status as it is at write time), as KubeRay's and Kubeflow Trainer's reconcilers end a pass
with one status update (docs/reference/reconciler-status-writes.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from blackwell_operator.calibration.cluster import describe_correction
from blackwell_operator.lifecycle.capacity import AwsAnswer, NodeCount, capacity_condition, with_aws_capacity
from blackwell_operator.lifecycle.child_apply import Effects, Notice
from blackwell_operator.lifecycle.child_record import CHILD_DELETED, deleted_child_uid
from blackwell_operator.lifecycle.conditions import (
    ConditionChange,
    find_condition,
    remove_condition,
    set_conditions,
)
from blackwell_operator.lifecycle.global_batch import batch_edit
from blackwell_operator.lifecycle.message import set_message
from blackwell_operator.lifecycle.phase import CHILD_PHASES, child_conditions, child_headline
from blackwell_operator.lifecycle.plan_columns import missing_columns, put_plan
from blackwell_operator.lifecycle.references import CHECKPOINT_PATH_IN_USE, Blocked
from blackwell_operator.lifecycle.replan import REPLANNED_REASON
from blackwell_operator.models.spec import Backend
from blackwell_operator.models.status import (
    PLAN_HISTORY_LIMIT,
    BlackwellTrainingJobStatus,
    ChildReference,
    Condition,
    ConditionType,
    GlobalBatch,
    Phase,
    StatusChange,
)
from blackwell_operator.planner.provenance import plan_event, verdict
from blackwell_operator.render.kinds import ChildKind
from blackwell_operator.units import GIB
from blackwell_trainer.plan.config import Plan

DRY_RUN_MESSAGE = "spec.dryRun is true: planned only, nothing created."
# spec.backend auto and the cluster serves no job API: the condition reason, and when to look again.
NO_JOB_API = "NoJobApi"
NO_JOB_API_RETRY_S = 60.0
NAME_CONFLICT = "ChildNameConflict"


@dataclass(frozen=True)
class SeenChild:
    """The child as this pass last saw it (found, created or patched), and what it is."""

    kind: ChildKind
    obj: Mapping[str, Any]
    config_map: str | None = None

    @property
    def uid(self) -> str | None:
        uid = (self.obj.get("metadata") or {}).get("uid")
        return str(uid) if uid else None


@dataclass(frozen=True)
class Requeue:
    """Look again after `after_s` seconds (the pass is not failed; `message` says why)."""

    after_s: float
    message: str


@dataclass(frozen=True)
class PassOutcome:
    """Everything one reconcile pass decided.

    `invalid`: the spec was refused (Planned False with this condition); the plan, the child and the phase
    are then not known. `phase` is set only for the phases the operator decides itself (Planned, Pending,
    Failed on a name conflict, Invalid); a child's phase comes from the child (`child`), on first sight.
    `error`: the reason the operator's error counter counts for this pass.
    """

    generation: int
    plan: Plan | None = None
    write_plan: bool = True  # False: status.plan keeps describing what actually runs
    phase: Phase | None = None
    message: str = ""
    conditions: tuple[ConditionChange, ...] = ()
    backend: Backend | None = None
    child: SeenChild | None = None
    queue_name: str | None = None
    invalid: ConditionChange | None = None
    events: tuple[Notice, ...] = ()
    requeue: Requeue | None = None
    error: str | None = None
    recreated: bool = False
    # status.globalBatch for `plan` (lifecycle/global_batch.recorded), written with it.
    global_batch: GlobalBatch | None = None

    def adding(
        self, *conditions: ConditionChange, events: tuple[Notice, ...] = (), **fields: Any
    ) -> PassOutcome:
        """This outcome with more conditions and Events, and `fields` replaced."""
        return replace(self, conditions=self.conditions + conditions, events=self.events + events, **fields)

    def recording(self, effects: Effects) -> PassOutcome:
        """This outcome with a child decision's effects (lifecycle/child_apply.py), once its calls went
        through."""
        return self.adding(
            *effects.conditions,
            events=effects.events,
            write_plan=self.write_plan and effects.write_plan,
            recreated=self.recreated or effects.recreated,
        )

    def stopped(self, condition: ConditionChange, phase: Phase | None, message: str = "") -> PassOutcome:
        """The pass ends on `condition` (False, said once as a Warning Event); `phase` and its headline
        `message` when the operator decides the phase."""
        notice = Notice(condition.reason, condition.message, warning=True, once=condition.type)
        return self.adding(condition, events=(notice,), phase=phase, message=message)


def plan_summary(plan: Plan) -> str:
    """One line: the chosen settings and the prediction, with what the prediction rests on beside it (the
    line is pasted into capacity requests: a modelled figure never travels without the word)."""
    chosen, predicted = plan.chosen, plan.predicted
    return (
        f"{plan.model_name} on {plan.nodes}x{plan.gpus_per_node} {plan.gpu.name}: {chosen.precision.value}, "
        f"micro-batch {chosen.micro_batch_size}, AC {chosen.activation_checkpointing.value}, "
        f"{chosen.sharding.value} sharding; predicted{_basis_caveat(plan)} "
        f"{predicted.tokens_per_second_per_gpu:,.0f} tokens/s/GPU, "
        f"MFU {predicted.model_flops_utilization:.0%} of BF16 dense peak, "
        f"peak {predicted.memory.peak_reserved / GIB:.1f} GiB/GPU"
        + (f"; {describe_correction(plan.cluster_correction)}" if plan.cluster_correction else "")
    )


def _basis_caveat(plan: Plan) -> str:
    """Beside a predicted figure: " (modelled, not measured)" unless every choice was measured here."""
    basis = plan.prediction_basis
    if basis == "measured":
        return ""
    if basis == "unknown":
        return " (basis unknown: an older planner's plan)"
    if basis == "unverified":
        return " (modelled, trainer path unverified)"
    return " (modelled, not measured)"


def invalid(generation: int, reason: str, message: str) -> PassOutcome:
    """The spec was refused (admission, or no plan fits): say why once, change nothing that runs."""
    planned = ConditionChange(ConditionType.PLANNED, "False", reason, message)
    return PassOutcome(generation, invalid=planned, error=reason).stopped(planned, None)


def planned(
    plan: Plan,
    generation: int,
    *,
    replanned: bool,
    nodes: NodeCount | None,
    aws: AwsAnswer | None,
    needed: int,
    queue_name: str | None,
) -> PassOutcome:
    """A pass that planned: Planned, PlanVerified (and its Event, once per plan), CapacityAvailable."""
    if replanned:  # the last explanation line says what the memory correction is
        done = ConditionChange(
            ConditionType.PLANNED, "True", REPLANNED_REASON, f"{plan_summary(plan)}; {plan.explanation[-1]}"
        )
    else:
        done = ConditionChange(ConditionType.PLANNED, "True", "Planned", plan_summary(plan))
    verified, reason, message = verdict(plan.provenance)
    provenance = ConditionChange(
        ConditionType.PLAN_VERIFIED, "True" if verified else "False", reason, message
    )
    event_reason, event_message, warning = plan_event(plan.provenance)
    notice = Notice(event_reason, event_message, warning=warning, once=ConditionType.PLAN_VERIFIED)
    capacity = with_aws_capacity(capacity_condition(nodes, needed, queued=queue_name is not None), aws)
    return PassOutcome(generation, plan=plan, queue_name=queue_name).adding(
        done, provenance, capacity, events=(notice,)
    )


def dry_run(outcome: PassOutcome) -> PassOutcome:
    """spec.dryRun: planned, nothing created."""
    assert outcome.plan is not None
    condition = ConditionChange(ConditionType.CHILD_CREATED, "False", "DryRun", DRY_RUN_MESSAGE)
    notice = Notice("Planned", f"Dry run: {plan_summary(outcome.plan)}", once=ConditionType.CHILD_CREATED)
    return outcome.adding(
        condition,
        events=(notice,),
        phase=Phase.PLANNED,
        message=f"Planned (dry run): {plan_summary(outcome.plan)}",
    )


def no_job_api(outcome: PassOutcome, message: str) -> PassOutcome:
    """spec.backend auto and no job API served: Pending, and look again in a minute."""
    condition = ConditionChange(ConditionType.CHILD_CREATED, "False", NO_JOB_API, message)
    stopped = outcome.stopped(condition, Phase.PENDING, message)
    return replace(stopped, requeue=Requeue(NO_JOB_API_RETRY_S, message))


def waiting_for_account(outcome: PassOutcome, blocked: Blocked) -> PassOutcome:
    """The pods' ServiceAccount does not exist, or they may not run as it: nothing is created until it
    does and they may (Pending); a child that exists is left as it is (SpecApplied False, the plan that
    runs kept)."""
    if not blocked.creating:
        changed = ConditionChange(ConditionType.SPEC_APPLIED, "False", blocked.reason, blocked.message)
        return replace(outcome.stopped(changed, outcome.phase, outcome.message), write_plan=False)
    condition = ConditionChange(ConditionType.CHILD_CREATED, "False", blocked.reason, blocked.message)
    return outcome.stopped(condition, Phase.PENDING, f"Waiting for its ServiceAccount: {blocked.message}")


def checkpoint_path_in_use(outcome: PassOutcome, message: str) -> PassOutcome:
    """Another BTJ of the namespace holds the checkpoint folder: nothing is created while it does."""
    condition = ConditionChange(ConditionType.CHILD_CREATED, "False", CHECKPOINT_PATH_IN_USE, message)
    return outcome.stopped(condition, Phase.PENDING, f"Waiting for its checkpoint folder: {message}")


def name_conflict(outcome: PassOutcome, message: str) -> PassOutcome:
    """An object of the child's name is someone else's: the BTJ fails, nothing is touched."""
    condition = ConditionChange(ConditionType.CHILD_CREATED, "False", NAME_CONFLICT, message)
    stopped = outcome.stopped(condition, Phase.FAILED, message)
    return replace(stopped, write_plan=True, error=NAME_CONFLICT)


def refused(outcome: PassOutcome, condition: ConditionChange) -> PassOutcome:
    """The API server refused a create (Pending) or a patch in place (the running job and its plan stay)."""
    if condition.type == ConditionType.CHILD_CREATED:
        message = f"Waiting for the API server to accept the job: {condition.message}"
        stopped = outcome.stopped(condition, Phase.PENDING, message)
    else:
        stopped = replace(outcome.stopped(condition, outcome.phase, outcome.message), write_plan=False)
    return replace(stopped, error=condition.reason)


def events_to_post(outcome: PassOutcome, before: BlackwellTrainingJobStatus) -> tuple[Notice, ...]:
    """The outcome's Events, less each one whose cause the status read before the pass already says.

    A Notice with `once` speaks for the condition of that type this outcome sets: when the stored condition
    carries its reason and message for this generation (a restart, a retry, the resync loop), its Event was
    posted before. One Event per cause, not one per pass.
    """
    said = {c.type: c for c in before.conditions}
    setting = {c.type: c for c in outcome.conditions}
    kept = []
    for notice in outcome.events:
        cause, stored = setting.get(notice.once or ""), said.get(notice.once or "")
        if (
            cause is not None
            and stored is not None
            and (stored.reason, stored.message) == (cause.reason, cause.message)
            and stored.observed_generation == outcome.generation
        ):
            continue
        kept.append(notice)
    return tuple(kept)


def status_change(
    outcome: PassOutcome,
    stored: BlackwellTrainingJobStatus,
    now: str,
    *,
    current_generation: int | None = None,
) -> StatusChange:
    """What the pass writes into the status as it is now (read again at each write attempt, with the BTJ's
    generation then: `current_generation`)."""
    if outcome.invalid is not None:
        return _invalid_change(outcome.invalid, stored, outcome.generation, now)
    change = _planned_change(outcome, stored, now)
    if change.conditions is not None:
        change.conditions = _deletion_stamped(change.conditions, outcome, stored, current_generation)
    return change


def _deletion_stamped(
    conds: list[Condition],
    outcome: PassOutcome,
    stored: BlackwellTrainingJobStatus,
    current_generation: int | None,
) -> list[Condition]:
    """`conds` with this pass's record of a finished child's deletion (ChildCreated False, ChildDeleted)
    stamped as the child watcher stamps its own: the record already stored keeps its generation, a new
    one takes the generation the BTJ has as it is written, not the one this pass read.

    A finished job runs again only on an edit made after that record (child_record.runs_again): an edit
    made while the pass ran came before it, and the pass's older generation would read as one made after.
    """
    if not any(_is_deletion(c.type, c.status, c.reason) for c in outcome.conditions):
        return conds
    before = find_condition(stored.conditions, ConditionType.CHILD_CREATED)
    if before is not None and _is_deletion(before.type, before.status, before.reason):
        generation = before.observed_generation
    else:
        generation = current_generation
    if generation is None:
        return conds
    return [
        c.model_copy(update={"observed_generation": generation})
        if _is_deletion(c.type, c.status, c.reason)
        else c
        for c in conds
    ]


def _is_deletion(type_: str, status: str, reason: str | None) -> bool:
    return (type_, status, reason) == (ConditionType.CHILD_CREATED, "False", CHILD_DELETED)


def _invalid_change(
    condition: ConditionChange, stored: BlackwellTrainingJobStatus, generation: int, now: str
) -> StatusChange:
    conds = set_conditions(stored.conditions, (condition,), generation=generation, now=now)
    change = StatusChange(observed_generation=generation)
    child_uid = stored.child.uid if stored.child is not None else None
    if child_uid and stored.phase in CHILD_PHASES:  # the running job is untouched; say why the spec is not
        conds = set_conditions(
            conds, (replace(condition, type=ConditionType.SPEC_APPLIED),), generation=generation, now=now
        )
    else:
        conds = remove_condition(conds, ConditionType.PLAN_VERIFIED)  # no plan: nothing to verify
        change.phase = Phase.INVALID
        set_message(change, condition.message, change.phase)
        change.plan = change.precision = change.micro_batch_size = change.nodes = None
        change.activation_checkpointing = None
    change.conditions = conds
    return change


def _planned_change(outcome: PassOutcome, stored: BlackwellTrainingJobStatus, now: str) -> StatusChange:
    generation, seen = outcome.generation, outcome.child
    # The child watcher saw the very child this pass found or created deleted, after this pass saw it (a
    # race with a hand deletion): keep its report, so that recreate-child brings the child back.
    known_gone = seen is not None and seen.uid is not None and deleted_child_uid(stored) == seen.uid
    conditions = (c for c in outcome.conditions if not (known_gone and c.type == ConditionType.CHILD_CREATED))
    conds = set_conditions(stored.conditions, conditions, generation=generation, now=now)
    change = StatusChange(observed_generation=generation)
    if outcome.backend is not None and stored.backend != outcome.backend.value:
        change.backend = outcome.backend.value
    plan = outcome.plan
    if plan is not None and (outcome.write_plan or stored.plan is None):
        put_plan(change, plan)
        _record_batch(change, outcome.global_batch, stored, plan, now)
    else:
        missing_columns(change, stored)
    if outcome.phase is not None:
        change.phase = outcome.phase
        set_message(change, outcome.message, change.phase)  # no worker failure: its own phases
    if seen is not None:
        conds = _first_sight(change, conds, outcome, seen, stored, now)
    change.conditions = conds
    return change


def _record_batch(
    change: StatusChange, batch: GlobalBatch | None, stored: BlackwellTrainingJobStatus, plan: Plan, now: str
) -> None:
    """status.globalBatch with the plan it describes, and a user's edit that changed it in planHistory."""
    if batch is None:
        return
    change.global_batch = batch
    entry = batch_edit(stored.global_batch, batch, stored.plan, plan, at=now)
    if entry is not None:
        change.plan_history = [*stored.plan_history, entry][-PLAN_HISTORY_LIMIT:]


def _first_sight(
    change: StatusChange,
    conds: list[Condition],
    outcome: PassOutcome,
    seen: SeenChild,
    stored: BlackwellTrainingJobStatus,
    now: str,
) -> list[Condition]:
    """status.child from the child this pass saw; its phase and conditions when the status does not know
    it yet."""
    name = str(seen.obj["metadata"]["name"])
    change.child = ChildReference(
        api_version=seen.kind.api_version,
        kind=seen.kind.kind,
        name=name,
        uid=seen.uid,
        config_map=seen.config_map,
    )
    recorded = stored.child.uid if stored.child is not None else None
    same_child = recorded == seen.uid
    if recorded and not same_child and stored.last_failure is not None:
        # A new child (a spec change after a failure, a re-create): the previous child's worker failure
        # would read as this one's in the message and the Event trail.
        change.last_failure = None
    if same_child and stored.phase in CHILD_PHASES:
        # Afterwards the child watcher owns phase and the child conditions (it sees every change; this pass
        # may hold an older copy).
        return conds
    child_status = seen.obj.get("status")
    phase, conds = child_conditions(
        conds,
        child_status,
        generation=outcome.generation,
        now=now,
        queue_name=outcome.queue_name,
        child_kind=seen.kind.kind,
    )
    change.phase = phase
    # First sight: the message is the child's alone (its lastFailure is the child watcher's).
    set_message(change, child_headline(phase, seen.kind.kind, name, child_status), phase)
    return conds
