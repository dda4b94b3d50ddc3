"""A probe's adoption is an intent every later pass finishes: the plan ConfigMap's copy of the result, then
the status write that records it (status.probe and the plan). A 500 or a lost answer on either, or the
operator stopped before either, ends with both made within two resync intervals, though a completed pod
sends no other event; the child is never touched (no re-create, no duplicate), nothing is orphaned
(issue 35)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from blackwell_operator.render.pod import plan_config_map_name
from blackwell_operator.testing.emulator import Fault
from blackwell_trainer.plan.config import Plan, ProbeResult
from tests.operator.harness import (
    Cluster,
    btj,
    emulated_cluster,
    running_operator,
    wait_for,
    write_kubeconfig,
)
from tests.operator.intents import (
    STATUS_WRITE,
    Request,
    after_its_last_try,
    aim,
    children_made,
    named,
    orphans,
    status_write_of,
)
from tests.operator.test_probe_result import MODEL, TRAINING, TUNING, config_map_plan, result_for
from tests.support.pods import T2, container, pod, pod_status, terminated

pytestmark = pytest.mark.integration

RESYNC_S = 3.0  # BTJ_CHILD_RETRY_INTERVAL_S here
BOUND_S = 2 * RESYNC_S
SETUP_S = 30.0

Step = tuple[str, str, str | None]
COPY = ("patch", "configmaps", None)


def steps(name: str) -> dict[str, tuple[Step, Callable[[Request], bool]]]:
    return {
        "copy": (COPY, named(plan_config_map_name(name))),
        "status-write": (STATUS_WRITE, status_write_of(name, '"probe"')),
    }


@pytest.fixture
async def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Cluster]:
    async with emulated_cluster(nodes=2) as emulated:
        monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kubeconfig", emulated.url)))
        monkeypatch.setenv("BTJ_METRICS_BIND", "off")
        monkeypatch.setenv("BTJ_CHILD_RETRY_INTERVAL_S", str(RESYNC_S))
        yield emulated


async def with_children(cluster: Cluster, names: list[str]) -> dict[str, tuple[str, ProbeResult]]:
    """A probing BTJ per name with its child; name -> (the child's uid, the result its probe reports)."""
    for name in names:
        await cluster.apply(btj(name, model=MODEL, training=TRAINING, tuning=TUNING))
    found = {}
    for name in names:
        job = await wait_for(lambda name=name: cluster.job(name), timeout=SETUP_S, what=f"{name}'s child")
        raw = await wait_for(lambda name=name: cluster.status(name).get("plan"), what=f"{name}'s plan")
        found[name] = (job["metadata"]["uid"], result_for(Plan.model_validate(raw)))
    return found


async def completed(cluster: Cluster, name: str, result: ProbeResult) -> None:
    """The worker completes with the probe line in its termination message: its last event."""
    done = container(state={"terminated": terminated(0, "Completed", T2, f"done\n{result.to_line()}\n")})
    await cluster.add_pod(pod(f"{name}-worker-0", job=name, owner=cluster.job(name)), pod_status(done))


def adopted(cluster: Cluster, name: str, uid: str, result: ProbeResult) -> bool:
    """status.probe and the plan ConfigMap's copy both hold the result; the child is the one it was."""
    probe = cluster.status(name).get("probe") or {}
    plan = config_map_plan(cluster, name)
    job = cluster.job(name) or {}
    return bool(
        probe.get("winner") == result.winner
        and plan.probe is not None
        and plan.probe.result is not None
        and plan.probe.result.winner == result.winner
        and (job.get("metadata") or {}).get("uid") == uid
    )


async def converge(cluster: Cluster, found: dict[str, tuple[str, ProbeResult]], started: float) -> None:
    for name, (uid, result) in found.items():
        left = max(0.1, BOUND_S - (time.monotonic() - started))
        await wait_for(
            lambda name=name, uid=uid, result=result: adopted(cluster, name, uid, result),
            timeout=left,
            what=f"{name}'s probe adopted within {BOUND_S} s",
        )
    for name, (uid, _) in found.items():
        assert children_made(cluster, name) == {uid}, name  # the child was never replaced
    assert not any(orphans(cluster).values()), orphans(cluster)


async def met(faults: list[Fault]) -> float:
    await wait_for(lambda: all(f.hits for f in faults), timeout=SETUP_S, what="every fault met")
    return time.monotonic()


@pytest.mark.parametrize(("status", "commit"), [(500, False), (504, True)], ids=["http-500", "answer-lost"])
async def test_a_failed_request_at_either_step_of_a_probe_adoption_is_finished(
    cluster: Cluster, status: int, commit: bool
) -> None:
    names = [f"p-{kind}" for kind in steps("x")]
    async with running_operator(cluster) as runner:
        found = await with_children(cluster, names)
        faults = []
        for name in names:
            step, when = steps(name)[name.removeprefix("p-")]
            # Past the retry policy of one request: only the resync loop's offer brings the event back.
            faults.append(aim(cluster, step, when, status, commit=commit, times=6))
        for name, (_, result) in found.items():
            await completed(cluster, name, result)
        await converge(cluster, found, await met(faults))
    assert runner.exception is None


async def test_the_operator_stopped_before_either_step_of_a_probe_adoption_finishes_it(
    cluster: Cluster,
) -> None:
    """Stopped just before the copy, just after it (before the status write), and after both."""
    names = [f"p-stop-before-{kind}" for kind in [*steps("x"), "none"]]
    async with running_operator(cluster):
        found = await with_children(cluster, names)
        faults = []
        for name in names[:-1]:
            step, when = steps(name)[name.removeprefix("p-stop-before-")]
            faults.append(aim(cluster, step, when, 500, times=10**6))
        for name, (_, result) in found.items():
            await completed(cluster, name, result)
        await met(faults)
        await wait_for(
            lambda: adopted(cluster, names[-1], *found[names[-1]]), timeout=SETUP_S, what="all done"
        )
    await after_its_last_try(cluster)
    async with running_operator(cluster) as runner:
        await converge(cluster, found, time.monotonic())
    assert runner.exception is None
