"""One version: the package's (blackwell_operator.__version__) is the trainer's, the chart's appVersion and
the default trainer image's tag; pyproject.toml reads it from there."""

from __future__ import annotations

import tomllib
from pathlib import Path

import yaml

import blackwell_operator
import blackwell_trainer
from blackwell_operator.models.spec import DEFAULT_IMAGE

ROOT = Path(__file__).resolve().parents[2]
VERSION = blackwell_operator.__version__


def test_pyproject_takes_the_version_from_the_package() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "blackwell_operator.__version__"}


def test_the_trainer_is_the_same_release() -> None:
    # The trainer may not import the operator, so it states the version too; here they are held equal.
    assert blackwell_trainer.__version__ == VERSION


def test_the_chart_app_version_and_the_default_image_tag_are_the_package_version() -> None:
    chart = yaml.safe_load((ROOT / "helm" / "btj-operator" / "Chart.yaml").read_text())
    assert chart["appVersion"] == VERSION, "bump helm/btj-operator/Chart.yaml appVersion with the package"
    assert DEFAULT_IMAGE.rsplit(":", 1)[1] == VERSION
