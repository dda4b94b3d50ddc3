"""Condition CapacityAvailable: the healthy nodes Kubernetes counts, and what AWS says of the cluster."""

from __future__ import annotations

from typing import Protocol

from blackwell_operator.lifecycle.conditions import ConditionChange
from blackwell_operator.models.status import ConditionType


class NodeCount(Protocol):
    """What the node reader found (discovery.capacity.Capacity; a protocol: the pure core imports no
    cluster client)."""

    @property
    def schedulable(self) -> int: ...

    def enough_for(self, needed: int) -> bool: ...

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


def capacity_condition(capacity: NodeCount | None, needed: int) -> ConditionChange:
    """CapacityAvailable from a node count (Unknown when nodes could not be read)."""
    kind = ConditionType.CAPACITY_AVAILABLE
    if capacity is None:
        return ConditionChange(kind, "Unknown", "NodesUnreadable", "Node capacity could not be read.")
    if capacity.schedulable >= needed and not capacity.enough_for(needed):
        return ConditionChange(
            kind,
            "False",
            "InsufficientAllocatable",
            f"{capacity.describe()}; {needed} needed. Its workers would stay Pending on these nodes.",
        )
    if capacity.enough_for(needed):
        return ConditionChange(kind, "True", "Sufficient", f"{capacity.describe()}; {needed} needed.")
    return ConditionChange(
        kind,
        "False",
        "InsufficientNodes",
        f"{capacity.describe()}; {needed} needed. The job is created; its workers wait until enough nodes "
        "are healthy.",
    )


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
