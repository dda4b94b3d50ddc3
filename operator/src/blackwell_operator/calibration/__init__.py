"""Calibration data sets (YAML with provenance) and the typed loader the planner reads them with."""

from __future__ import annotations

from importlib import resources

import yaml

from blackwell_operator.calibration.profile import (
    Calibration,
    MemoryConstants,
    RecipeConstants,
    ThroughputConstants,
    TrainerCapabilities,
)
from blackwell_operator.shared_cache import shared_cache

DEFAULT_CALIBRATION = "btj-trainer"

__all__ = [
    "DEFAULT_CALIBRATION",
    "Calibration",
    "MemoryConstants",
    "RecipeConstants",
    "ThroughputConstants",
    "TrainerCapabilities",
    "list_calibrations",
    "load_calibration",
]


def list_calibrations() -> list[str]:
    """Names of the shipped calibration data sets."""
    files = resources.files("blackwell_operator.calibration").iterdir()
    return sorted(f.name.removesuffix(".yaml") for f in files if f.name.endswith(".yaml"))


@shared_cache
def load_calibration(name: str = DEFAULT_CALIBRATION) -> Calibration:
    """Load a shipped calibration by name (e.g. btj-trainer, h200-reference)."""
    if name not in list_calibrations():
        raise ValueError(f"unknown calibration {name!r}; known: {', '.join(list_calibrations())}")
    text = resources.files("blackwell_operator.calibration").joinpath(f"{name}.yaml").read_text()
    return Calibration.model_validate(yaml.safe_load(text))
