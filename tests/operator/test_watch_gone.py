"""An HTTP 410 answer to a watch request (not the in-stream ERROR event Kopf restarts on) is survived: the
operator re-lists and watches again (handlers/watch_gone.py). KopfRunner + hardened KMock."""

from __future__ import annotations

import pytest

from tests.operator.harness import Cluster, btj, from_operator, running_operator, wait_for

pytestmark = pytest.mark.integration


def _watches(cluster: Cluster, plural: str) -> int:
    return sum(
        1
        for r in cluster.k.requests
        if from_operator(r)
        and r.resource is not None
        and r.resource.plural == plural
        and r.params.get("watch") == "true"
    )


@pytest.mark.parametrize("plural", ["blackwelltrainingjobs", "pods", "pytorchjobs"])
async def test_a_410_on_a_watch_request_is_survived(cluster: Cluster, plural: str) -> None:
    fault = cluster.k.inject_fault("get", plural, 410, times=2, watch=True)
    async with running_operator(cluster) as runner:
        await wait_for(lambda: fault.times == 0, what="both 410 answers given")
        await wait_for(lambda: _watches(cluster, plural) >= 3, what=f"the {plural} watch started again")
        # Still serving: a BTJ applied now gets its child and its status.
        await cluster.apply(btj("after"))
        await wait_for(lambda: cluster.job("after"), what="the child of a BTJ applied after the 410s")
        await wait_for(lambda: cluster.condition("after", "ChildCreated"), what="ChildCreated")
    assert runner.exception is None
