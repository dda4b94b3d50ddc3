"""A reconcile pass parses the BTJ's stored status once (issue 34): every input it decides from (the memory
correction, an elastic job's kept node count, the probe's choice, the cluster correction, the preflight's
create check, the write's ownership check) comes from that one typed read.

The real Reconciler against the emulated API server, each pass called directly (as the resync loop calls
it); every status model parse is counted, whichever module makes it. The one other read of the BTJ a pass
may make, again after finding no child (a watcher may have recorded the child's end meanwhile), is a
read of its own, parsed once too.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import pytest

from blackwell_operator.handlers.reconcile import Reconciler
from blackwell_operator.handlers.runtime import build_context
from blackwell_operator.models.status import BlackwellTrainingJobStatus
from tests.operator.harness import B200, Cluster, btj, from_operator, verb_of

LOG = logging.getLogger("test-one-read-per-pass")


@pytest.fixture
def parses(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """Each BlackwellTrainingJobStatus.model_validate call (lifecycle/status_read.py's parse), its input."""
    seen: list[Any] = []
    parse = BlackwellTrainingJobStatus.model_validate.__func__  # type: ignore[attr-defined]

    def counted(cls: type[BlackwellTrainingJobStatus], obj: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(obj)
        return parse(cls, obj, *args, **kwargs)

    monkeypatch.setattr(BlackwellTrainingJobStatus, "model_validate", classmethod(counted))
    yield seen


def _elastic(name: str) -> dict[str, Any]:
    elastic = {"minNodes": 1, "maxNodes": 2, "gracePeriodSeconds": 60, "cooldownSeconds": 0}
    return btj(
        name,
        cluster={"instanceType": B200, "nodes": 2, "elastic": elastic},
        volumes=[{"name": "fsx", "claimName": "fsx-claim", "mountPath": "/fsx"}],
        training={"sequenceLength": 8192, "steps": 1000, "checkpoint": {"path": f"/fsx/checkpoints/{name}"}},
    )


@pytest.mark.parametrize(
    "manifest",
    [
        btj("fixed"),
        _elastic("elastic"),
        btj("no-account", serviceAccountName="absent"),  # the preflight's create check reads the status
    ],
    ids=["fixed", "elastic", "missing-account"],
)
async def test_each_pass_parses_the_stored_status_once(
    cluster: Cluster, parses: list[Any], manifest: dict[str, Any]
) -> None:
    await cluster.apply(manifest)
    name = manifest["metadata"]["name"]
    ctx = build_context()
    try:
        reconciler = Reconciler(ctx, direct_events=True)
        # The first pass (nothing stored yet), the pass after it (a stored plan, a child or a held create),
        # and one with nothing left to do.
        for which in ("first", "second", "converged"):
            body = cluster.btj(name)
            assert body is not None
            since = len(list(cluster.k.requests))
            parses.clear()
            assert await asyncio.to_thread(reconciler.reconcile_now, body, logger=LOG)
            reads = _btj_reads(list(cluster.k.requests)[since:])
            assert len(parses) == reads, f"the {which} pass parsed {len(parses)} times what it read {reads}"
            if which != "first":  # the child (or the held create) is recorded: the BTJ is read once
                assert reads == 1, f"the {which} pass read the BlackwellTrainingJob {reads} times"
        assert cluster.status(name).get("observedGeneration") == 1, "the passes wrote status"
        # Kopf's create handler run again for a generation this process has reconciled: skipped, on the
        # same one parse.
        parses.clear()
        body = cluster.btj(name)
        assert body is not None
        await asyncio.to_thread(reconciler.reconcile, body, retry=0, logger=LOG, skip_done=True)
        assert len(parses) == 1, f"the skipped pass parsed the stored status {len(parses)} times"
    finally:
        ctx.api.close()


def _btj_reads(requests: list[Any]) -> int:
    return sum(
        1
        for r in requests
        if from_operator(r)
        and verb_of(r) == "get"
        and r.resource is not None
        and r.resource.plural == "blackwelltrainingjobs"
    )
