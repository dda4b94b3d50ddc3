"""What the handlers share for one operator run: the API, the capacity reader, the metrics."""

from __future__ import annotations

from dataclasses import dataclass

from blackwell_operator.discovery.capacity import NodeCapacityReader
from blackwell_operator.handlers.api import KubeApi
from blackwell_operator.metrics import OperatorMetrics


@dataclass
class OperatorContext:
    """Kept in Kopf's memo (`memo.btj`) from startup to cleanup."""

    api: KubeApi
    capacity: NodeCapacityReader
    metrics: OperatorMetrics
