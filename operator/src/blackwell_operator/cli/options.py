"""Options the planning commands share (`--calibration`, `--cluster-calibration`), with the same errors."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
import yaml
from pydantic import ValidationError

from blackwell_operator.admission.yamlread import yaml_problem
from blackwell_operator.calibration import (
    DEFAULT_CALIBRATION,
    Calibration,
    list_calibrations,
    load_calibration,
)
from blackwell_operator.calibration.cluster import ClusterCalibration
from blackwell_operator.cli.manifest import fail

CALIBRATION_HELP = (
    "A shipped calibration name (btj-trainer, h200-reference) or a calibration YAML file, "
    "e.g. the one `btj calibrate fit` wrote."
)
CalibrationOption = Annotated[str, typer.Option("--calibration", help=CALIBRATION_HELP)]


def read_calibration(value: str, option: str = "--calibration") -> Calibration:
    """The calibration a name or file stands for; an unusable one ends the command naming `option`."""
    if value in list_calibrations():
        return load_calibration(value)
    path = Path(value)
    if not path.is_file():
        fail(
            f"{option}: unknown calibration {value!r}: neither a shipped name "
            f"({', '.join(list_calibrations())}) nor a file"
        )
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        return Calibration.model_validate(data)
    except (OSError, UnicodeDecodeError) as exc:
        fail(f"{option}: cannot read {path} ({exc})")
    except yaml.YAMLError as exc:
        fail(f"{option}: {path} is not valid YAML ({yaml_problem(exc)})")
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "file"
        fail(f"{option}: {path} is not a calibration file ({where}: {first['msg']})")


CLUSTER_CALIBRATION_HELP = (
    "A cluster calibration file (`btj calibrate cluster export` wrote it; a `kubectl get cm "
    "btj-cluster-calibration -o yaml` copy works too): plan with the corrections measured on that cluster."
)
ClusterCalibrationOption = Annotated[
    Path | None, typer.Option("--cluster-calibration", help=CLUSTER_CALIBRATION_HELP, show_default=False)
]


def read_cluster_calibration(path: Path, option: str = "--cluster-calibration") -> ClusterCalibration:
    """An exported cluster calibration (or a copy of its ConfigMap); an unusable one ends the command."""
    from blackwell_operator.handlers.cluster_calibration import UnreadableCalibration, parse

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        fail(f"{option}: cannot read {path} ({exc}); pass the file `btj calibrate cluster export` wrote")
    except yaml.YAMLError as exc:
        fail(f"{option}: {path} is not valid YAML or JSON ({yaml_problem(exc)})")
    try:
        if isinstance(data, dict) and data.get("kind") == "ConfigMap":
            return parse(data)
        return ClusterCalibration.model_validate(data)
    except UnreadableCalibration as exc:
        fail(f"{option}: {path}: {exc}")
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "file"
        fail(
            f"{option}: {path} is not a cluster calibration ({where}: {first['msg']}); pass the file "
            "`btj calibrate cluster export` wrote"
        )


__all__ = [
    "DEFAULT_CALIBRATION",
    "CalibrationOption",
    "ClusterCalibrationOption",
    "read_calibration",
    "read_cluster_calibration",
]
