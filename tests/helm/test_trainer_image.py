"""The chart's trainerImage reaches the operator (BTJ_DEFAULT_TRAINER_IMAGE) and NOTES says the truth."""

from __future__ import annotations

from typing import Any

import yaml

from blackwell_operator.handlers.runtime import DEFAULT_IMAGE_ENV
from blackwell_operator.models.spec import DEFAULT_IMAGE
from tests.support.helm import CHART, SERVED, by_kind, render, run_helm

ECR = "123456789012.dkr.ecr.us-west-2.amazonaws.com"


def operator_env(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (deployment,) = by_kind(objects, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return {item["name"]: item.get("value") for item in container["env"]}


def test_the_default_values_give_the_operators_built_in_default(helm: str) -> None:
    # One name for the unset case: the chart's default and the operator's own fallback agree.
    assert operator_env(render(helm))[DEFAULT_IMAGE_ENV] == DEFAULT_IMAGE


def test_a_pushed_trainer_image_reaches_the_operator(helm: str) -> None:
    objects = render(helm, CHART / "ci" / "custom-image-values.yaml")
    assert operator_env(objects)[DEFAULT_IMAGE_ENV] == f"{ECR}/blackwell-trainer:0.1.0-rc1"
    objects = render(helm, sets=(f"trainerImage.repository={ECR}/trainer",))
    assert operator_env(objects)[DEFAULT_IMAGE_ENV] == f"{ECR}/trainer:0.1.0", "tag: the appVersion"


def test_a_repository_with_a_tag_or_a_space_is_refused_by_the_schema(helm: str) -> None:
    for bad in (f"{ECR}/trainer:0.1.0", "my trainer"):
        result = run_helm(
            helm, "template", "btj", str(CHART), "--set", SERVED, "--set", f"trainerImage.repository={bad}"
        )
        assert result.returncode != 0 and "trainerImage" in result.stderr, result.stderr


def notes(helm: str, *sets: str) -> str:
    args = ["install", "btj", str(CHART), "--dry-run=client", "--namespace", "btj-system", "--set", SERVED]
    for item in sets:
        args += ["--set", item]
    result = run_helm(helm, *args)
    assert result.returncode == 0, result.stderr
    return " ".join(result.stdout.split("NOTES:", 1)[1].split())


def test_notes_say_the_default_images_are_not_published(helm: str) -> None:
    text = notes(helm)
    assert f"names no image: {DEFAULT_IMAGE}" in text
    assert "No public image has that name: build trainer_image/Dockerfile" in text
    assert "is not published either: build operator/Dockerfile" in text
    text = notes(helm, f"trainerImage.repository={ECR}/trainer", f"image.repository={ECR}/btj-operator")
    assert f"names no image: {ECR}/trainer:0.1.0" in text
    assert "No public image" not in text and "not published" not in text


def test_values_yaml_documents_the_trainer_image() -> None:
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["trainerImage"] == {"repository": DEFAULT_IMAGE.rsplit(":", 1)[0], "tag": ""}
