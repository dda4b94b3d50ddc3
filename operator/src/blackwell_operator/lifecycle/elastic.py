"""Pure resizing of an elastic job: when its healthy nodes change, whether to re-plan, and the status.

A count below the plan's for the grace period (HyperPod had that long to replace the node) shrinks the job;
with scaleUp, more nodes for the grace period grow it. At most one resize per cooldown (no flapping), and
fewer nodes than minNodes wait, as a fixed job does. The re-plan keeps the global batch and the learning-rate
schedule (planner/elastic.py); the child is re-created from the last checkpoint, as after an out-of-memory
re-plan (replan.py).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from blackwell_operator.lifecycle.conditions import set_condition
from blackwell_operator.lifecycle.message import set_message
from blackwell_operator.lifecycle.replan import RESIZED, candidate_line, generation_of
from blackwell_operator.lifecycle.status_read import read_status
from blackwell_operator.models.spec import ElasticSpec
from blackwell_operator.models.status import (
    PLAN_HISTORY_LIMIT,
    BlackwellTrainingJobStatus,
    ConditionType,
    ElasticStatus,
    Phase,
    PlanChange,
    StatusChange,
)
from blackwell_operator.timefmt import format_rfc3339, rfc3339_seconds
from blackwell_trainer.plan.config import NodeChoice, Plan

# Phases in which the job holds (or is about to hold) its nodes: a resize re-creates its child.
ELASTIC_PHASES = frozenset({Phase.PENDING, Phase.QUEUED, Phase.RUNNING, Phase.RESTARTING})


class Action(StrEnum):
    """What the resize check concludes."""

    STAY = "stay"  # the nodes hold the plan (or may not change it): nothing to do
    WAIT = "wait"  # a change is seen but not acted on yet (grace period, cooldown, minNodes)
    RESIZE = "resize"  # re-plan for `Decision.target` nodes


@dataclass(frozen=True)
class Decision:
    """The check's conclusion, the node count to re-plan for, why, and the timeline to store."""

    action: Action
    target: int | None
    reason: str
    elastic: ElasticStatus


def _since(stamp: str | None, now: datetime.datetime) -> float:
    seconds = rfc3339_seconds(stamp) if stamp else None
    return 0.0 if seconds is None else now.timestamp() - seconds


def decide(
    elastic: ElasticSpec,
    plan_nodes: int,
    schedulable: int,
    stored: ElasticStatus | None,
    now: datetime.datetime,
) -> Decision:
    """Whether an elastic job planned for `plan_nodes` re-plans now that `schedulable` healthy nodes of its
    instance type exist (`stored`: the timeline written by earlier checks)."""
    seen = (stored or ElasticStatus()).model_copy()
    seen.schedulable = schedulable
    stamp = format_rfc3339(now)
    target = min(elastic.max_nodes, schedulable)
    if schedulable < plan_nodes:
        seen.more_since = None
        seen.fewer_since = seen.fewer_since or stamp
        direction, waited = "fewer", _since(seen.fewer_since, now)
    elif target > plan_nodes and elastic.scale_up:
        seen.fewer_since = None
        seen.more_since = seen.more_since or stamp
        direction, waited = "more", _since(seen.more_since, now)
    else:
        seen.fewer_since = seen.more_since = None
        why = "the healthy nodes hold the plan"
        if target > plan_nodes:
            why = f"{schedulable} nodes are schedulable, but spec.cluster.elastic.scaleUp is off"
        seen.waiting = ""
        return Decision(Action.STAY, None, why, seen)

    def wait(why: str) -> Decision:
        seen.waiting = why
        return Decision(Action.WAIT, None, why, seen)

    have = f"{schedulable} of the plan's {plan_nodes} nodes schedulable"
    if direction == "fewer" and target < elastic.min_nodes:
        return wait(f"{have}, fewer than minNodes {elastic.min_nodes}: the job waits for nodes")
    grace = elastic.grace_period_seconds
    if waited < grace:
        return wait(
            f"{schedulable} nodes schedulable, the plan has {plan_nodes}: re-planned for {target} if it "
            f"lasts the grace period ({waited:.0f} of {grace} s)"
        )
    since_resize = _since(seen.last_resize_at, now) if seen.last_resize_at else None
    if since_resize is not None and since_resize < elastic.cooldown_seconds:
        return wait(
            f"{schedulable} nodes schedulable, the plan has {plan_nodes}: the last resize was "
            f"{since_resize:.0f} s ago, the cooldown is {elastic.cooldown_seconds} s"
        )
    seen.waiting = ""
    return Decision(Action.RESIZE, target, f"{schedulable} nodes schedulable for {waited:.0f} s", seen)


def stored_choice(
    btj: Mapping[str, Any], stored: BlackwellTrainingJobStatus | None = None
) -> NodeChoice | None:
    """The node choice of the stored plan, when it belongs to the BTJ's current spec generation: every
    later pass plans the same count (only a resize changes it). None: plan from the healthy nodes.
    `stored`: the BTJ's status as the caller parsed it (a reconcile pass parses it once)."""
    status = btj.get("status") or {}
    generation = int((btj.get("metadata") or {}).get("generation") or 1)
    if status.get("observedGeneration") != generation:
        return None
    plan = (stored if stored is not None else read_status(status).status).plan
    return plan.elastic if plan is not None else None


def resize_changes(
    btj: Mapping[str, Any],
    decision: Decision,
    replan: Callable[[int], Plan],
    *,
    now: str,
) -> tuple[StatusChange, PlanChange | None]:
    """The status change of one check: the timeline only, or with a resize the new plan (from
    `replan(target)`, which may choose fewer nodes when the target does not divide the global batch),
    the history entry, phase Restarting and the message (the caller then deletes the child, and the
    re-create path makes the new one from status.plan). The entry is None when nothing was resized."""
    status = btj.get("status") or {}
    stored = read_status(status).status
    change = StatusChange(elastic=decision.elastic)
    old = stored.plan
    if decision.action is not Action.RESIZE or decision.target is None or old is None:
        return change, None
    plan = replan(decision.target)
    if plan.nodes == old.nodes:
        decision.elastic.waiting = (
            f"{decision.reason}, but {decision.target} nodes plan as {plan.nodes}, the current count"
        )
        return change, None
    child = status.get("child") or {}
    generation = generation_of(btj)
    message = (
        f"Resized from {old.nodes} to {plan.nodes} nodes ({decision.reason}): global batch "
        f"{plan.global_batch_tokens:,} tokens kept, now {candidate_line(plan.chosen)}, gradient "
        f"accumulation {plan.chosen.gradient_accumulation_steps}; {child.get('kind', 'job')} "
        f"{child.get('name', '')} is re-created from the last checkpoint"
    )
    entry = PlanChange(
        at=now,
        generation=generation,
        reason=RESIZED,
        message=message,
        failed=old.chosen,
        failed_summary=f"{old.nodes} nodes: {candidate_line(old.chosen)}",
        failed_child_uid=child.get("uid"),
        replacement=plan.chosen,
        replacement_summary=f"{plan.nodes} nodes: {candidate_line(plan.chosen)}",
        nodes_before=old.nodes,
        nodes_after=plan.nodes,
    )
    decision.elastic.last_resize_at = now
    decision.elastic.resizes += 1
    decision.elastic.fewer_since = decision.elastic.more_since = None
    change.elastic = decision.elastic
    change.conditions = set_condition(
        stored.conditions, ConditionType.PLANNED, "True", RESIZED, message, generation=generation, now=now
    )
    change.phase = Phase.RESTARTING
    set_message(change, message, Phase.RESTARTING)
    change.plan_history = [*stored.plan_history, entry][-PLAN_HISTORY_LIMIT:]
    change.plan = plan
    change.nodes = plan.nodes
    change.precision = plan.chosen.precision.value
    change.micro_batch_size = plan.chosen.micro_batch_size
    change.activation_checkpointing = plan.chosen.activation_checkpointing.value
    return change, entry
