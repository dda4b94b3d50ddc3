"""Issue 15 part 1: every plan says what it rests on, and precision auto never picks an unverified recipe."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

from blackwell_operator.calibrate.records import read_records
from blackwell_operator.calibration import load_calibration
from blackwell_operator.calibration.measured import load_measured
from blackwell_operator.catalogs import get_instance, list_instances, list_presets
from blackwell_operator.errors import SpecError
from blackwell_operator.planner import plan_job
from blackwell_operator.planner.provenance import recipe_ran, verdict
from blackwell_trainer.plan.config import Basis, Plan, Precision
from tests.support.plans import TINY_ARCHITECTURE
from tests.support.specs import make_spec

ROOT = Path(__file__).resolve().parents[2]
B200 = "ml.p6-b200.48xlarge"
CHOICES = ["gpu", "precision", "activationCheckpointing", "communication", "contextParallel"]
GRID = [
    (preset.name, instance.instance_type, nodes, seq)
    for preset in list_presets()
    for instance in list_instances()
    for nodes in (1, 4, 16)
    for seq in (4096, 32768, 131072)
]


@cache
def _grid_plans(**tuning: object) -> dict[tuple[str, str, int, int], Plan]:
    """Every preset x instance type x node count x sequence that plans (the rest are refused)."""
    out = {}
    for preset, instance, nodes, seq in GRID:
        try:
            out[(preset, instance, nodes, seq)] = plan_job(
                make_spec(preset=preset, instance=instance, nodes=nodes, seq=seq, **tuning)
            )
        except SpecError:
            continue
    return out


def test_auto_never_chooses_nvfp4_or_a_recipe_whose_path_never_ran() -> None:
    plans = _grid_plans()
    coverage = load_measured(load_calibration().name)
    # Before issue 15, auto chose NVFP4 for 18 of these (e.g. qwen2.5-32b at 32K on 1, 4 and 16 B200 nodes).
    assert len(plans) > 200
    for key, plan in plans.items():
        assert plan.chosen.precision is not Precision.NVFP4, key
        assert recipe_ran(coverage, plan.chosen.precision_recipe), key
        # The model is named too where its size lies outside what ran on the GPU (issue 39).
        assert [c.choice for c in plan.provenance if c.choice != "model"] == CHOICES, key
        assert all(c.basis is not Basis.UNVERIFIED and c.detail for c in plan.provenance), key
        _, reason, message = verdict(plan.provenance)
        assert reason in {"Measured", "Modelled"}, key
        assert any(line.startswith("provenance: ") and message in line for line in plan.explanation), key


def test_every_blackwell_plan_says_its_gpu_and_recipe_are_modelled() -> None:
    b200 = {k: p for k, p in _grid_plans().items() if k[1] == B200}
    assert b200
    for key, plan in b200.items():
        by = {c.choice: c for c in plan.provenance}
        assert by["gpu"].basis is Basis.MODELLED, key
        assert "marked derived" in by["gpu"].detail, key
        assert by["precision"].basis is Basis.MODELLED, key
        # Where the recipe's trainer path ran: the H200 records.
        assert "H200 (benchmarks/calibration/records/" in by["precision"].detail, key
        assert verdict(plan.provenance)[:2] == (False, "Modelled"), key
    qwen = b200[("qwen2.5-32b", B200, 4, 32768)]
    assert qwen.chosen.precision is Precision.FP8
    left_out = "precision auto left out mxfp8/mxfp8-block, nvfp4"
    assert any(line.startswith(left_out) for line in qwen.explanation)


def test_a_plan_on_what_the_h200_grid_measured_is_verified() -> None:
    # One H200, Llama-3.2-1B at 4K: the issue-6 grid ran exactly this (bf16 and fp8, every AC mode).
    plan = plan_job(make_spec(preset="llama3.2-1b", instance="ml.p5en.48xlarge", gpus_per_node=1))
    verified, reason, message = verdict(plan.provenance)
    assert (verified, reason) == (True, "Measured"), message
    gpu = plan.provenance[0]
    assert "benchmarks/calibration/records/h200-issue6" in gpu.detail
    # Eight GPUs of the same node: the records have one or two, so the collectives are modelled.
    eight = plan_job(make_spec(preset="llama3.2-1b", instance="ml.p5en.48xlarge"))
    assert [c.choice for c in eight.modelled_choices] == ["communication"]
    assert "1 x 1, 1 x 2" in eight.modelled_choices[0].detail


@pytest.mark.parametrize("precision", ["nvfp4", "mxfp8"])
def test_a_pinned_unverified_recipe_is_obeyed_and_the_plan_says_so(precision: str) -> None:
    plan = plan_job(make_spec(preset="qwen2.5-32b", nodes=4, seq=32768, precision=precision))
    assert plan.chosen.precision.value == precision
    recipe = next(c for c in plan.provenance if c.choice == "precision")
    assert recipe.basis is Basis.UNVERIFIED
    assert "never ran on a GPU here" in recipe.detail and "pinned in spec.tuning.precision" in recipe.detail
    verified, reason, message = verdict(plan.provenance)
    assert (verified, reason) == (False, "Unverified")
    assert message.startswith(f"unverified (trainer path never ran on a GPU here): precision {precision}/")


def test_the_opt_in_lets_auto_choose_mxfp8_but_never_nvfp4() -> None:
    opted = _grid_plans(allowUnverifiedRecipes=True)
    chosen = {k: p for k, p in opted.items() if p.chosen.precision is Precision.MXFP8}
    assert chosen, "with the opt-in, auto should find MXFP8 fastest somewhere on B200"
    assert all(p.chosen.precision is not Precision.NVFP4 for p in opted.values())
    for key, plan in chosen.items():
        recipe = next(c for c in plan.provenance if c.choice == "precision")
        assert recipe.basis is Basis.UNVERIFIED, key
        assert "spec.tuning.allowUnverifiedRecipes is true" in recipe.detail, key


def test_an_old_plan_without_provenance_still_loads() -> None:
    plan = plan_job(make_spec())
    old = json.loads(plan.to_json())
    del old["provenance"]
    loaded = Plan.model_validate(old)
    assert loaded.provenance == []
    assert verdict(loaded.provenance) == (
        False,
        "Unknown",
        "the plan does not say what it rests on (made by an older planner)",
    )


def test_the_shipped_coverage_is_what_the_records_say() -> None:
    # Generated by scripts/generate.sh (tests/repo/test_generated_files.py checks it is current); here:
    # what it says about the recipes the issue names.
    coverage = load_measured("btj-trainer")
    ran = {c.recipe.value for c in coverage.combinations}
    assert {"none", "torchao-tensorwise", "current", "block"} <= ran
    assert not ran & {"mxfp8-block", "nvfp4-block"}
    assert {c.gpu for c in coverage.combinations} == {"H200"}  # the H100 grid waits in pending/
    assert all(c.nodes == 1 for c in coverage.combinations)
    cp = [p for p in coverage.path_checks if p.feature == "context_parallel"]
    assert [(p.degree, p.gpu, p.gpus) for p in cp] == [(2, "H200", 2)]
    assert (ROOT / cp[0].source).is_file()
    for combo in coverage.combinations:
        assert all((ROOT / s).exists() for s in combo.sources)
    assert get_instance("ml.p5en.48xlarge").gpu == "H200"


def test_a_calibration_derived_from_a_trainers_has_its_coverage() -> None:
    # A fit's output or a user's copy is named <trainer>-<suffix>: same trainer, same records.
    assert load_measured("btj-trainer-h200") == load_measured("btj-trainer")
    assert load_measured("h200-reference-fit").trainer == "h200-reference"
    # A job on a GPU with its own constants (gpus.<GPU>) plans with `<trainer>@<GPU>`: still that trainer.
    # Found when adopting the H100 fit: without it every H100 plan said "trainer path never ran here" and
    # auto fell back to BF16.
    assert load_measured("btj-trainer@H100") == load_measured("btj-trainer")
    # A calibration of a trainer with no record here still plans (BF16, its own path), and says so.
    cal = load_calibration().model_copy(update={"name": "someone-elses-trainer"})
    plan = plan_job(make_spec(), calibration=cal)
    assert plan.chosen.precision is Precision.BF16
    recipe = next(c for c in plan.provenance if c.choice == "precision")
    assert recipe.basis is Basis.UNVERIFIED
    assert "no run of trainer someone-elses-trainer is recorded here" in recipe.detail
    assert all(c.basis is not Basis.MEASURED for c in plan.provenance)


def _tiny_on_one_h200(**tuning: object) -> Plan:
    from blackwell_operator.models.spec import BlackwellTrainingJobSpec

    tiny = TINY_ARCHITECTURE
    spec = BlackwellTrainingJobSpec.model_validate(
        {
            "model": {"architecture": tiny},
            "cluster": {"instanceType": "ml.p5en.48xlarge", "nodes": 1, "gpusPerNode": 1},
            "training": {"sequenceLength": 128, "steps": 3, "globalBatchTokens": 512},
            "tuning": {"precision": "bf16", "compile": False, "microBatchSize": 4, **tuning},
        }
    )
    return plan_job(spec)


def test_a_model_smaller_than_any_that_ran_is_not_called_measured() -> None:
    # Issue 39: a 106,816-parameter model on one H200 was "custom (0.00B)", every choice "measured".
    plan = _tiny_on_one_h200()
    by = {c.choice: c for c in plan.provenance}
    assert by["gpu"].basis is Basis.MEASURED and by["precision"].basis is Basis.MEASURED
    assert by["model"].basis is Basis.MODELLED and by["model"].value == "106.8K parameters"
    assert "1.24B to 12.32B parameters" in by["model"].detail
    verified, reason, _ = verdict(plan.provenance)
    assert not verified and reason == "Modelled"
    assert plan.explanation[0].startswith("custom (106.8K params) on 1 x H200")
    # A model of a size that ran keeps its verdict: no model item is added.
    llama = plan_job(make_spec("llama3.2-1b", "ml.p5en.48xlarge", gpus_per_node=1, seq=4096))
    assert "model" not in {c.choice for c in llama.provenance}


def test_pinned_bf16_is_said_to_be_pinned() -> None:
    # Issue 39: pinned bf16 on an H200 (which runs FP8) read "the only precision this GPU and trainer offer".
    lines = _tiny_on_one_h200().explanation
    assert "precision bf16: pinned by spec.tuning.precision" in lines
    assert not any("the only precision" in line for line in lines)


@pytest.mark.parametrize(
    ("count", "text"),
    [
        (8_030_261_248, "8.03B"),
        (494_032_768, "0.49B"),
        (27_500_000, "27.5M"),
        (106_816, "106.8K"),
        (512, "512"),
    ],
)
def test_parameter_counts_read_as_people_read_them(count: int, text: str) -> None:
    from blackwell_operator.planner.figures import parameters_text

    assert parameters_text(count) == text


def test_every_btj_trainer_record_folder_is_in_the_shipped_fit() -> None:
    # records/ is what the shipped profile rests on: the measured coverage lists every combination there,
    # and auto does not probe a measured one. A folder whose fit is not adopted waits in pending/ (the H100
    # grid's did, 2026-12-06): here, one that is not in the shipped fit's command fails.
    header = (ROOT / "operator/src/blackwell_operator/calibration/btj-trainer.yaml").read_text()
    fit = "# Generated by: btj calibrate fit"
    command = next(line for line in header.splitlines() if line.startswith(fit))
    fitted = {word for word in command.split() if word.startswith("benchmarks/calibration/records/")}
    folders = {
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "benchmarks/calibration/records").iterdir()
        if any(r.trainer == "btj-trainer" for r in read_records([path]))
    }
    assert folders == fitted, "move records whose fit is not adopted to benchmarks/calibration/pending/"
    # (The H100 grid, not adopted yet, is where it belongs.)
    assert any((ROOT / "benchmarks/calibration/pending/h100").glob("*.jsonl"))


def test_a_gpu_block_keeps_the_trainers_coverage() -> None:
    # The H100 fit as a gpus.H100 block (what benchmarks/calibration/adopt.py --gpu writes): the plan's
    # calibration is then `btj-trainer@H100`, and auto must still offer the recipes that ran here.
    from blackwell_operator.calibration.profile import GpuProfile

    shipped = load_calibration()
    key = "throughput.recipes.9.none.efficiency"
    block = GpuProfile(description="a test's H100 block", constants={key: 0.79}, sources={key: "a test"})
    cal = shipped.model_copy(update={"gpus": {"H100": block}})
    with_block = plan_job(make_spec(instance="ml.p5.48xlarge"), calibration=cal)
    without = plan_job(make_spec(instance="ml.p5.48xlarge"), calibration=shipped)
    assert with_block.calibration.startswith("btj-trainer@H100")
    assert with_block.chosen.precision_recipe == without.chosen.precision_recipe
    assert not any("never ran on a GPU here" in line for line in with_block.explanation)
