"""Adopting a GPU's fit: what the fit moved becomes that GPU's constants in the shipped profile."""

from __future__ import annotations

from pathlib import Path

import yaml
from benchmarks.calibration.adopt import SHIPPED, adopt_gpu

from blackwell_operator.calibrate.fit import with_constants
from blackwell_operator.calibrate.predict import load_any_calibration
from blackwell_operator.calibration import load_calibration

EFFICIENCY = "throughput.recipes.9.torchao-tensorwise.efficiency"


def test_the_moved_constants_become_the_gpus_own(tmp_path: Path) -> None:
    base = load_calibration()
    fitted = with_constants(base, {"memory.act_hidden": 7.1, EFFICIENCY: 0.8})
    base_path, fitted_path, shipped = tmp_path / "base.yaml", tmp_path / "fit.yaml", tmp_path / "shipped.yaml"
    base_path.write_text(yaml.safe_dump(base.model_dump(mode="json")))
    fitted_path.write_text(
        "# Records: 22 (17 ran, 5 OOM) from harness\n" + yaml.safe_dump(fitted.model_dump(mode="json"))
    )
    shipped.write_text(SHIPPED.read_text())

    adopt_gpu(fitted_path, base_path, "H100", shipped)
    adopt_gpu(fitted_path, base_path, "H100", shipped)  # again: replaces its block, adds no second one

    text = shipped.read_text()
    assert text.startswith(SHIPPED.read_text().split("\nmemory:\n")[0]) and text.count("\ngpus:\n") == 1
    cal = load_any_calibration(shipped)
    assert set(cal.gpus["H100"].constants) == {"memory.act_hidden", EFFICIENCY}
    assert "22 (17 ran, 5 oom)" in cal.gpus["H100"].sources[EFFICIENCY]
    h100 = cal.for_gpu("H100")
    assert h100.memory.act_hidden == 7.1 and h100.throughput.recipes["9"]
    assert cal.memory.act_hidden == base.memory.act_hidden  # the shared constant stays
    assert cal.for_gpu("H200").memory.act_hidden == base.memory.act_hidden
