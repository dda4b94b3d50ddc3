"""What the handlers share for one operator run: the API, the capacity reader, the metrics."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from blackwell_operator.discovery.apis import ServedJobApis
from blackwell_operator.discovery.aws import HyperPodCapacityReader
from blackwell_operator.discovery.capacity import NodeCapacityReader
from blackwell_operator.handlers.api import KubeApi
from blackwell_operator.lifecycle.node_loss import NodeClock
from blackwell_operator.lifecycle.ownership import Lineage
from blackwell_operator.metrics import OperatorMetrics
from blackwell_operator.models.spec import DEFAULT_IMAGE

# Pods whose worker failure was handled, remembered to skip re-reading the BTJ on their later events
# (a pod keeps lastState.terminated while it runs again); bounded, oldest forgotten first.
POD_FAILURE_MEMORY = 4096
# The watchers whose failed events are kept for the resync loop (OperatorContext.note_unrecorded).
PODS, CHILDREN = "pods", "children"


@dataclass
class OperatorContext:
    """Kept in Kopf's memo (`memo.btj`) from startup to cleanup."""

    api: KubeApi
    capacity: NodeCapacityReader
    metrics: OperatorMetrics
    # The trainer image of a BTJ whose spec names none (the chart's trainerImage value).
    default_image: str = DEFAULT_IMAGE
    # Which job kinds the cluster serves, for spec.backend auto (None: every kind counts as served).
    served_apis: ServedJobApis | None = None
    # HyperPod capacity from AWS for BTJs that name their cluster (None: not read).
    hyperpod_capacity: HyperPodCapacityReader | None = None
    # Each node's up or down stretch as the node watch showed it: which nodes an elastic job has lost.
    nodes: NodeClock = field(default_factory=lambda: NodeClock(time.time()))
    # One reconcile at a time per BTJ: Kopf's handlers and the resync loop run in different threads and
    # must not both create (the loser's 409 would be adopted and counted).
    _recreating: dict[str, threading.Lock] = field(default_factory=dict)
    _guard: threading.Lock = field(default_factory=threading.Lock)
    # pod uid -> (pod, finishedAt) of the failure last recorded (or found stored) for it.
    _pod_failures: OrderedDict[str, tuple[str, str]] = field(default_factory=OrderedDict)
    # pod uid -> the trainer pod as last seen with a deletionTimestamp: the stuck-pod sweep's candidates
    # (a pod stuck Terminating sends no more events, so the watch alone cannot notice it).
    _terminating: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    # pod uid -> the trainer pod as last seen Running with an IP: whose /metrics the measure loop reads.
    _running: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    # BTJ uid -> the BTJ as last seen by the watch: what the resync loop looks at.
    _btjs: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    # pod uid -> its verified owner chain (lifecycle/ownership.py): a pod's controllers never change to
    # another live object with the same uids, so a verified chain is read once per pod.
    _lineages: OrderedDict[str, Lineage] = field(default_factory=OrderedDict)
    # pod uid -> None: Terminating pods with the trainer's labels that no child of a BTJ controls (made by
    # hand, or forged). The stuck-pod sweep never force-deletes them and does not trace them again (an owner
    # chain that failed never comes back: uids are not reused).
    _untraced: OrderedDict[str, None] = field(default_factory=OrderedDict)
    # BTJ uid -> when the sweep last posted a StuckPodIgnored Event on it (at most one per interval).
    _ignored_reported: dict[str, float] = field(default_factory=dict)
    # BTJ uid -> the generation a pass of this process last reconciled it at, to the end of the pass.
    _reconciled: dict[str, int] = field(default_factory=dict)
    # watcher ("pods", "children") -> object uid -> (event type, object): an event whose status write (or
    # a call before it) failed. No event may come back for it (a completed pod's probe or failure, a
    # deleted child's end), so the resync loop offers it again until it goes through (bounded).
    _unrecorded: dict[str, OrderedDict[str, tuple[str | None, Mapping[str, Any]]]] = field(
        default_factory=dict
    )

    def recreate_lock(self, uid: str) -> threading.Lock:
        """The lock of one BTJ's child re-creates."""
        with self._guard:
            return self._recreating.setdefault(uid, threading.Lock())

    def note_btj(self, btj: Mapping[str, Any]) -> None:
        """Remember a BTJ as last seen (for the resync loop)."""
        uid = str((btj.get("metadata") or {}).get("uid") or "")
        if uid:
            with self._guard:
                self._btjs[uid] = btj

    def known_btjs(self) -> dict[str, Mapping[str, Any]]:
        """Every BTJ seen and not deleted, by uid, as last seen."""
        with self._guard:
            return dict(self._btjs)

    def forget_btj(self, uid: str) -> None:
        """A deleted BTJ re-creates nothing more: drop its lock (unless a pass holds it right now)."""
        with self._guard:
            self._btjs.pop(uid, None)
            self._ignored_reported.pop(uid, None)
            self._reconciled.pop(uid, None)
            lock = self._recreating.get(uid)
            if lock is not None and not lock.locked():
                del self._recreating[uid]

    def pod_failure_seen(self, uid: str, key: tuple[str, str] | None) -> bool:
        """Whether this pod's failure `key` was handled already."""
        with self._guard:
            return bool(uid) and key is not None and self._pod_failures.get(uid) == key

    def remember_pod_failure(self, uid: str, key: tuple[str, str] | None) -> None:
        """Note a pod's failure as handled (its later events with the same failure skip the BTJ read)."""
        if not uid or key is None:
            return
        with self._guard:
            self._pod_failures[uid] = key
            self._pod_failures.move_to_end(uid)
            while len(self._pod_failures) > POD_FAILURE_MEMORY:
                self._pod_failures.popitem(last=False)

    def lineage_of(self, uid: str) -> Lineage | None:
        """A pod's owner chain as verified before (None: not verified yet)."""
        with self._guard:
            return self._lineages.get(uid)

    def remember_lineage(self, uid: str, found: Lineage) -> None:
        """Keep a pod's verified owner chain (bounded like the failure memory, oldest forgotten first)."""
        with self._guard:
            self._lineages[uid] = found
            while len(self._lineages) > POD_FAILURE_MEMORY:
                self._lineages.popitem(last=False)

    def note_reconciled(self, uid: str, generation: int) -> None:
        """A pass of this BTJ at `generation` ran to its end (Kopf's, the resync loop's, a re-create's)."""
        with self._guard:
            self._reconciled[uid] = generation

    def reconciled_at(self, uid: str) -> int | None:
        """The generation a pass of this process last reconciled this BTJ at, to its end (None: none)."""
        with self._guard:
            return self._reconciled.get(uid)

    def note_unrecorded(
        self, watcher: str, uid: str, event: tuple[str | None, Mapping[str, Any]] | None
    ) -> None:
        """Keep a watcher's event that did not go through, to be offered again (None: it went through,
        or there was nothing to do: forget it)."""
        if not uid:
            return
        with self._guard:
            kept = self._unrecorded.setdefault(watcher, OrderedDict())
            if event is None:
                kept.pop(uid, None)
                return
            kept[uid] = event
            while len(kept) > POD_FAILURE_MEMORY:
                kept.popitem(last=False)

    def unrecorded(self, watcher: str) -> list[tuple[str | None, Mapping[str, Any]]]:
        """The watcher's events that did not go through, oldest first."""
        with self._guard:
            return list((self._unrecorded.get(watcher) or {}).values())

    def untraced(self, uid: str) -> bool:
        """Whether the stuck-pod sweep found that no child of a BTJ controls this pod."""
        with self._guard:
            return uid in self._untraced

    def remember_untraced(self, uid: str) -> None:
        """Note a pod no child of a BTJ controls: never force-deleted, not traced again (bounded)."""
        with self._guard:
            self._untraced[uid] = None
            while len(self._untraced) > POD_FAILURE_MEMORY:
                self._untraced.popitem(last=False)

    def may_report_ignored(self, btj_uid: str, now: float, interval_s: float) -> bool:
        """True, and noted, when no ignored stuck pod was reported on this BTJ in the last `interval_s`."""
        with self._guard:
            last = self._ignored_reported.get(btj_uid)
            if last is not None and now - last < interval_s:
                return False
            self._ignored_reported[btj_uid] = now
            return True

    def forget_pod(self, uid: str) -> None:
        """A deleted pod sends no more events."""
        with self._guard:
            self._lineages.pop(uid, None)
            self._untraced.pop(uid, None)
            self._pod_failures.pop(uid, None)
            self._terminating.pop(uid, None)
            self._running.pop(uid, None)
            if PODS in self._unrecorded:
                self._unrecorded[PODS].pop(uid, None)

    def note_pod(self, pod: Mapping[str, Any]) -> None:
        """Track a trainer pod: being deleted (a stuck-pod candidate) or running (its throughput is read)."""
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid") or "")
        if not uid:
            return
        status = pod.get("status") or {}
        running = status.get("phase") == "Running" and bool(status.get("podIP"))
        with self._guard:
            if meta.get("deletionTimestamp"):
                self._terminating[uid] = pod
            else:
                self._terminating.pop(uid, None)
            if running and not meta.get("deletionTimestamp"):
                self._running[uid] = pod
            else:
                self._running.pop(uid, None)

    def running_pods(self) -> list[Mapping[str, Any]]:
        """The trainer pods last seen Running with an IP."""
        with self._guard:
            return list(self._running.values())

    def terminating_pods(self) -> list[Mapping[str, Any]]:
        """The trainer pods last seen being deleted and not yet gone."""
        with self._guard:
            return list(self._terminating.values())
