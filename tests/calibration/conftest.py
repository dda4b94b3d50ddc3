"""The calibration tests' fixture: the shipped profile."""

from __future__ import annotations

import pytest

from blackwell_operator.calibration import Calibration


@pytest.fixture
def base() -> Calibration:
    from blackwell_operator.calibration import load_calibration

    return load_calibration("btj-trainer")
