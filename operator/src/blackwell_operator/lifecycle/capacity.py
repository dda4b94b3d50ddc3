"""Condition CapacityAvailable: the healthy nodes Kubernetes counts, those other workloads leave free, and
what AWS says of the cluster."""

from __future__ import annotations

from typing import Protocol

from blackwell_operator.lifecycle.conditions import ConditionChange
from blackwell_operator.models.status import ConditionType


class NodeCount(Protocol):
    """What the node reader found (discovery.capacity.Capacity; a protocol: the pure core imports no
    cluster client)."""

    @property
    def schedulable(self) -> int: ...

    @property
    def fitting(self) -> int | None: ...

    @property
    def free(self) -> int | None: ...

    def describe(self) -> str: ...


class AwsAnswer(Protocol):
    """What AWS said of the named HyperPod cluster (discovery.aws.AwsCapacity)."""

    @property
    def known(self) -> bool: ...

    @property
    def short(self) -> bool: ...

    @property
    def reason(self) -> str: ...

    @property
    def message(self) -> str: ...


def capacity_condition(capacity: NodeCount | None, needed: int, *, queued: bool = False) -> ConditionChange:
    """CapacityAvailable from a node count (Unknown when nodes could not be read). Nodes that other
    workloads' pods hold count as taken; `queued` (spec.queueName): Kueue admits the job by its queue's
    quota, so enough free nodes are said, never claimed as the job's (Unknown, KueueAdmits)."""
    kind = ConditionType.CAPACITY_AVAILABLE
    if capacity is None:
        return ConditionChange(kind, "Unknown", "NodesUnreadable", "Node capacity could not be read.")
    said = f"{capacity.describe()}; {needed} needed."
    if capacity.schedulable < needed:
        return ConditionChange(
            kind,
            "False",
            "InsufficientNodes",
            f"{said} The job is created; its workers wait until enough nodes are healthy.",
        )
    if capacity.fitting is not None and capacity.fitting < needed:
        return ConditionChange(
            kind, "False", "InsufficientAllocatable", f"{said} Its workers would stay Pending on these nodes."
        )
    if capacity.free is not None and capacity.free < needed:
        return ConditionChange(
            kind,
            "False",
            "HeldByOtherWorkloads",
            f"{said} The job is created; its workers wait until other workloads free the nodes.",
        )
    if queued:
        return ConditionChange(
            kind,
            "Unknown",
            "KueueAdmits",
            f"{said} spec.queueName is set: Kueue admits the job by its ClusterQueue's quota, which node "
            "counts do not show (condition Admitted says when it is admitted).",
        )
    reason = "Sufficient" if capacity.free is not None else "SufficientAllocatable"
    return ConditionChange(kind, "True", reason, said)


def with_aws_capacity(condition: ConditionChange, aws: AwsAnswer | None) -> ConditionChange:
    """CapacityAvailable with what AWS says appended; an AWS shortfall (a training plan not active yet, an
    instance group short of running nodes) turns a True into False. Unknown AWS capacity changes no status.
    Advisory either way: the job is created and queues."""
    if aws is None:
        return condition
    if aws.known and aws.short and condition.status != "False":
        return ConditionChange(
            condition.type, "False", aws.reason, f"{aws.message} Kubernetes: {condition.message}"
        )
    return condition.with_message(f"{condition.message} {aws.message}")
