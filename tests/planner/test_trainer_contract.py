"""What the btj-trainer calibration offers, the trainer can run: every precision/recipe pair is valid."""

from __future__ import annotations

import pytest

from blackwell_operator.calibration import load_calibration
from blackwell_operator.catalogs import list_gpus

precision = pytest.importorskip(
    "blackwell_trainer.parallel.precision", reason="the trainer needs torch: bash scripts/bootstrap.sh --all"
)


def test_offered_recipes_are_valid_trainer_recipes() -> None:
    btj = load_calibration("btj-trainer")
    for prec, recipes in btj.trainer.precisions.items():
        assert set(recipes) <= precision.VALID_RECIPES[prec], prec


def test_catalog_gpus_meet_the_trainers_capability_floor() -> None:
    for gpu in list_gpus():
        major, minor = (int(x) for x in gpu.compute_capability.split("."))
        for prec in gpu.precisions:
            assert (major, minor) >= precision.MIN_CAPABILITY[prec], (gpu.name, prec)
