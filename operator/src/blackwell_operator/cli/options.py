"""Options every planning command shares (`--calibration`), read the same way with the same errors."""

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


__all__ = ["DEFAULT_CALIBRATION", "CalibrationOption", "read_calibration"]
