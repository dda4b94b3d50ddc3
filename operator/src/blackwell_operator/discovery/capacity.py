"""Node capacity: nodes of an instance type that HyperPod marks Schedulable (labels: nodelabels.py), and of
those the ones free for a job: allocatable GPUs minus what other workloads' unfinished pods bound there
request (docs/elastic.md, "Free nodes")."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from kubernetes.utils import parse_quantity as _parse_quantity

from blackwell_operator.nodelabels import GPU_RESOURCE, INSTANCE_TYPE_LABEL, NODE_HEALTH_LABEL, SCHEDULABLE

# A pod in these phases holds nothing on its node: the scheduler no longer counts its requests.
FINISHED_PHASES = frozenset({"Succeeded", "Failed"})

# What to look at when a node's allocatable lacks what the trainer pod requests.
_HINTS = {
    GPU_RESOURCE: "is the NVIDIA device plugin running there?",
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
    """Nodes of one instance type: all of them, those a job can be scheduled on now, of those the ones whose
    allocatable resources hold one trainer pod (None: not checked), and the ones free for the job once other
    workloads' pods are counted (None: pods not read, `unread` says why) against those other workloads hold.
    Counts only: nothing of another workload (its name, namespace, pods) is kept."""

    instance_type: str
    total: int
    schedulable: int
    fitting: int | None = None
    why_not: str = ""  # the first shortfall of a schedulable node that cannot hold the pod
    free: int | None = None  # schedulable nodes a trainer pod of the job fits on next to other workloads
    held: int = 0  # schedulable nodes where other workloads' pods leave too few GPUs for one trainer pod
    own: int = 0  # of the free nodes, those the job's own pods run on
    unread: str = ""  # why the free nodes are not known (free is None)

    def placeable(self) -> int:
        """The most workers of the job the nodes take now: the free nodes, else (pods not read) the
        schedulable ones."""
        return self.schedulable if self.free is None else self.free

    def describe(self) -> str:
        """E.g. '4 of 8 ml.p6-b200.48xlarge nodes schedulable: 1 free, 3 held by other workloads' (and how
        many can hold a worker)."""
        text = f"{self.schedulable} of {self.total} {self.instance_type} nodes schedulable"
        if self.fitting is not None and self.fitting < self.schedulable:
            text += f", {self.fitting} of them with room for a trainer pod ({self.why_not})"
        if self.free is not None:
            own = f" ({self.own} running its own pods)" if self.own else ""
            text += f": {self.free} free{own}, {self.held} held by other workloads"
        elif self.unread:
            text += f"; free GPUs not read ({self.unread}): other workloads' pods are not counted"
        return text


def _is_schedulable(node: Mapping[str, Any]) -> bool:
    labels = node.get("metadata", {}).get("labels") or {}
    cordoned = bool((node.get("spec") or {}).get("unschedulable"))
    return labels.get(NODE_HEALTH_LABEL) == SCHEDULABLE and not cordoned


def _quantity(value: Any) -> Decimal:
    """A quantity, 0 for one Kubernetes does not know (advisory: never held against a node)."""
    try:
        return parse_quantity(value)
    except (ValueError, TypeError):
        return Decimal(0)


def _container_gpus(container: Any) -> Decimal:
    resources = (container.get("resources") or {}) if isinstance(container, Mapping) else {}
    # An extended resource's request defaults to its limit (both must be equal when both are set).
    for part in ("requests", "limits"):
        values = resources.get(part) or {}
        if isinstance(values, Mapping) and GPU_RESOURCE in values:
            return _quantity(values[GPU_RESOURCE])
    return Decimal(0)


def pod_gpus(pod: Mapping[str, Any]) -> Decimal:
    """GPUs a pod holds on its node, as the scheduler counts them: its containers' requests together, or
    its largest init container's when that is more (init containers run one at a time, before them)."""
    spec = pod.get("spec") or {}
    containers = sum((_container_gpus(c) for c in spec.get("containers") or []), Decimal(0))
    init = max((_container_gpus(c) for c in spec.get("initContainers") or []), default=Decimal(0))
    return max(containers, init)


@dataclass(frozen=True)
class BoundPod:
    """What the operator keeps of a pod on a node: the node, its namespace and job-name label (to tell a
    job's own pods) and the GPUs it requests; nothing else of it is kept."""

    node: str
    namespace: str
    job: str
    gpus: Decimal


def bound_pods(pods: Iterable[Mapping[str, Any]], job_label: str) -> list[BoundPod]:
    """Pure: the pods bound to a node and not finished that request GPUs, each reduced to a BoundPod."""
    kept = []
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if not node or (pod.get("status") or {}).get("phase") in FINISHED_PHASES:
            continue
        gpus = pod_gpus(pod)
        if gpus > 0:
            meta = pod.get("metadata") or {}
            job = str((meta.get("labels") or {}).get(job_label) or "")
            kept.append(BoundPod(str(node), str(meta.get("namespace") or ""), job, gpus))
    return kept


@dataclass(frozen=True)
class NodeHold:
    """GPUs requested on one node: by the job's own pods, and by every other workload's."""

    own: Decimal = Decimal(0)
    others: Decimal = Decimal(0)


def holds(pods: Iterable[BoundPod], owner: tuple[str, str] | None) -> dict[str, NodeHold]:
    """Pure: per node, the GPUs the job's own pods (`owner`: its namespace and name, matched against
    BoundPod.namespace and .job) and other workloads' pods request."""
    out: dict[str, NodeHold] = {}
    for pod in pods:
        hold = out.get(pod.node, NodeHold())
        if owner is not None and (pod.namespace, pod.job) == owner:
            out[pod.node] = NodeHold(hold.own + pod.gpus, hold.others)
        else:
            out[pod.node] = NodeHold(hold.own, hold.others + pod.gpus)
    return out


def _node_gpus(node: Mapping[str, Any], default: Decimal) -> Decimal:
    """The node's allocatable GPUs; `default` (what one trainer pod asks: its instance's GPUs) while it
    publishes none."""
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    return _quantity(allocatable[GPU_RESOURCE]) if GPU_RESOURCE in allocatable else default


def _free_counts(
    nodes: list[Mapping[str, Any]], held: Mapping[str, NodeHold], need: Decimal
) -> tuple[int, int, int]:
    """(free, held by others, own) among `nodes`: free when the GPUs other workloads request leave room
    for `need`, the job's own pods never counted against it."""
    free = others = own = 0
    for node in nodes:
        hold = held.get(str((node.get("metadata") or {}).get("name")), NodeHold())
        if _node_gpus(node, need) - hold.others >= need:
            free += 1
            own += hold.own > 0
        elif hold.others > 0:  # else too small whoever runs there (the allocatable check says so)
            others += 1
    return free, others, own


def count_capacity(
    nodes: Iterable[Mapping[str, Any]],
    instance_type: str,
    requests: Mapping[str, Any] | None = None,
    *,
    held: Mapping[str, NodeHold] | None = None,
    gpus: int | None = None,
    unread: str = "",
) -> Capacity:
    """Pure: count the nodes of `instance_type`, those HyperPod marks Schedulable (and not cordoned) and,
    given one trainer pod's `requests`, the schedulable ones whose allocatable holds it; given `held` (per
    node, the GPUs pods request there) and the GPUs one trainer pod asks (its requests', else `gpus`),
    those free for the job against those other workloads hold."""
    matching = [
        n
        for n in nodes
        if (n.get("metadata", {}).get("labels") or {}).get(INSTANCE_TYPE_LABEL) == instance_type
    ]
    schedulable = [n for n in matching if _is_schedulable(n)]
    fitting, why_not = None, ""
    room = schedulable
    if requests is not None:
        shortfalls = [shortfall(n, requests) for n in schedulable]
        why_not = next((s for s in shortfalls if s), "")
        fitting = shortfalls.count(None)
        room = [n for n, short in zip(schedulable, shortfalls, strict=True) if short is None]
    asked = (requests or {}).get(GPU_RESOURCE, gpus)
    if held is None or asked is None:
        return Capacity(instance_type, len(matching), len(schedulable), fitting, why_not, unread=unread)
    free, others, own = _free_counts(room, held, _quantity(asked))
    return Capacity(instance_type, len(matching), len(schedulable), fitting, why_not, free, others, own)


NodeLister = Callable[[str], list[dict[str, Any]]]
# All pods bound to a node and not finished, cluster-wide; Unreadable when they cannot be listed.
PodLister = Callable[[], list[dict[str, Any]]]


class Unreadable(Exception):
    """The pods could not be listed (the lister says why, in words for a condition message)."""


class NodeCapacityReader:
    """Reads node capacity through a lister (one LIST with a label selector) and the pods on nodes (one
    cluster-wide LIST), each cached for `ttl` seconds.

    The cache keeps a burst of BTJs (hundreds applied at once) from listing nodes and pods once each. Of the
    pods only BoundPod is kept. `list_pods` None: free GPUs are not read (`off` says why).
    """

    def __init__(
        self,
        list_nodes: NodeLister,
        *,
        list_pods: PodLister | None = None,
        job_label: str = "",
        off: str = "",
        ttl: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._list_nodes = list_nodes
        self._list_pods = list_pods
        self._job_label = job_label
        self._off = off
        self._ttl = ttl
        self._clock = clock
        self._cache: dict[str, tuple[float, list[dict[str, Any]]]] = {}
        self._pods: tuple[float, list[BoundPod] | str] | None = None
        self._lock = threading.Lock()

    def read(
        self,
        instance_type: str,
        requests: Mapping[str, Any] | None = None,
        *,
        owner: tuple[str, str] | None = None,
        gpus: int | None = None,
    ) -> Capacity:
        """Capacity for one instance type (and one trainer pod's `requests`, when given); with `gpus` or
        requests, the nodes free for the job `owner` (namespace, name), whose own pods never count against
        it."""
        with self._lock:
            cached = self._cache.get(instance_type)
        if cached is not None and self._clock() - cached[0] < self._ttl:
            nodes = cached[1]
        else:
            nodes = self._list_nodes(f"{INSTANCE_TYPE_LABEL}={instance_type}")
            with self._lock:
                self._cache[instance_type] = (self._clock(), nodes)
        pods = self._bound_pods()
        if isinstance(pods, str):
            return count_capacity(nodes, instance_type, requests, unread=pods)
        return count_capacity(nodes, instance_type, requests, held=holds(pods, owner), gpus=gpus)

    def _bound_pods(self) -> list[BoundPod] | str:
        """The pods on nodes (cached), or why they are not read."""
        if self._list_pods is None:
            return self._off
        with self._lock:
            cached = self._pods
        if cached is not None and self._clock() - cached[0] < self._ttl:
            return cached[1]
        try:
            pods: list[BoundPod] | str = bound_pods(self._list_pods(), self._job_label)
        except Unreadable as exc:
            pods = str(exc)
        with self._lock:
            self._pods = (self._clock(), pods)
        return pods
