"""`btj release-children` against the KMock API server, after the real operator made the children and stopped
(as `helm uninstall` stops it): each child's state is recorded on its BTJ, then its finalizer is removed."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from blackwell_operator.cli import _register_commands, app
from blackwell_operator.handlers.finalizer import FINAL_STATUS_FINALIZER
from blackwell_operator.testing.emulator import HYPERPOD_RESOURCE, PYTORCHJOB_RESOURCE, TRAINJOB_RESOURCE
from tests.operator.harness import (
    HYPERPODJOBS,
    NAMESPACE,
    PYTORCHJOBS,
    TRAINJOBS,
    Cluster,
    btj,
    emulated_cluster,
    from_operator,
    running_operator,
    wait_for,
    write_kubeconfig,
)

pytestmark = pytest.mark.integration

# backend -> (the child's resource in the store, its collection path, its kind).
KINDS = {
    "PyTorchJob": (PYTORCHJOB_RESOURCE, PYTORCHJOBS),
    "HyperPodPyTorchJob": (HYPERPOD_RESOURCE, HYPERPODJOBS),
    "TrainJob": (TRAINJOB_RESOURCE, TRAINJOBS),
}
SUCCEEDED = {
    "conditions": [{"type": "Succeeded", "status": "True", "reason": "Done", "message": "all steps"}]
}
COMPLETE = {"conditions": [{"type": "Complete", "status": "True", "reason": "Done", "message": "all steps"}]}


def names(kind: str) -> tuple[str, str, str]:
    """The three BTJs of one kind: its child finished (BTJ there), deleted by hand, its BTJ deleted."""
    short = {"PyTorchJob": "pt", "HyperPodPyTorchJob": "hp", "TrainJob": "tj"}[kind]
    return f"{short}-done", f"{short}-deleted", f"{short}-orphan"


async def release(*args: str) -> Result:
    """The command, in a thread: the emulator serves on this test's event loop."""
    _register_commands()
    return await asyncio.to_thread(CliRunner().invoke, app, ["release-children", *args])


def writes(cluster: Cluster) -> int:
    """Requests that change something, sent by anything but the test itself."""
    return sum(1 for r in cluster.k.requests if from_operator(r) and r.method.value != "GET")


async def children_made_then_operator_gone(cluster: Cluster) -> None:
    """Nine children (three per kind) made by the real operator; then it stops, for good."""
    async with running_operator(cluster):
        for kind in KINDS:
            for name in names(kind):
                await cluster.apply(btj(name, backend=kind))
        for kind, (resource, _) in KINDS.items():
            for name in names(kind):
                await wait_for(lambda n=name, r=resource: cluster.job(n, r), what=f"{kind} {name}")
                await wait_for(lambda n=name: cluster.condition(n, "ChildCreated"), what=f"{name} recorded")


def held(cluster: Cluster, name: str, resource: str) -> bool:
    job = cluster.job(name, resource) or {}
    return FINAL_STATUS_FINALIZER in (job.get("metadata", {}).get("finalizers") or [])


async def test_release_records_every_childs_end_then_lets_it_go(cluster: Cluster) -> None:
    await children_made_then_operator_gone(cluster)
    # With no operator: each kind's child finishes, another is deleted by hand, a third loses its BTJ.
    for kind, (resource, collection) in KINDS.items():
        done, deleted, orphan = names(kind)
        status = COMPLETE if kind == "TrainJob" else SUCCEEDED
        await cluster.set_child_status(done, status, collection=collection)
        await cluster.delete_child(deleted, collection=collection)
        await cluster.delete_btj(orphan)
        for name in (deleted, orphan):  # Terminating: the finalizer holds them
            job = cluster.job(name, resource) or {}
            assert job["metadata"].get("deletionTimestamp") and held(cluster, name, resource), name
        assert cluster.status(done).get("phase") == "Pending", "nothing recorded it yet"

    before = writes(cluster)
    dry = await release("--all-namespaces", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert writes(cluster) == before, "a dry run changes nothing"
    assert "9 child job(s) would be released, 0 not." in dry.output
    assert f"PyTorchJob {NAMESPACE}/pt-done: would be released (Succeeded; would be recorded" in dry.output
    assert f"TrainJob {NAMESPACE}/tj-orphan: would be released (Terminating; its" in dry.output
    for kind, (resource, _) in KINDS.items():
        assert all(held(cluster, name, resource) for name in names(kind)), kind

    result = await release("--namespace", NAMESPACE)
    assert result.exit_code == 0, result.output
    assert "9 child job(s) released, 0 not." in result.output
    for kind, (resource, _) in KINDS.items():
        done, deleted, orphan = names(kind)
        # The finished child stays (ttlSecondsAfterFinished may delete it later: it goes at once), its end
        # is on the BTJ, as the child watcher would have written it, with the watcher's Event.
        assert not held(cluster, done, resource) and cluster.job(done, resource) is not None
        assert cluster.status(done)["phase"] == "Succeeded", kind
        assert any(e["reason"] == "Succeeded" for e in cluster.events(done)), kind
        assert f"{kind} {NAMESPACE}/{done}: released (Succeeded; recorded on" in result.output
        # The child deleted by hand: its BTJ says so (the next operator re-creates it), and it is gone.
        assert cluster.job(deleted, resource) is None
        created = cluster.condition(deleted, "ChildCreated") or {}
        assert (created.get("status"), created.get("reason")) == ("False", "ChildDeleted"), kind
        # Its BTJ gone: nothing to record it on, it goes.
        assert cluster.job(orphan, resource) is None
        assert f"{kind} {NAMESPACE}/{orphan}: released (Terminating; its BlackwellTrainingJob is gone)" in (
            result.output
        )

    again = await release("--all-namespaces")
    assert again.exit_code == 0, again.output
    assert "No child job in every namespace carries the final-status finalizer" in again.output


async def test_a_child_whose_end_cannot_be_recorded_keeps_its_finalizer(cluster: Cluster) -> None:
    async with running_operator(cluster):
        await cluster.apply(btj("kept"))
        await wait_for(lambda: cluster.condition("kept", "ChildCreated"), what="the PyTorchJob recorded")
    await cluster.set_child_status("kept", SUCCEEDED)
    # The status subresource refuses every write (more than the retry policy's tries).
    cluster.k.inject_fault("patch", "blackwelltrainingjobs", 503, times=50, subresource="status")
    result = await release("-n", NAMESPACE)
    assert result.exit_code == 1, result.output
    assert f"PyTorchJob {NAMESPACE}/kept: not released: its state (Succeeded) could not be written" in (
        " ".join(result.output.split())
    )
    assert f"could not be written on BlackwellTrainingJob {NAMESPACE}/kept" in " ".join(result.output.split())
    assert "0 child job(s) released, 1 not." in result.output
    assert held(cluster, "kept", PYTORCHJOB_RESOURCE), "losing its end is worse than waiting"
    cluster.k.faults.clear()
    assert (await release("-n", NAMESPACE)).exit_code == 0
    assert cluster.status("kept")["phase"] == "Succeeded"
    assert not held(cluster, "kept", PYTORCHJOB_RESOURCE)


async def test_other_namespaces_are_left_alone(cluster: Cluster) -> None:
    async with running_operator(cluster):
        await cluster.apply(btj("mine"))
        await wait_for(lambda: cluster.condition("mine", "ChildCreated"), what="the PyTorchJob recorded")
    result = await release("-n", "another-team")
    assert result.exit_code == 0, result.output
    assert "No child job in another-team carries" in result.output
    assert held(cluster, "mine", PYTORCHJOB_RESOURCE)


async def test_job_kinds_the_cluster_does_not_serve_are_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Only Kubeflow's PyTorchJob CRD is installed: listing the other two kinds answers 404.
    async with emulated_cluster(job_resources=(PYTORCHJOB_RESOURCE,)) as only_pytorch:
        monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kubeconfig", only_pytorch.url)))
        monkeypatch.setenv("BTJ_METRICS_BIND", "off")
        async with running_operator(only_pytorch):
            await only_pytorch.apply(btj("lone"))
            await wait_for(lambda: only_pytorch.condition("lone", "ChildCreated"), what="the PyTorchJob")
        await only_pytorch.delete_child("lone")
        result = await release("-A")
        assert result.exit_code == 0, result.output
        assert only_pytorch.job("lone") is None, "released: it went"
        assert "1 child job(s) released, 0 not." in result.output
        listed = {
            r.resource.plural
            for r in only_pytorch.k.requests
            if from_operator(r) and r.resource is not None and r.method.value == "GET" and not r.name
        }
        assert {"hyperpodpytorchjobs", "trainjobs"} <= listed, "asked, and took the 404 for none"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ([], "say where: --namespace NS (repeatable) or --all-namespaces"),
        (["-A", "-n", "x"], "not both and not neither"),
        (["-n", "Team_A"], "--namespace 'Team_A' is not a namespace name"),
    ],
)
def test_bad_arguments_are_one_line(args: list[str], says: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", "/nonexistent")
    _register_commands()
    result: Any = CliRunner().invoke(app, ["release-children", *args])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ") and says in result.stderr and "Traceback" not in result.output


def test_no_cluster_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", "/nonexistent")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    _register_commands()
    result = CliRunner().invoke(app, ["release-children", "-A"])
    assert result.exit_code == 2 and result.stderr.startswith("error: no cluster credentials")


async def test_after_release_a_deletion_is_immediate_and_a_reinstall_runs_nothing_again(
    cluster: Cluster,
) -> None:
    async with running_operator(cluster):
        await cluster.apply(btj("finished"))
        await cluster.apply(btj("running"))
        for name in ("finished", "running"):
            await wait_for(lambda n=name: cluster.condition(n, "ChildCreated"), what=f"{name} recorded")
    # Uninstalled: one job finishes and the hook's command records it.
    await cluster.set_child_status("finished", SUCCEEDED)
    assert (await release("-A")).exit_code == 0
    # ttlSecondsAfterFinished (or a hand) deletes it with no operator: it goes at once, nothing holds it.
    await cluster.delete_child("finished")
    assert cluster.job("finished") is None
    creates = cluster.creates("pytorchjobs")
    # Installed again: the finished job is not run again; the running one is held by the finalizer again.
    async with running_operator(cluster) as runner:
        await wait_for(lambda: held(cluster, "running", PYTORCHJOB_RESOURCE), what="the finalizer back on")
        await cluster.settle("finished")
    assert runner.exception is None
    assert cluster.status("finished")["phase"] == "Succeeded"
    assert cluster.job("finished") is None and cluster.creates("pytorchjobs") == creates
