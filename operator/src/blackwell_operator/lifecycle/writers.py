"""Who writes which status key: each status writer's keys and condition types, the one ownership table.

The serializer (status_patch.py) refuses a change to a key or condition its writer does not own, and
docs/operator.md's table "Who writes which status key" is checked against this one (tests/operator).
"""

from __future__ import annotations

from dataclasses import dataclass

from blackwell_operator.models.status import ConditionType as C


@dataclass(frozen=True)
class StatusWriter:
    """One writer of BTJ status: its name (as the docs say it), the keys and condition types it owns."""

    name: str
    keys: frozenset[str]  # camelCase status keys, conditions excepted
    conditions: frozenset[str]  # condition types

    def owns(self, key: str) -> bool:
        """Whether this writer may change `key`."""
        return key in self.keys


# The status a child's phase speaks for: the child watcher keeps it, reconcile derives it on a child's
# first sight (it may hold the only copy of a child the watcher has not reported yet).
_CHILD_KEYS = frozenset({"phase", "message", "headline", "child"})
_CHILD_CONDITIONS = frozenset({C.ADMITTED, C.RUNNING, C.SUCCEEDED, C.FAILED, C.KUEUE_MANAGED})
# What a plan puts in status: the plan and its printer-column copies.
_COLUMN_KEYS = frozenset(
    {
        "precision",
        "microBatchSize",
        "activationCheckpointing",
        "predictedTokensPerSecondPerGpu",
        "predictedModelFlopsUtilization",
    }
)
_PLAN_KEYS = frozenset({"plan", "nodes"}) | _COLUMN_KEYS

RECONCILE = StatusWriter(
    "reconcile",
    # globalBatch, and planHistory's entry when a user's edit changes it (lifecycle/global_batch.py).
    _CHILD_KEYS | _PLAN_KEYS | {"observedGeneration", "backend", "lastFailure", "globalBatch", "planHistory"},
    _CHILD_CONDITIONS
    | {C.PLANNED, C.PLAN_VERIFIED, C.CAPACITY_AVAILABLE, C.CHILD_CREATED, C.SPEC_APPLIED}
    | {C.IMAGE_PULL_SECRETS_FOUND},
)
CHILD_WATCHER = StatusWriter(
    "child watcher", _CHILD_KEYS | {"progress", "lastFailure"}, _CHILD_CONDITIONS | {C.CHILD_CREATED}
)
POD_WATCHER = StatusWriter(
    "pod watcher",
    _PLAN_KEYS | {"phase", "message", "headline", "lastFailure", "memoryCorrection", "planHistory", "probe"},
    frozenset({C.FAILED, C.PLANNED}),
)
# The printer columns too: while a probed job's first run goes on, they follow the winner its pod exports.
MEASURE_LOOP = StatusWriter("measure loop", _COLUMN_KEYS | {"measured", "progress"}, frozenset())
# An elastic job's resize: the nodes it saw, and with a resize the new plan and the re-plan's record.
ELASTIC_LOOP = StatusWriter(
    "elastic loop",
    _PLAN_KEYS | {"phase", "message", "headline", "planHistory", "elastic"},
    frozenset({C.PLANNED}),
)

WRITERS = (RECONCILE, CHILD_WATCHER, POD_WATCHER, MEASURE_LOOP, ELASTIC_LOOP)
