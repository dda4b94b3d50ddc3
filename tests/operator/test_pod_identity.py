"""The real operator renders the spec's pod identity and its own default trainer image onto the child."""

from __future__ import annotations

from typing import Any

import pytest

from blackwell_operator.handlers.runtime import DEFAULT_IMAGE_ENV, default_trainer_image
from blackwell_operator.models.spec import DEFAULT_IMAGE
from tests.operator.harness import Cluster, btj, running_operator, wait_for

pytestmark = pytest.mark.integration

ECR_IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/blackwell-trainer:0.1.0"


def worker_template(job: dict[str, Any]) -> dict[str, Any]:
    template: dict[str, Any] = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]
    return template


async def test_a_btj_without_an_image_runs_the_operators_default(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(DEFAULT_IMAGE_ENV, ECR_IMAGE)
    await cluster.add_service_account("training-s3")
    async with running_operator(cluster) as runner:
        await cluster.apply(btj("plain", image=None))
        await cluster.apply(
            btj(
                "irsa",
                image="registry.example.com/trainer:dev",
                serviceAccountName="training-s3",
                imagePullSecrets=[{"name": "regcred"}],
                podLabels={"cost-center": "ml-42"},
                podAnnotations={"fluentbit.io/parser": "json"},
            )
        )
        plain = await wait_for(lambda: cluster.job("plain"), what="the first PyTorchJob")
        irsa = await wait_for(lambda: cluster.job("irsa"), what="the second PyTorchJob")
    assert runner.exception is None
    assert worker_template(plain)["spec"]["containers"][0]["image"] == ECR_IMAGE
    assert "serviceAccountName" not in worker_template(plain)["spec"]
    template = worker_template(irsa)
    assert template["spec"]["containers"][0]["image"] == "registry.example.com/trainer:dev"
    assert template["spec"]["serviceAccountName"] == "training-s3"
    assert template["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    assert template["metadata"]["labels"]["cost-center"] == "ml-42"
    assert template["metadata"]["annotations"]["fluentbit.io/parser"] == "json"


async def test_a_reserved_pod_label_makes_the_btj_invalid_with_the_field_named(cluster: Cluster) -> None:
    async with running_operator(cluster):
        await cluster.apply(btj("bad", podLabels={"training.blackwell.dev/job-name": "other"}))
        await wait_for(lambda: cluster.status("bad").get("phase") == "Invalid", what="phase Invalid")
    assert "spec.podLabels" in cluster.status("bad")["message"]
    assert cluster.job("bad") is None and cluster.config_map("bad-plan") is None


def test_the_default_image_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(DEFAULT_IMAGE_ENV, raising=False)
    assert default_trainer_image() == DEFAULT_IMAGE
    monkeypatch.setenv(DEFAULT_IMAGE_ENV, "  ")
    assert default_trainer_image() == DEFAULT_IMAGE, "the chart renders an empty value as unset"
    monkeypatch.setenv(DEFAULT_IMAGE_ENV, f" {ECR_IMAGE}\n")
    assert default_trainer_image() == ECR_IMAGE
    monkeypatch.setenv(DEFAULT_IMAGE_ENV, "my image:1")
    with pytest.raises(ValueError, match=f"^{DEFAULT_IMAGE_ENV}=.*Fix: e.g. "):
        default_trainer_image()
