"""spec.backend auto: the documented order, API discovery (cached), the choice under the real operator."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from blackwell_operator.discovery.apis import ServedJobApis, serves
from blackwell_operator.handlers.api import KubeApi, load_api_client
from blackwell_operator.lifecycle.backends import (
    AUTO_ORDER,
    JOB_RESOURCES,
    choose_backend,
    none_served_message,
)
from blackwell_operator.models.spec import Backend, BlackwellTrainingJobSpec
from blackwell_operator.testing.emulator import HYPERPOD_RESOURCE, PYTORCHJOB_RESOURCE, TRAINJOB_RESOURCE
from tests.operator.harness import (
    Cluster,
    btj,
    emulated_cluster,
    running_operator,
    wait_for,
    write_kubeconfig,
)


def spec(**fields: Any) -> BlackwellTrainingJobSpec:
    return BlackwellTrainingJobSpec.model_validate({"model": {"preset": "llama3.2-1b"}, **fields})


@pytest.mark.parametrize(
    ("served", "auto_resume", "chosen"),
    [
        (set(Backend) - {Backend.AUTO}, False, Backend.TRAIN_JOB),
        ({Backend.PYTORCH_JOB, Backend.HYPERPOD_PYTORCH_JOB}, False, Backend.PYTORCH_JOB),
        ({Backend.HYPERPOD_PYTORCH_JOB}, False, Backend.HYPERPOD_PYTORCH_JOB),
        ({Backend.TRAIN_JOB, Backend.PYTORCH_JOB}, True, Backend.PYTORCH_JOB),
        ({Backend.TRAIN_JOB}, True, None),
        (set(), False, None),
    ],
)
def test_auto_takes_the_first_served_of_its_order(
    served: set[Backend], auto_resume: bool, chosen: Backend | None
) -> None:
    assert choose_backend(spec(backend="auto", autoResume=auto_resume), served) == chosen


def test_a_named_backend_is_taken_as_is_and_the_default_is_unchanged() -> None:
    assert choose_backend(spec(backend="HyperPodPyTorchJob"), set()) == Backend.HYPERPOD_PYTORCH_JOB
    assert spec().backend == Backend.PYTORCH_JOB
    assert AUTO_ORDER[0] == Backend.TRAIN_JOB


def test_the_no_api_message_names_what_to_install() -> None:
    message = none_served_message(spec(backend="auto"))
    assert message.startswith("spec.backend is auto")
    assert "TrainJob (trainer.kubeflow.org/v1alpha1)" in message and "Fix:" in message


def test_discovery_is_cached_and_a_missing_group_is_not_served() -> None:
    calls: list[str] = []
    documents = {
        "/apis/kubeflow.org/v1": {"resources": [{"name": "pytorchjobs"}, {"name": "pytorchjobs/status"}]}
    }
    now = [0.0]

    def get(path: str) -> dict[str, Any] | None:
        calls.append(path)
        return documents.get(path)

    apis = ServedJobApis(get, JOB_RESOURCES, ttl=60, clock=lambda: now[0])
    assert apis.served() == {Backend.PYTORCH_JOB}
    assert apis.served() == {Backend.PYTORCH_JOB} and len(calls) == 3  # one GET per group version
    documents["/apis/trainer.kubeflow.org/v1alpha1"] = {"resources": [{"name": "trainjobs"}]}
    now[0] = 61.0
    assert apis.served() == {Backend.PYTORCH_JOB, Backend.TRAIN_JOB} and len(calls) == 6
    assert not serves({"resources": [{"name": "trainingruntimes"}]}, "trainjobs")


@contextlib.asynccontextmanager
async def cluster_serving(
    job_resources: tuple[str, ...], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Cluster]:
    """An emulated cluster serving only some job CRDs, the operator's kubeconfig pointed at it."""
    async with emulated_cluster(job_resources=job_resources) as emulated:
        monkeypatch.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kubeconfig", emulated.url)))
        monkeypatch.setenv("BTJ_METRICS_BIND", "off")
        yield emulated


@pytest.mark.parametrize(
    ("declared", "expected"),
    [
        ((PYTORCHJOB_RESOURCE, HYPERPOD_RESOURCE, TRAINJOB_RESOURCE), set(Backend) - {Backend.AUTO}),
        ((PYTORCHJOB_RESOURCE,), {Backend.PYTORCH_JOB}),
        ((), set()),
    ],
)
async def test_discovery_against_the_api_server(
    declared: tuple[str, ...], expected: set[Backend], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with cluster_serving(declared, tmp_path, monkeypatch):
        api = KubeApi(load_api_client())
        try:
            served = await asyncio.to_thread(ServedJobApis(api.get, JOB_RESOURCES).served)
        finally:
            api.close()
    assert served == expected


@pytest.mark.integration
async def test_auto_creates_the_first_served_kind_and_says_so_in_status(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with cluster_serving((PYTORCHJOB_RESOURCE,), tmp_path, monkeypatch) as cluster:
        async with running_operator(cluster):
            await cluster.apply(btj("picky", backend="auto"))
            await wait_for(lambda: cluster.condition("picky", "ChildCreated"), what="ChildCreated")
            await cluster.settle("picky")
        assert cluster.job("picky") is not None
        assert cluster.status("picky")["backend"] == "PyTorchJob"
        assert cluster.status("picky")["child"]["kind"] == "PyTorchJob"


@pytest.mark.integration
async def test_auto_prefers_trainjob_where_every_job_api_is_served(cluster: Cluster) -> None:
    async with running_operator(cluster):
        await cluster.apply(btj("modern", backend="auto"))
        await wait_for(lambda: cluster.condition("modern", "ChildCreated"), what="ChildCreated")
        await cluster.settle("modern")
    assert cluster.job("modern", TRAINJOB_RESOURCE) is not None and cluster.job("modern") is None
    assert cluster.status("modern")["backend"] == "TrainJob"


@pytest.mark.integration
async def test_auto_without_any_job_api_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with cluster_serving((), tmp_path, monkeypatch) as cluster:
        async with running_operator(cluster):
            await cluster.apply(btj("lonely", backend="auto"))
            created = await wait_for(lambda: cluster.condition("lonely", "ChildCreated"), what="ChildCreated")
            await wait_for(
                lambda: any(e["reason"] == "NoJobApi" for e in cluster.events("lonely")), what="the Event"
            )
        assert created["status"] == "False" and created["reason"] == "NoJobApi"
        assert "Fix: install Kubeflow Trainer v2" in created["message"]
        assert cluster.status("lonely")["phase"] == "Pending"
        assert cluster.status("lonely")["plan"]  # planned all the same
