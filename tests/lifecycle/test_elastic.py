"""The pure resize decision of an elastic job: each node lost only when gone for the whole grace period,
cooldown, minNodes, scaleUp, and the status a resize writes (same global batch, history, phase Restarting).
Explicit times: no sleeps."""

from __future__ import annotations

import datetime
import itertools
from typing import Any

import pytest

from blackwell_operator.lifecycle.elastic import Action, Room, decide, resize_changes, stored_choice
from blackwell_operator.lifecycle.node_loss import NodeClock, NodeState, NodeTimes
from blackwell_operator.lifecycle.replan import RESIZED, replacing_child, resized_child
from blackwell_operator.models.spec import BlackwellTrainingJobSpec, ElasticSpec
from blackwell_operator.models.status import ElasticStatus, Phase
from blackwell_operator.planner import plan_job
from blackwell_operator.planner.elastic import at_nodes
from blackwell_operator.timefmt import format_rfc3339
from tests.support.manifests import B200, labelled_node

T0 = datetime.datetime(2026, 12, 1, 12, 0, 0, tzinfo=datetime.UTC)

RANGE = ElasticSpec(min_nodes=2, max_nodes=4, grace_period_seconds=60, scale_up=True, cooldown_seconds=300)


def at(seconds: float) -> datetime.datetime:
    return T0 + datetime.timedelta(seconds=seconds)


def node(index: int, health: str = "Schedulable") -> dict[str, Any]:
    return labelled_node(f"hyperpod-i-{index:03d}", B200, health=health)


def nodes(*states: NodeState) -> NodeTimes:
    """The clock's view: `states`, watched since long before T0."""
    return NodeTimes(states, at(-86400).timestamp())


def up(count: int, since: float = -3600) -> tuple[NodeState, ...]:
    return tuple(NodeState(True, at(since).timestamp()) for _ in range(count))


def down(since: float) -> NodeState:
    return NodeState(False, at(since).timestamp(), "sagemaker.amazonaws.com/node-health-status=Unschedulable")


def test_a_lost_node_shrinks_the_job_only_after_the_grace_period() -> None:
    one_down = nodes(*up(3), down(0))
    first = decide(RANGE, 4, one_down, None, at(0))
    assert first.action is Action.WAIT and first.elastic.fewer_since == format_rfc3339(at(0))
    assert "a node down counts once it has been down for the whole grace period (0 of 60 s)" in first.reason
    later = decide(RANGE, 4, one_down, first.elastic, at(59))
    assert later.action is Action.WAIT
    due = decide(RANGE, 4, one_down, later.elastic, at(60))
    assert due.action is Action.RESIZE and due.target == 3
    assert due.reason == "3 nodes not lost (lost: gone for the whole grace period of 60 s)"


def test_a_node_back_within_the_grace_period_changes_nothing_and_starts_its_clock_again() -> None:
    lost = decide(RANGE, 4, nodes(*up(3), down(0)), None, at(0))
    back = decide(RANGE, 4, nodes(*up(3), NodeState(True, at(30).timestamp())), lost.elastic, at(30))
    assert back.action is Action.STAY and back.elastic.fewer_since is None and back.elastic.waiting == ""
    # Down again at 70: 59 s down since then is not the grace period, whatever happened before.
    again = decide(RANGE, 4, nodes(*up(3), down(70)), back.elastic, at(129))
    assert again.action is Action.WAIT and "(59 of 60 s)" in again.reason


def test_nodes_lost_a_moment_apart_resize_the_job_once() -> None:
    # Two nodes down 10 ms apart: at the check between their grace periods' ends one is lost, the other
    # is about to be; one resize, to 2, once both are, not 4 -> 3 -> 2.
    apart = nodes(*up(2), down(0), down(0.01))
    between = decide(RANGE, 4, apart, None, at(60.005))
    assert between.action is Action.WAIT and "back or lost (60 of 60 s)" in between.reason
    both = decide(RANGE, 4, apart, between.elastic, at(60.01))
    assert both.action is Action.RESIZE and both.target == 2


def test_fewer_than_min_nodes_waits_as_a_fixed_job_does() -> None:
    three_down = nodes(*up(1), down(0), down(0), down(0))
    decision = decide(RANGE, 4, three_down, None, at(0))
    later = decide(RANGE, 4, three_down, decision.elastic, at(3600))
    assert later.action is Action.WAIT and later.target is None
    assert later.reason == "1 of the plan's 4 nodes not lost, fewer than minNodes 2: the job waits for nodes"
    assert later.elastic.waiting == later.reason


def test_more_nodes_grow_the_job_only_with_scale_up_and_once_up_for_the_grace_period() -> None:
    off = RANGE.model_copy(update={"scale_up": False})
    assert decide(off, 2, nodes(*up(4)), None, at(0)).action is Action.STAY
    assert "scaleUp is off" in decide(off, 2, nodes(*up(4)), None, at(0)).reason
    six = nodes(*up(2), *up(4, since=0))
    seen = decide(RANGE, 2, six, None, at(0))
    assert seen.action is Action.WAIT and seen.elastic.more_since == format_rfc3339(at(0))
    grow = decide(RANGE, 2, six, seen.elastic, at(60))
    assert grow.action is Action.RESIZE and grow.target == 4  # at most maxNodes


def test_a_scale_up_grows_only_into_free_nodes_and_never_while_they_are_unknown() -> None:
    """Issue 36: nodes up for the grace period but held by other workloads are no room to grow into; the
    running child is deleted only for a count the free nodes (its own pods' included) hold."""
    four = nodes(*up(4))
    held = decide(RANGE, 3, four, None, at(0), Room(free=3, held=1))
    assert held.action is Action.WAIT and held.target is None
    assert held.elastic.waiting == (
        "4 nodes schedulable for the whole grace period of 60 s, 3 of them free (1 held by other "
        "workloads): the job grows when other workloads free nodes"
    )
    # Two of four free for a job on two: it grows to the free ones, not to the four up.
    partly = decide(RANGE, 2, four, None, at(0), Room(free=3, held=1))
    assert partly.action is Action.RESIZE and partly.target == 3
    assert decide(RANGE, 3, four, None, at(0), Room(free=4)).target == 4
    unknown = decide(RANGE, 3, four, None, at(0), Room(None, why="free GPUs not read (HTTP 403)"))
    assert unknown.action is Action.WAIT
    assert unknown.reason.endswith("not grown: free GPUs not read (HTTP 403)")
    # A shrink is never held by the room: the job's own nodes are the ones it is on.
    lost = decide(RANGE, 4, nodes(*up(3), down(-120)), None, at(0), Room(free=0, held=4))
    assert lost.action is Action.RESIZE and lost.target == 3


def test_the_cooldown_holds_a_resize_that_follows_another() -> None:
    after = ElasticStatus(last_resize_at=format_rfc3339(at(0)), resizes=1)
    four = nodes(*up(4))
    seen = decide(RANGE, 3, four, after, at(10))
    held = decide(RANGE, 3, four, seen.elastic, at(100))
    assert held.action is Action.WAIT and "the cooldown is 300 s" in held.reason
    assert decide(RANGE, 3, four, held.elastic, at(300)).action is Action.RESIZE


def flapping(period_down_s: int, period_up_s: int, *, check_every_s: int) -> list[int]:
    """An hour of node 3 down for `period_down_s`, back for `period_up_s`, again and again, every change
    given to the clock as the watch gives it, the job checked every `check_every_s`: when it resized."""
    clock = NodeClock(at(-60).timestamp())
    for index in range(4):
        clock.observe(node(index), at(-60).timestamp())
    changes, t, healthy = [], 0, False
    while t < 3600:
        changes.append((t, healthy))
        t += period_down_s if not healthy else period_up_s
        healthy = not healthy
    plan, stored, resized_at = 4, None, []
    for check in range(0, 3600, check_every_s):
        while changes and changes[0][0] <= check:
            when, healthy = changes.pop(0)
            clock.observe(node(3, "Schedulable" if healthy else "Unschedulable"), at(when).timestamp())
        decision = decide(RANGE, plan, clock.times(B200), stored, at(check))
        stored = decision.elastic
        if decision.action is Action.RESIZE:
            assert decision.target is not None
            plan = decision.target
            resized_at.append(check)
            stored.last_resize_at = format_rfc3339(at(check))
    return resized_at


@pytest.mark.parametrize("period_s", [5, 55, 90, 400])
def test_a_flapping_node_resizes_at_most_once_per_cooldown(period_s: int) -> None:
    # Flaps shorter than the grace period cause no resize at all, longer ones one per cooldown at most.
    resized_at = flapping(period_s, period_s, check_every_s=5)
    if period_s < RANGE.grace_period_seconds:
        assert resized_at == []
    else:
        assert resized_at, "a loss longer than the grace period is acted on"
    gaps = [b - a for a, b in itertools.pairwise(resized_at)]
    assert all(gap >= RANGE.cooldown_seconds for gap in gaps), resized_at
    assert len(resized_at) <= 1 + 3600 // RANGE.cooldown_seconds


def test_a_node_seen_down_at_every_check_but_back_in_between_is_not_lost() -> None:
    # Issue 35: down 4 s, back 1 s, checked every 5 s. Each check sees it down, so a count sampled at the
    # checks said "one fewer for an hour" and resized; its own clock starts again each time it is back.
    assert flapping(4, 1, check_every_s=5) == []
    assert flapping(59, 1, check_every_s=60) == []


def spec() -> BlackwellTrainingJobSpec:
    return BlackwellTrainingJobSpec.model_validate(
        {
            "model": {"preset": "llama3.2-1b"},
            "volumes": [{"name": "fsx", "claimName": "fsx-claim", "mountPath": "/fsx"}],
            "cluster": {
                "instanceType": "ml.p5en.48xlarge",
                "nodes": 4,
                "elastic": {"minNodes": 2, "maxNodes": 4, "gracePeriodSeconds": 0},
            },
            "training": {
                "sequenceLength": 4096,
                "globalBatchTokens": 768 * 4096,
                "steps": 100,
                "checkpoint": {"path": "/fsx/checkpoints/elastic"},
            },
        }
    )


def running(nodes: int) -> dict[str, Any]:
    plan = plan_job(spec(), schedulable=nodes)
    return {
        "metadata": {"name": "el", "namespace": "team-a", "generation": 1},
        "spec": spec().model_dump(by_alias=True, mode="json", exclude_none=True),
        "status": {
            "phase": "Running",
            "observedGeneration": 1,
            "plan": plan.model_dump(by_alias=True, mode="json"),
            "child": {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "el", "uid": "u-1"},
        },
    }


def test_a_resize_writes_the_new_plan_with_the_same_global_batch_and_its_record() -> None:
    btj = running(4)
    decision = decide(spec().cluster.elastic or RANGE, 4, nodes(*up(3), down(0)), None, at(0))
    assert decision.action is Action.RESIZE
    change, entry = resize_changes(btj, decision, lambda n: plan_job(spec(), schedulable=n), now="T")
    assert entry is not None and change.plan is not None
    assert (entry.reason, entry.nodes_before, entry.nodes_after) == (RESIZED, 4, 3)
    assert change.plan.nodes == change.nodes == 3
    assert change.plan.global_batch_tokens == 768 * 4096  # the same global batch on 3 nodes
    assert change.phase is Phase.RESTARTING and change.elastic is not None
    assert change.elastic.resizes == 1 and change.elastic.last_resize_at == "T"
    assert entry.failed_child_uid == "u-1" and entry.replacement == change.plan.chosen
    assert (
        "Resized from 4 to 3 nodes" in entry.message and "global batch 3,145,728 tokens kept" in entry.message
    )
    # Written, the status reads as a child a re-plan replaces, for another node count.
    written = change.model_dump(by_alias=True, mode="json", exclude_unset=True)
    status = {**btj["status"], **written}
    assert replacing_child(status) and resized_child(status)


def test_a_target_that_plans_as_the_current_count_is_no_resize() -> None:
    btj = running(2)
    # 3 healthy nodes with a global batch that 24 GPUs do not divide: still 2 nodes, nothing to re-create.
    odd = spec().model_copy(deep=True)
    odd.training.global_batch_tokens = 1024 * 4096
    btj = {**btj, "status": {**btj["status"], "plan": plan_job(odd, schedulable=2).model_dump(by_alias=True)}}
    decision = decide(RANGE.model_copy(update={"grace_period_seconds": 0}), 2, nodes(*up(3)), None, at(0))
    assert decision.action is Action.RESIZE
    change, entry = resize_changes(btj, decision, lambda n: plan_job(odd, schedulable=n), now="T")
    assert entry is None and change.plan is None
    assert change.elastic is not None and "3 nodes plan as 2, the current count" in change.elastic.waiting


def test_a_stored_choice_is_kept_for_its_generation_only() -> None:
    btj = running(3)
    choice = stored_choice(btj)
    assert choice is not None and choice.nodes == 3
    # Every later pass plans the stored count, whatever the nodes say now.
    assert plan_job(spec(), schedulable=4, current=choice).nodes == 3
    assert stored_choice({**btj, "metadata": {**btj["metadata"], "generation": 2}}) is None
    assert plan_job(at_nodes(spec(), 4), schedulable=4).nodes == 4
