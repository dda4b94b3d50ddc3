"""Selective AC under torchao float8 modelled as AC none where the trainer profile says so (the shipped one
does): memory and time are AC none's, auto scores the family once, as none, and the plan says why."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from blackwell_operator.calibration import Calibration, load_calibration
from blackwell_operator.planner import plan_job
from blackwell_operator.planner.candidates import Pins, distinct_checkpointing, families
from blackwell_operator.planner.memory import estimate_memory
from blackwell_operator.planner.throughput import estimate_time
from blackwell_trainer.plan.config import ActivationCheckpointing, Precision, PrecisionRecipe
from tests.support.specs import hardware, layout, make_spec, setting, shapes

H100_BASE = Path(__file__).parents[2] / "docs" / "calibration" / "h100" / "base-btj-trainer.yaml"
BTJ = load_calibration("btj-trainer")
# The same profile without the fact: every AC mode its own family, as before it shipped.
UNSAID = BTJ.model_copy(
    update={"trainer": BTJ.trainer.model_copy(update={"selective_recomputes_nothing": []})}
)
AC = ActivationCheckpointing
FP8 = PrecisionRecipe.TORCHAO_TENSORWISE
# A B200 job whose auto plan is FP8 tensorwise AC none (tests/planner/golden: llama3.1-8b/p6-b200/n2/s8192).
AUTO_SPEC = make_spec(nodes=2, seq=8192)
SCORED_ONCE = (
    "activation checkpointing: under torchao-tensorwise, selective AC runs as AC none on this trainer (same "
    "memory and speed measured), so it is scored once, as none"
)


def offered(cal: Calibration, pins: Pins, instance: str = "ml.p6-b200.48xlarge") -> set[tuple[str, str]]:
    """The (recipe, AC) families the search scores for a one-node job at sequence 4096."""
    return {
        (f.recipe.value, f.activation_checkpointing.value)
        for f in families(pins, hardware(instance), cal, 4096)
    }


def test_a_trainer_that_runs_selective_as_none_says_so_per_recipe() -> None:
    assert BTJ.trainer.selective_recomputes_nothing == [FP8]
    assert BTJ.trainer.modelled_checkpointing(AC.SELECTIVE, FP8) is AC.NONE
    assert BTJ.trainer.modelled_checkpointing(AC.SELECTIVE, PrecisionRecipe.NONE) is AC.SELECTIVE
    assert BTJ.trainer.modelled_checkpointing(AC.SELECTIVE, PrecisionRecipe.CURRENT) is AC.SELECTIVE
    assert BTJ.trainer.modelled_checkpointing(AC.FULL, FP8) is AC.FULL
    assert UNSAID.trainer.modelled_checkpointing(AC.SELECTIVE, FP8) is AC.SELECTIVE
    h100_base = Calibration.model_validate(yaml.safe_load(H100_BASE.read_text()))
    assert h100_base.trainer.selective_recomputes_nothing == [FP8]


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


@pytest.mark.parametrize("instance", ["ml.p5.48xlarge", "ml.p5en.48xlarge", "ml.p6-b200.48xlarge"])
def test_auto_scores_fp8_selective_once_as_none_and_keeps_bf16_selective(instance: str) -> None:
    auto = offered(BTJ, Pins(), instance)
    assert ("torchao-tensorwise", "none") in auto and ("torchao-tensorwise", "full") in auto
    assert ("torchao-tensorwise", "selective") not in auto
    assert {("none", "none"), ("none", "selective"), ("none", "full")} <= auto
    # The rule is the profile's: without the fact, FP8 selective is a family of its own again.
    assert offered(UNSAID, Pins(), instance) == auto | {("torchao-tensorwise", "selective")}
    # BF16 pinned: its selective is still offered.
    bf16 = offered(BTJ, Pins(precision=Precision.BF16), instance)
    assert bf16 == {("none", "none"), ("none", "selective"), ("none", "full")}


def test_a_mode_is_kept_where_the_one_it_runs_as_is_not_offered() -> None:
    # A trainer without AC none: its selective is the only way to run FP8 without full AC, so it stays.
    no_none = BTJ.trainer.model_copy(update={"activation_checkpointing": [AC.SELECTIVE, AC.FULL]})
    assert distinct_checkpointing([AC.SELECTIVE, AC.FULL], FP8, no_none) == [AC.SELECTIVE, AC.FULL]
    assert distinct_checkpointing(list(AC), FP8, BTJ.trainer) == [AC.NONE, AC.FULL]
    assert distinct_checkpointing(list(AC), PrecisionRecipe.NONE, BTJ.trainer) == list(AC)


def test_a_pinned_selective_is_offered_and_planned_as_selective_modelled_as_none() -> None:
    pinned = Pins(activation_checkpointing=AC.SELECTIVE)
    assert ("torchao-tensorwise", "selective") in offered(BTJ, pinned)
    fp8 = {"precision": "fp8"}
    as_selective = plan_job(make_spec(nodes=2, seq=8192, activationCheckpointing="selective", **fp8))
    as_none = plan_job(make_spec(nodes=2, seq=8192, activationCheckpointing="none", **fp8))
    chosen = as_selective.chosen
    assert (chosen.precision_recipe, chosen.activation_checkpointing) == (FP8, AC.SELECTIVE)
    assert chosen.model_copy(update={"activation_checkpointing": AC.NONE}) == as_none.chosen
    assert as_selective.predicted == as_none.predicted
    said = (
        "activation checkpointing selective: under torchao-tensorwise this trainer's selective AC measured "
        "as AC none, so its memory and time are modelled as AC none"
    )
    assert said in as_selective.explanation
    assert SCORED_ONCE not in as_selective.explanation  # a pin is not scored "once": it is what was asked
    assert not any(line.startswith("activation checkpointing") for line in as_none.explanation)


def test_the_auto_plan_says_fp8_selective_was_scored_once_as_none() -> None:
    plan = plan_job(AUTO_SPEC)
    assert (plan.chosen.precision_recipe, plan.chosen.activation_checkpointing) == (FP8, AC.NONE)
    assert SCORED_ONCE in plan.explanation
    # It follows the other AC modes' lines; the best selective candidate left is another recipe's, named.
    at = plan.explanation.index(SCORED_ONCE)
    assert plan.explanation[at - 1].startswith("activation checkpointing none: ")
    (selective,) = [line for line in plan.explanation if "none: selective would be" in line]
    assert "(best: bf16, mbs " in selective
    # No FP8 selective runner-up or probe candidate: the same run as the pick is not offered twice.
    assert plan.probe is not None
    shown = [*(a.candidate for a in plan.alternatives), *(c.candidate for c in plan.probe.candidates)]
    assert shown and all(
        (c.precision_recipe, c.activation_checkpointing) != (FP8, AC.SELECTIVE) for c in shown
    )


def test_a_pinned_bf16_plan_says_nothing_of_it() -> None:
    plan = plan_job(make_spec(nodes=2, seq=8192, precision="bf16"))
    assert not any("scored once" in line for line in plan.explanation)
