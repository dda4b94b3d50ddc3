"""What the handlers share for one operator run: the API, the capacity reader, the metrics."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from blackwell_operator.discovery.capacity import NodeCapacityReader
from blackwell_operator.handlers.api import KubeApi
from blackwell_operator.metrics import OperatorMetrics


@dataclass
class OperatorContext:
    """Kept in Kopf's memo (`memo.btj`) from startup to cleanup."""

    api: KubeApi
    capacity: NodeCapacityReader
    metrics: OperatorMetrics
    # One child re-create at a time per BTJ: the recreate-child event handler and the retry-child timer
    # run in different threads and must not both create (the loser's 409 would be adopted and counted).
    _recreating: dict[str, threading.Lock] = field(default_factory=dict)
    _guard: threading.Lock = field(default_factory=threading.Lock)

    def recreate_lock(self, uid: str) -> threading.Lock:
        """The lock of one BTJ's child re-creates."""
        with self._guard:
            return self._recreating.setdefault(uid, threading.Lock())
