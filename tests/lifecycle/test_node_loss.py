"""Which nodes count as lost: each node's own clock from the changes the watch shows, Kubernetes' Ready
lastTransitionTime after a restart, deleted and never-seen nodes. Explicit times: no sleeps."""

from __future__ import annotations

import copy
import datetime
from typing import Any

import pytest

from blackwell_operator.lifecycle.node_loss import FORGET_DELETED_S, NodeClock, NodeState, down_reason
from tests.support.manifests import B200, labelled_node

T0 = 1_800_000_000.0  # 2027-01-15T08:00:00Z
GRACE = 60.0


def stamp(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(T0 + seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def node(name: str = "n-0", health: str = "Schedulable", ready: str | None = None, since: float = 0) -> Any:
    body = labelled_node(name, B200, health=health)
    if ready is not None:
        body["status"] = {
            "conditions": [{"type": "Ready", "status": ready, "lastTransitionTime": stamp(since)}]
        }
    return body


def four_up(clock: NodeClock, at: float = 0) -> None:
    for index in range(4):
        clock.observe(node(f"n-{index}"), T0 + at)


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (node(), ""),
        (node(ready="True"), ""),
        (node(health="UnschedulablePendingReboot"), "node-health-status=UnschedulablePendingReboot"),
        (node(ready="False"), "Ready=False"),
        (node(ready="Unknown"), "Ready=Unknown"),
    ],
)
def test_why_a_node_is_down(body: Any, why: str) -> None:
    assert down_reason(body).endswith(why) and bool(down_reason(body)) == bool(why)
    cordoned = copy.deepcopy(node())
    cordoned["spec"] = {"unschedulable": True}
    assert down_reason(cordoned) == "cordoned"


def test_a_node_is_lost_only_after_the_whole_grace_period_and_back_starts_its_clock_again() -> None:
    clock = NodeClock(T0 - 3600)
    four_up(clock, -3600)
    clock.observe(node("n-3", "Unschedulable"), T0)
    times = clock.times(B200)
    assert (times.up(), times.lost(GRACE, T0 + 59), times.not_lost(GRACE, T0 + 59, 4)) == (3, 0, 4)
    assert times.lost(GRACE, T0 + 60) == 1 and times.not_lost(GRACE, T0 + 60, 4) == 3
    # Other changes while it stays down keep its clock; back, then down again, starts it over.
    clock.observe(node("n-3", "UnschedulablePendingReplacement"), T0 + 30)
    assert clock.times(B200).lost(GRACE, T0 + 60) == 1
    clock.observe(node("n-3"), T0 + 61)
    clock.observe(node("n-3", "Unschedulable"), T0 + 62)
    assert clock.times(B200).lost(GRACE, T0 + 121) == 0 and clock.times(B200).lost(GRACE, T0 + 122) == 1


def test_a_ready_condition_that_flips_counts_the_same_way() -> None:
    clock = NodeClock(T0 - 3600)
    four_up(clock, -3600)
    clock.observe(node("n-3", ready="False", since=0), T0)
    clock.observe(node("n-3", ready="True", since=20), T0 + 20)
    clock.observe(node("n-3", ready="Unknown", since=40), T0 + 40)
    assert clock.times(B200).lost(GRACE, T0 + 99) == 0
    assert clock.times(B200).lost(GRACE, T0 + 100) == 1


def test_after_a_restart_ready_says_since_when_and_the_health_label_starts_the_grace_again() -> None:
    start = T0
    clock = NodeClock(start)
    clock.observe(node("n-0"), start)
    clock.observe(node("n-1"), start)
    clock.observe(node("n-2", ready="False", since=-3600), start)  # not Ready for an hour: Kubernetes says so
    clock.observe(node("n-3", "Unschedulable"), start)  # the label has no time: down since now
    times = clock.times(B200)
    assert times.lost(GRACE, start) == 1 and times.not_lost(GRACE, start, 4) == 3
    assert times.lost(GRACE, start + 60) == 2


def test_a_deleted_node_is_lost_after_the_grace_period_and_one_never_seen_after_the_clock_s_own() -> None:
    clock = NodeClock(T0)
    for index in range(3):  # the fourth was deleted before the operator started
        clock.observe(node(f"n-{index}"), T0)
    assert clock.times(B200).not_lost(GRACE, T0 + 59, 4) == 4
    assert clock.times(B200).not_lost(GRACE, T0 + 60, 4) == 3
    clock.deleted(node("n-2"), T0 + 100)
    assert clock.times(B200).not_lost(GRACE, T0 + 159, 4) == 3
    assert clock.times(B200).not_lost(GRACE, T0 + 160, 4) == 2
    # Back with the same name within the grace period: never lost.
    clock.deleted(node("n-1"), T0 + 200)
    clock.observe(node("n-1"), T0 + 230)
    assert clock.times(B200).lost(GRACE, T0 + 500) == 1  # n-2 only
    # A node deleted a day ago is forgotten (it counts as lost for any grace period until then).
    clock.deleted(node("n-0"), T0 + 100 + FORGET_DELETED_S + 1)
    assert sorted(s.why for s in clock.times(B200).states) == ["", "deleted"]  # n-1, and n-0 just now


def test_a_node_down_when_deleted_keeps_its_clock_and_other_instance_types_do_not_count() -> None:
    clock = NodeClock(T0)
    clock.observe(node("n-0", "Unschedulable"), T0)
    clock.deleted(node("n-0"), T0 + 50)
    assert clock.times(B200).states == (NodeState(False, T0, "deleted"),)
    clock.observe(labelled_node("p5", "ml.p5.48xlarge"), T0)
    clock.observe({"metadata": {"name": "unlabelled"}}, T0)
    assert len(clock.times(B200).states) == 1 and clock.times("ml.p5.48xlarge").up() == 1


def test_scale_up_counts_nodes_up_for_the_whole_grace_period() -> None:
    clock = NodeClock(T0 - 3600)
    four_up(clock, -3600)
    clock.observe(node("n-4"), T0)
    times = clock.times(B200)
    assert times.settled(GRACE, T0 + 59) == 4 and times.settled(GRACE, T0 + 60) == 5
    assert times.first_up(GRACE, T0 + 10) == T0 and times.first_down(GRACE, T0 + 10) is None
