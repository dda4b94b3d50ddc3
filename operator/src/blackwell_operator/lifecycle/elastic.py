"""Pure resizing of an elastic job: when its healthy nodes change, whether to re-plan, and the status.

Fewer nodes not lost than the plan's shrink the job, a node counting as lost only once it has been gone for
the whole grace period (HyperPod had that long to replace it; node_loss.py); with scaleUp, more nodes up for
the whole grace period grow it, into nodes other workloads leave free only. At most one resize per
cooldown, and fewer nodes than minNodes wait, as a fixed job does. The re-plan keeps the global batch and
the learning-rate schedule (planner/elastic.py); the child is re-created from the last checkpoint, as after
an out-of-memory re-plan (replan.py).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from blackwell_operator.lifecycle.conditions import set_condition
from blackwell_operator.lifecycle.message import set_message
from blackwell_operator.lifecycle.node_loss import NodeTimes
from blackwell_operator.lifecycle.plan_columns import put_plan
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
class Room:
    """Where a grown job could run now: the nodes free for it (those its own pods hold included; None: not
    known, `why` says why) and those other workloads' pods hold (a count only)."""

    free: int | None
    held: int = 0
    why: str = ""


@dataclass(frozen=True)
class Decision:
    """The check's conclusion, the node count to re-plan for, why, and the timeline to store."""

    action: Action
    target: int | None
    reason: str
    elastic: ElasticStatus


def _stamp(seconds: float | None) -> str | None:
    return None if seconds is None else format_rfc3339(datetime.datetime.fromtimestamp(seconds, datetime.UTC))


def decide(
    elastic: ElasticSpec,
    plan_nodes: int,
    nodes: NodeTimes,
    stored: ElasticStatus | None,
    now: datetime.datetime,
    room: Room | None = None,
) -> Decision:
    """Whether an elastic job planned for `plan_nodes` re-plans, given each node of its instance type with
    since when it has been up or down (`stored`: the status written by earlier checks).

    The count a shrink plans for is the nodes not lost: a node counts as lost only once it has been down
    for the whole grace period, so a node that flaps faster than that never resizes the job; a shrink
    waits while another node is down but not lost yet. A scale-up counts the nodes up for the whole grace
    period, and no more than `room` has free (None: not checked): the child is deleted only for a count
    the free nodes hold, never for nodes other workloads hold, nor while the free nodes are unknown."""
    seen = (stored or ElasticStatus()).model_copy()
    moment, grace = now.timestamp(), elastic.grace_period_seconds
    seen.schedulable = nodes.up()
    not_lost = nodes.not_lost(grace, moment, plan_nodes)
    settled = min(elastic.max_nodes, nodes.settled(grace, moment))
    seen.fewer_since = _stamp(nodes.first_down(grace, moment)) if seen.schedulable < plan_nodes else None
    growing = elastic.scale_up and min(elastic.max_nodes, seen.schedulable) > plan_nodes
    seen.more_since = _stamp(nodes.first_up(grace, moment)) if growing else None

    def wait(why: str) -> Decision:
        seen.waiting = why
        return Decision(Action.WAIT, None, why, seen)

    if not_lost < plan_nodes:
        target = min(elastic.max_nodes, not_lost)
        reason = f"{not_lost} nodes not lost (lost: gone for the whole grace period of {grace} s)"
        pending = nodes.first_down(grace, moment)
        if pending is not None:
            # Another node is down but not lost yet: it is back or lost within the grace period, and then
            # one resize covers both (nodes lost a moment apart do not resize the job twice).
            return wait(
                f"{reason}; re-planned once the nodes down for less than the grace period are back or "
                f"lost ({moment - pending:.0f} of {grace} s)"
            )
        if target < elastic.min_nodes:
            return wait(
                f"{not_lost} of the plan's {plan_nodes} nodes not lost, fewer than minNodes "
                f"{elastic.min_nodes}: the job waits for nodes"
            )
    elif elastic.scale_up and settled > plan_nodes:
        target = settled
        reason = f"{settled} nodes schedulable for the whole grace period of {grace} s"
        if room is not None and room.free is None:
            return wait(f"{reason}; not grown: {room.why}")
        if room is not None and room.free is not None and room.free < target:
            target = room.free
            reason += f", {room.free} of them free ({room.held} held by other workloads)"
            if target <= plan_nodes:
                return wait(f"{reason}: the job grows when other workloads free nodes")
    else:
        return _unchanged(elastic, plan_nodes, seen, moment)
    since_resize = _seconds_since(seen.last_resize_at, moment)
    if since_resize is not None and since_resize < elastic.cooldown_seconds:
        return wait(
            f"{reason}: re-planned for {target} when the cooldown has passed (the last resize was "
            f"{since_resize:.0f} s ago, the cooldown is {elastic.cooldown_seconds} s)"
        )
    seen.waiting = ""
    return Decision(Action.RESIZE, target, reason, seen)


def _seconds_since(stamp: str | None, moment: float) -> float | None:
    seconds = rfc3339_seconds(stamp) if stamp else None
    return None if seconds is None else moment - seconds


def _unchanged(elastic: ElasticSpec, plan_nodes: int, seen: ElasticStatus, moment: float) -> Decision:
    """No resize: the nodes hold the plan, or a change has not lasted the grace period yet (said in
    status.elastic.waiting)."""
    grace, up = elastic.grace_period_seconds, seen.schedulable or 0
    for since, what in ((seen.fewer_since, "down"), (seen.more_since, "up")):
        waited = _seconds_since(since, moment)
        if waited is not None:
            seen.waiting = (
                f"{up} nodes schedulable, the plan has {plan_nodes}: a node {what} counts once it has been "
                f"{what} for the whole grace period ({waited:.0f} of {grace} s)"
            )
            return Decision(Action.WAIT, None, seen.waiting, seen)
    seen.waiting = ""
    why = "the healthy nodes hold the plan"
    if min(elastic.max_nodes, up) > plan_nodes and not elastic.scale_up:
        why = f"{up} nodes are schedulable, but spec.cluster.elastic.scaleUp is off"
    return Decision(Action.STAY, None, why, seen)


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
    put_plan(change, plan)
    return change, entry
