"""Cluster discovery (the only I/O besides the handlers): node capacity for an instance type."""

from blackwell_operator.discovery.capacity import (
    Capacity,
    NodeCapacityReader,
    count_capacity,
)

__all__ = [
    "Capacity",
    "NodeCapacityReader",
    "count_capacity",
]
