"""Selective AC under torchao float8 modelled as AC none where the trainer profile says so."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from blackwell_operator.calibration import Calibration, load_calibration
from blackwell_operator.planner.memory import estimate_memory
from blackwell_operator.planner.throughput import estimate_time
from blackwell_trainer.plan.config import ActivationCheckpointing, PrecisionRecipe
from tests.support.specs import hardware, layout, setting, shapes

H100_BASE = Path(__file__).parents[2] / "docs" / "calibration" / "h100" / "base-btj-trainer.yaml"
SHIPPED = load_calibration("btj-trainer")
# The H100 fit's base (docs/calibration/h100/base-btj-trainer.yaml) says so; the shipped profile not yet:
# the probe's auto candidates would lose their usual FP8 neighbour (docs/calibration/README.md).
BTJ = SHIPPED.model_copy(
    update={
        "trainer": SHIPPED.trainer.model_copy(
            update={"selective_recomputes_nothing": [PrecisionRecipe.TORCHAO_TENSORWISE]}
        )
    }
)
AC = ActivationCheckpointing


def test_a_trainer_that_runs_selective_as_none_says_so_per_recipe() -> None:
    assert SHIPPED.trainer.selective_recomputes_nothing == []
    assert (
        SHIPPED.trainer.modelled_checkpointing(AC.SELECTIVE, PrecisionRecipe.TORCHAO_TENSORWISE)
        is AC.SELECTIVE
    )
    assert BTJ.trainer.modelled_checkpointing(AC.SELECTIVE, PrecisionRecipe.TORCHAO_TENSORWISE) is AC.NONE
    assert BTJ.trainer.modelled_checkpointing(AC.SELECTIVE, PrecisionRecipe.NONE) is AC.SELECTIVE
    assert BTJ.trainer.modelled_checkpointing(AC.FULL, PrecisionRecipe.TORCHAO_TENSORWISE) is AC.FULL
    h100_base = Calibration.model_validate(yaml.safe_load(H100_BASE.read_text()))
    assert h100_base.trainer.selective_recomputes_nothing == [PrecisionRecipe.TORCHAO_TENSORWISE]


@pytest.mark.parametrize("instance", ["ml.p5.48xlarge", "ml.p6-b200.48xlarge"])
def test_its_memory_and_time_are_those_of_ac_none(instance: str) -> None:
    sh, hw = shapes("llama3.2-3b"), hardware(instance, gpus_per_node=1)
    none, selective = (
        setting(ac, mbs=4, precision="fp8", recipe="torchao-tensorwise") for ac in ("none", "selective")
    )
    assert estimate_memory(sh, BTJ, selective, layout(selective, hw), 4096) == estimate_memory(
        sh, BTJ, none, layout(none, hw), 4096
    )
    t_sel = estimate_time(sh, BTJ, hw, selective, layout(selective, hw), 4096)
    t_none = estimate_time(sh, BTJ, hw, none, layout(none, hw), 4096)
    assert t_sel.step_time_seconds == t_none.step_time_seconds and t_sel.breakdown["recompute"] == 0.0
    # BF16 selective still recomputes and saves memory.
    bf16_none, bf16_sel = (setting(ac, mbs=4) for ac in ("none", "selective"))
    assert estimate_time(sh, BTJ, hw, bf16_sel, layout(bf16_sel, hw), 4096).breakdown["recompute"] > 0.0
    assert (
        estimate_memory(sh, BTJ, bf16_sel, layout(bf16_sel, hw), 4096).peak_reserved
        < estimate_memory(sh, BTJ, bf16_none, layout(bf16_none, hw), 4096).peak_reserved
    )
