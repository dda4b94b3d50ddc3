"""Node capacity: nodes of an instance type that HyperPod marks Schedulable (hyperpod-pytorchjob.md §2.1)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
HEALTH_LABEL = "sagemaker.amazonaws.com/node-health-status"
SCHEDULABLE = "Schedulable"


@dataclass(frozen=True)
class Capacity:
    """Nodes of one instance type: all of them, and those a job can be scheduled on now."""

    instance_type: str
    total: int
    schedulable: int

    def enough_for(self, nodes: int) -> bool:
        """Whether `nodes` workers fit on the schedulable nodes."""
        return self.schedulable >= nodes

    def describe(self) -> str:
        """E.g. '2 of 8 ml.p6-b200.48xlarge nodes schedulable'."""
        return f"{self.schedulable} of {self.total} {self.instance_type} nodes schedulable"


def _is_schedulable(node: Mapping[str, Any]) -> bool:
    labels = node.get("metadata", {}).get("labels") or {}
    cordoned = bool((node.get("spec") or {}).get("unschedulable"))
    return labels.get(HEALTH_LABEL) == SCHEDULABLE and not cordoned


def count_capacity(nodes: Iterable[Mapping[str, Any]], instance_type: str) -> Capacity:
    """Pure: count the nodes of `instance_type` and those HyperPod marks Schedulable (and not cordoned)."""
    matching = [
        n
        for n in nodes
        if (n.get("metadata", {}).get("labels") or {}).get(INSTANCE_TYPE_LABEL) == instance_type
    ]
    return Capacity(instance_type, len(matching), sum(1 for n in matching if _is_schedulable(n)))


NodeLister = Callable[[str], list[dict[str, Any]]]


class NodeCapacityReader:
    """Reads node capacity through a lister (one LIST with a label selector), cached for `ttl` seconds.

    The cache keeps a burst of BTJs (hundreds applied at once) from listing nodes once each.
    """

    def __init__(
        self, list_nodes: NodeLister, *, ttl: float = 5.0, clock: Callable[[], float] = time.monotonic
    ):
        self._list_nodes = list_nodes
        self._ttl = ttl
        self._clock = clock
        self._cache: dict[str, tuple[float, Capacity]] = {}
        self._lock = threading.Lock()

    def read(self, instance_type: str) -> Capacity:
        """Capacity for one instance type."""
        with self._lock:
            cached = self._cache.get(instance_type)
            if cached is not None and self._clock() - cached[0] < self._ttl:
                return cached[1]
        nodes = self._list_nodes(f"{INSTANCE_TYPE_LABEL}={instance_type}")
        capacity = count_capacity(nodes, instance_type)
        with self._lock:
            self._cache[instance_type] = (self._clock(), capacity)
        return capacity


def kubernetes_node_lister(core_api: Any) -> NodeLister:
    """A lister over kubernetes.client.CoreV1Api (plain dicts, no model deserialisation)."""

    def list_nodes(label_selector: str) -> list[dict[str, Any]]:
        response = core_api.list_node(label_selector=label_selector, _preload_content=False)
        import json

        return list(json.loads(response.data).get("items", []))

    return list_nodes
