"""Which nodes count as lost: each node's own down-since time, lost only when gone for the whole grace period.

Kubernetes' node lifecycle controller and the cluster autoscaler judge a node this way: by how long that one
node has been not Ready (its Ready condition's lastTransitionTime, which the API server keeps), never by a
count sampled now and then. A node that comes back starts its clock again, so a node that flaps faster than
the grace period is never lost. A count sampled through a cache cannot do that: two samples that both see a
node down say nothing of the minutes between them, when it may have come back.

So the clock is fed by every change the node watch delivers (handlers/__init__.py, `track-nodes`), not by
the cached node LIST. HyperPod's health label carries no time of its own: its down-since is when the watch
showed the change, kept in memory, so an operator restart starts that grace period again (the safe side:
never a resize early). A node whose Ready condition is not True is down at least since that condition's
lastTransitionTime, which survives a restart.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from blackwell_operator.nodelabels import INSTANCE_TYPE_LABEL, NODE_HEALTH_LABEL, SCHEDULABLE
from blackwell_operator.timefmt import rfc3339_seconds

# A node deleted this long ago is forgotten: lost for every grace period the spec allows (24 h at most).
FORGET_DELETED_S = 25 * 3600.0


@dataclass(frozen=True)
class NodeState:
    """One node's current stretch: up or down, since when (epoch seconds), and why down."""

    up: bool
    since: float
    why: str = ""


def down_reason(node: Mapping[str, Any]) -> str:
    """Why a node takes no trainer pod now ("" when it does): HyperPod's health label, a cordon, or its
    Ready condition (absent: not held against the node, as a fresh node may not publish one yet)."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    health = labels.get(NODE_HEALTH_LABEL)
    if health != SCHEDULABLE:
        return f"{NODE_HEALTH_LABEL}={health or '(none)'}"
    if (node.get("spec") or {}).get("unschedulable"):
        return "cordoned"
    ready = _ready_condition(node)
    if ready is not None and ready.get("status") != "True":
        return f"Ready={ready.get('status')}"
    return ""


def _ready_condition(node: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for condition in (node.get("status") or {}).get("conditions") or []:
        if isinstance(condition, Mapping) and condition.get("type") == "Ready":
            return condition
    return None


def _not_ready_since(node: Mapping[str, Any]) -> float | None:
    """When the node's Ready condition left True, if it is not True now (None: Ready, or no time)."""
    ready = _ready_condition(node)
    if ready is None or ready.get("status") == "True":
        return None
    return rfc3339_seconds(ready.get("lastTransitionTime"))


def next_state(node: Mapping[str, Any], previous: NodeState | None, at: float) -> NodeState:
    """The node's state after the watch showed it as `node` at `at` (`previous`: what it was before)."""
    why = down_reason(node)
    if not why:
        return previous if previous is not None and previous.up else NodeState(True, at)
    if previous is not None:
        # Watched without a gap: down since it went down, whatever changed while it stayed down.
        return NodeState(False, at if previous.up else previous.since, why)
    # First seen (the operator started): Kubernetes' record says how long it has been not Ready; for the
    # health label and a cordon there is none, and the clock starts now.
    not_ready = _not_ready_since(node)
    since = at if not_ready is None else min(at, not_ready)
    return NodeState(False, since, why)


@dataclass(frozen=True)
class NodeTimes:
    """The nodes of one instance type as the clock knows them, for one check."""

    states: tuple[NodeState, ...]
    # When the clock started (the operator's start): a node deleted before it was never seen.
    watching_since: float

    def up(self) -> int:
        """Nodes that take trainer pods now."""
        return sum(1 for s in self.states if s.up)

    def lost(self, grace_s: float, now: float) -> int:
        """Nodes down for the whole grace period."""
        return sum(1 for s in self.states if not s.up and now - s.since >= grace_s)

    def not_lost(self, grace_s: float, now: float, expected: int) -> int:
        """Nodes not lost, the count a resize plans for. Up to `expected` (the plan's count), nodes the
        clock never saw count too until the grace period has passed since it started: one deleted just
        before an operator restart is not lost early."""
        known = len(self.states) - self.lost(grace_s, now)
        unseen = max(0, expected - len(self.states)) if now - self.watching_since < grace_s else 0
        return known + unseen

    def settled(self, grace_s: float, now: float) -> int:
        """Nodes up for the whole grace period: what a scale-up may count on."""
        return sum(1 for s in self.states if s.up and now - s.since >= grace_s)

    def first_down(self, grace_s: float, now: float) -> float | None:
        """Since when the node nearest to being lost has been down (None: no node down and not lost)."""
        return min((s.since for s in self.states if not s.up and now - s.since < grace_s), default=None)

    def first_up(self, grace_s: float, now: float) -> float | None:
        """Since when the node nearest to counting for a scale-up has been up (None: none waits)."""
        return min((s.since for s in self.states if s.up and now - s.since < grace_s), default=None)


class NodeClock:
    """Each node's state, by name, as the node watch showed it (thread-safe: the watch writes from Kopf's
    loop, the elastic loop reads from a worker thread)."""

    def __init__(self, started_at: float) -> None:
        self._started_at = started_at
        self._nodes: dict[str, tuple[str, NodeState]] = {}  # name -> (instance type, state)
        self._lock = threading.Lock()

    def observe(self, node: Mapping[str, Any], at: float) -> None:
        """A node as the watch showed it (added, listed or changed)."""
        meta = node.get("metadata") or {}
        name, instance_type = meta.get("name"), (meta.get("labels") or {}).get(INSTANCE_TYPE_LABEL)
        if not name or not instance_type:
            return
        with self._lock:
            previous = self._nodes.get(str(name))
            state = next_state(node, previous[1] if previous else None, at)
            self._nodes[str(name)] = (str(instance_type), state)

    def deleted(self, node: Mapping[str, Any], at: float) -> None:
        """A node the watch showed deleted: gone since now (or since it went down, if it was down)."""
        name = (node.get("metadata") or {}).get("name")
        with self._lock:
            previous = self._nodes.get(str(name))
            if previous is not None:
                kept = previous[1] if not previous[1].up else NodeState(False, at)
                self._nodes[str(name)] = (previous[0], NodeState(False, kept.since, "deleted"))
            # Deleted nodes lost for longer than any grace period are forgotten (bounded memory).
            for key, (_, state) in list(self._nodes.items()):
                if state.why == "deleted" and at - state.since > FORGET_DELETED_S:
                    del self._nodes[key]

    def times(self, instance_type: str) -> NodeTimes:
        """The nodes of one instance type, for one check."""
        with self._lock:
            states = tuple(state for kind, state in self._nodes.values() if kind == instance_type)
        return NodeTimes(states, self._started_at)
