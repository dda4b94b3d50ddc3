"""Node capacity: nodes of an instance type that HyperPod marks Schedulable (labels: nodelabels.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from kubernetes.utils import parse_quantity as _parse_quantity

from blackwell_operator.nodelabels import INSTANCE_TYPE_LABEL, NODE_HEALTH_LABEL, SCHEDULABLE

# What to look at when a node's allocatable lacks what the trainer pod requests.
_HINTS = {
    "nvidia.com/gpu": "is the NVIDIA device plugin running there?",
    "vpc.amazonaws.com/efa": "is the EFA device plugin running there?",
    "hugepages-2Mi": "the nodes need 2 MiB hugepages configured (HyperPod's default lifecycle sets them)",
    "memory": "the kubelet reserves more of the node's memory than the pod asks to keep",
    "ephemeral-storage": "the kubelet's disk is smaller than the pod's node-local needs "
    "(status.plan.localStorage); is the kubelet's folder on the instance's NVMe? Else set "
    "spec.cluster.localStorageGiB lower",
}


def parse_quantity(quantity: str | int | float) -> Decimal:
    """A Kubernetes quantity ("8", "5120Mi", "1.5Gi", "500m", "2e3") as an exact number, by the client's own
    resource.Quantity parser; ValueError on text it does not know."""
    # The client is untyped.
    value: Decimal = _parse_quantity(quantity)  # type: ignore[no-untyped-call]
    return value


def shortfall(node: Mapping[str, Any], requests: Mapping[str, Any]) -> str | None:
    """The first request the node's allocatable cannot hold, in words; None when all fit (or the node
    publishes no allocatable, which a fresh node may not yet)."""
    allocatable = (node.get("status") or {}).get("allocatable")
    if not allocatable:
        return None
    for resource, wanted in requests.items():
        try:
            have, need = parse_quantity(allocatable.get(resource, 0)), parse_quantity(wanted)
        except ValueError:
            continue  # a quantity Kubernetes does not know: not held against the node (advisory)
        if have < need:
            have_text = allocatable.get(resource, 0)
            return f"{resource}: {have_text} allocatable < {wanted} requested; {_HINTS.get(resource, '')}"
    return None


@dataclass(frozen=True)
class Capacity:
    """Nodes of one instance type: all of them, those a job can be scheduled on now, and of those the ones
    whose allocatable resources hold one trainer pod (None: not checked)."""

    instance_type: str
    total: int
    schedulable: int
    fitting: int | None = None
    why_not: str = ""  # the first shortfall of a schedulable node that cannot hold the pod

    def enough_for(self, nodes: int) -> bool:
        """Whether `nodes` workers fit on the schedulable nodes (and their allocatable, when checked)."""
        return self.schedulable >= nodes and (self.fitting is None or self.fitting >= nodes)

    def describe(self) -> str:
        """E.g. '2 of 8 ml.p6-b200.48xlarge nodes schedulable' (and how many can hold a worker)."""
        text = f"{self.schedulable} of {self.total} {self.instance_type} nodes schedulable"
        if self.fitting is not None and self.fitting < self.schedulable:
            text += f", {self.fitting} of them with room for a trainer pod ({self.why_not})"
        return text


def _is_schedulable(node: Mapping[str, Any]) -> bool:
    labels = node.get("metadata", {}).get("labels") or {}
    cordoned = bool((node.get("spec") or {}).get("unschedulable"))
    return labels.get(NODE_HEALTH_LABEL) == SCHEDULABLE and not cordoned


def count_capacity(
    nodes: Iterable[Mapping[str, Any]], instance_type: str, requests: Mapping[str, Any] | None = None
) -> Capacity:
    """Pure: count the nodes of `instance_type`, those HyperPod marks Schedulable (and not cordoned) and,
    given one trainer pod's `requests`, the schedulable ones whose allocatable holds it."""
    matching = [
        n
        for n in nodes
        if (n.get("metadata", {}).get("labels") or {}).get(INSTANCE_TYPE_LABEL) == instance_type
    ]
    schedulable = [n for n in matching if _is_schedulable(n)]
    if requests is None:
        return Capacity(instance_type, len(matching), len(schedulable))
    shortfalls = [shortfall(n, requests) for n in schedulable]
    why_not = next((s for s in shortfalls if s), "")
    return Capacity(instance_type, len(matching), len(schedulable), shortfalls.count(None), why_not)


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
        self._cache: dict[str, tuple[float, list[dict[str, Any]]]] = {}
        self._lock = threading.Lock()

    def read(self, instance_type: str, requests: Mapping[str, Any] | None = None) -> Capacity:
        """Capacity for one instance type (and one trainer pod's `requests`, when given)."""
        with self._lock:
            cached = self._cache.get(instance_type)
        if cached is not None and self._clock() - cached[0] < self._ttl:
            nodes = cached[1]
        else:
            nodes = self._list_nodes(f"{INSTANCE_TYPE_LABEL}={instance_type}")
            with self._lock:
                self._cache[instance_type] = (self._clock(), nodes)
        return count_capacity(nodes, instance_type, requests)
