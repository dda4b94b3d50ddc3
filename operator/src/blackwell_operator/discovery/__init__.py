"""Cluster discovery (the only I/O besides the handlers): node capacity for an instance type."""

from blackwell_operator.discovery.capacity import (
    HEALTH_LABEL,
    INSTANCE_TYPE_LABEL,
    SCHEDULABLE,
    Capacity,
    NodeCapacityReader,
    count_capacity,
)

__all__ = [
    "HEALTH_LABEL",
    "INSTANCE_TYPE_LABEL",
    "SCHEDULABLE",
    "Capacity",
    "NodeCapacityReader",
    "count_capacity",
]
