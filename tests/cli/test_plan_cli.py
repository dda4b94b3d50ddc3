"""`btj plan` and `btj presets`: tables, JSON/YAML equal to plan.to_json(), clear errors with exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from blackwell_operator.cli import _register_commands, app
from blackwell_operator.cli.manifest import load_manifest
from blackwell_operator.planner import plan_job
from blackwell_trainer.plan.config import Plan

_register_commands()
runner = CliRunner()

BAD_UNIONS = """apiVersion: training.blackwell.dev/v1alpha1
kind: BlackwellTrainingJob
metadata: {name: bad}
spec:
  model: {preset: llama3.1-8b}
  training: {checkpoint: {intervalSteps: 0}}
  tuning: {precision: fp16, microBatchSize: many, sharding: zero3}
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return path


def test_plan_json_is_exactly_the_plan() -> None:
    result = runner.invoke(app, ["plan", "-o", "json"])
    assert result.exit_code == 0, result.output
    job = load_manifest(None)
    assert result.stdout.strip() == plan_job(job.spec, job_name=job.metadata.name).to_json()


def test_plan_yaml_carries_the_same_data() -> None:
    result = runner.invoke(app, ["plan", "--output", "yaml"])
    assert result.exit_code == 0, result.output
    job = load_manifest(None)
    expected = json.loads(plan_job(job.spec, job_name=job.metadata.name).to_json())
    assert yaml.safe_load(result.stdout) == expected


def test_plan_table_shows_choice_memory_prediction_and_alternatives() -> None:
    result = runner.invoke(app, ["plan"])
    assert result.exit_code == 0, result.output
    for text in ("Chosen configuration", "Memory per GPU", "peak reserved", "predicted MFU", "Alternatives"):
        assert text in result.stdout
    assert "Why" not in result.stdout


def test_plan_explain_prints_the_reasons() -> None:
    result = runner.invoke(app, ["plan", "--explain"])
    assert result.exit_code == 0, result.output
    assert "Why" in result.stdout and "micro-batch" in result.stdout and "step time" in result.stdout


def test_plan_with_the_reference_calibration(tmp_path: Path) -> None:
    text = load_manifest(None).model_dump_json(by_alias=True, exclude_none=True)
    job = json.loads(text)
    job["spec"]["cluster"] = {"instanceType": "ml.p5en.48xlarge", "nodes": 1}
    path = _write(tmp_path, yaml.safe_dump(job))
    result = runner.invoke(app, ["plan", str(path), "-o", "json", "--calibration", "h200-reference"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["calibration"].startswith("h200-reference") and plan["chosen"]["precision"] == "bf16"


def test_unknown_calibration_is_exit_2() -> None:
    result = runner.invoke(app, ["plan", "--calibration", "nope"])
    assert result.exit_code == 2 and "unknown calibration 'nope'" in result.stderr


def test_bad_union_values_read_as_one_line_each(tmp_path: Path) -> None:
    result = runner.invoke(app, ["plan", str(_write(tmp_path, BAD_UNIONS))])
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    lines = result.stderr.strip().splitlines()
    assert (
        "spec.tuning.precision: must be one of 'auto', 'bf16', 'fp8', 'mxfp8', 'nvfp4' (got 'fp16')" in lines
    )
    assert "spec.tuning.microBatchSize: must be 'auto' or a whole number (got 'many')" in lines
    assert "spec.tuning.sharding: must be one of 'auto', 'full', 'hybrid', 'none' (got 'zero3')" in lines
    assert "spec.training.checkpoint.intervalSteps: must be >= 1 (got 0)" in lines


def test_planning_errors_are_one_line_and_exit_2(tmp_path: Path) -> None:
    text = BAD_UNIONS.replace("precision: fp16, microBatchSize: many, sharding: zero3", "precision: mxfp8")
    text = text.replace(
        "training: {checkpoint: {intervalSteps: 0}}", "cluster: {instanceType: ml.p5.48xlarge}"
    )
    result = runner.invoke(app, ["plan", str(_write(tmp_path, text))])
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        "error: spec.tuning.precision: mxfp8 needs compute capability 10.x (Blackwell); "
        "ml.p5.48xlarge has H100 (9.0). Fix: use fp8 or bf16; or spec.tuning.precision: auto"
    )


def test_unknown_preset_and_missing_file_exit_2(tmp_path: Path) -> None:
    text = BAD_UNIONS.replace("llama3.1-8b", "llama9").replace(
        "  tuning: {precision: fp16, microBatchSize: many, sharding: zero3}\n", ""
    )
    text = text.replace("  training: {checkpoint: {intervalSteps: 0}}\n", "")
    result = runner.invoke(app, ["plan", str(_write(tmp_path, text))])
    assert result.exit_code == 2 and "spec.model.preset: unknown preset 'llama9'" in result.stderr
    missing = runner.invoke(app, ["plan", str(tmp_path / "none.yaml")])
    assert missing.exit_code == 2 and "cannot read the file" in missing.stderr


def test_presets_lists_the_catalog() -> None:
    result = runner.invoke(app, ["presets"])
    assert result.exit_code == 0
    for name in ("llama3.2-1b", "llama3.1-70b", "qwen2.5-72b", "mistral-7b", "8,030,261,248"):
        assert name in result.stdout


PINNED_NVFP4 = """apiVersion: training.blackwell.dev/v1alpha1
kind: BlackwellTrainingJob
metadata: {name: fp4}
spec:
  model: {preset: qwen2.5-32b}
  cluster: {instanceType: ml.p6-b200.48xlarge, nodes: 4}
  training: {sequenceLength: 32768}
  tuning: {precision: nvfp4}
"""


def test_plan_table_says_what_each_choice_rests_on(tmp_path: Path) -> None:
    # The embedded example runs on B200: every choice is modelled, none unverified.
    result = runner.invoke(app, ["plan"])
    assert result.exit_code == 0, result.output
    assert "What the plan rests on: modelled" in result.stdout
    for choice in ("gpu", "precision", "activationCheckpointing", "communication", "contextParallel"):
        assert choice in result.stdout
    assert "unverified" not in result.stdout
    job = str(_write(tmp_path, PINNED_NVFP4))
    pinned = runner.invoke(app, ["plan", job, "--explain"])
    assert pinned.exit_code == 0, pinned.output
    assert "What the plan rests on: unverified" in pinned.stdout
    assert "provenance: unverified (trainer path never ran on a GPU here): precision nvfp4/nvfp4-block" in (
        " ".join(pinned.stdout.split())
    )


@pytest.mark.parametrize("columns", ["80", "200"])
def test_the_alternatives_key_is_never_cut(columns: str) -> None:
    # Issue 39: at 80 columns fp8/torchao-tensorwise and fp8/current both read `fp8/torc…` / `fp8/curr…`.
    result = runner.invoke(app, ["plan"], env={"COLUMNS": columns})
    assert result.exit_code == 0, result.output
    table = result.stdout.split("Alternatives", 1)[1]
    assert all(len(line) <= int(columns) for line in table.splitlines())
    plan = Plan.model_validate_json(runner.invoke(app, ["plan", "-o", "json"]).stdout)
    assert plan.alternatives
    for alternative in plan.alternatives:
        assert alternative.candidate.precision_recipe.value in table
        assert alternative.candidate.activation_checkpointing.value in table
    key_columns = [line.split()[:2] for line in table.splitlines() if line.strip()]
    assert not any("…" in word for words in key_columns for word in words), table


def test_one_plan_shows_one_budget(tmp_path: Path) -> None:
    # Issue 39: one H200's budget read 133.4 GiB in the memory table and 133.3 in the alternatives.
    import re

    path = tmp_path / "job.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "training.blackwell.dev/v1alpha1",
                "kind": "BlackwellTrainingJob",
                "metadata": {"name": "one-h200"},
                "spec": {
                    "model": {"preset": "llama3.1-8b"},
                    "cluster": {"instanceType": "ml.p5en.48xlarge", "nodes": 1, "gpusPerNode": 1},
                    "training": {"sequenceLength": 4096, "steps": 100},
                },
            }
        )
    )
    tables = runner.invoke(app, ["plan", str(path), "--explain"], env={"COLUMNS": "200"})
    summary = runner.invoke(app, ["render", str(path)])
    assert tables.exit_code == 0 and summary.exit_code == 0, tables.output + summary.output
    text = tables.stdout + summary.stderr
    shown = set(re.findall(r"(\d+\.\d) GiB budget", text))
    shown |= set(re.findall(r"GiB GPU less 5% headroom\s*│\s*(\d+\.\d)", text))
    assert len(re.findall(r"(\d+\.\d) GiB budget", text)) >= 3, text
    assert shown == {"133.3"}, shown  # 133.38 GiB, rounded down as a limit is


def test_plan_shows_the_global_batch_where_it_came_from_and_the_line_that_pins_it() -> None:
    root = Path(__file__).resolve().parents[2] / "examples"
    chosen = runner.invoke(app, ["plan", str(root / "llama3.2-1b-single-node.yaml")])
    assert chosen.exit_code == 0, chosen.output
    text = " ".join(chosen.stdout.split())
    assert "Global batch: 524,288 tokens per step, chosen by the planner's rule" in text
    # The exact YAML a user pastes into the manifest.
    assert "  spec:\n    training:\n      globalBatchTokens: 524288\n" in chosen.stdout
    pinned = runner.invoke(app, ["plan", "-o", "json", str(root / "llama3.1-8b-kueue.yaml")])
    assert pinned.exit_code == 0, pinned.output
    assert "pinned (spec.training.globalBatchTokens: 4194304)" in pinned.stderr
    json.loads(pinned.stdout)  # the plan alone on stdout


def test_an_alternative_over_the_budget_shows_one_peak() -> None:
    # Issue 39: a row read `149.9` in its peak column and `needs 150.0 GiB > 133.3 GiB budget` beside it.
    import re

    example = Path(__file__).parents[2] / "examples" / "h200-p5en.yaml"
    result = runner.invoke(app, ["plan", str(example)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    rows = [line for line in result.stdout.split("Alternatives", 1)[1].splitlines() if "needs" in line]
    assert rows, result.stdout
    for row in rows:
        cells = [cell.strip() for cell in row.strip("│ ").split("│")]
        need = re.search(r"needs (\d+\.\d) GiB", cells[-1])
        assert need and cells[-2] == need[1], row


def test_what_the_plan_rests_on_is_never_cut_at_80_columns() -> None:
    # Issue 39's walk: at 80 columns this table read `activationCheckpoin…`, `fp8/torchao-tensor…` and
    # `benchmarks/calibra…`; words longer than their column now fold instead.
    example = Path(__file__).parents[2] / "examples" / "h200-p5en.yaml"
    result = runner.invoke(app, ["plan", str(example)], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    table = result.stdout.split("What the plan rests on", 1)[1].split("Memory per GPU", 1)[0]
    assert "activationCheckpointing" in table and "…" not in table, table
    assert all(len(line) <= 80 for line in table.splitlines())
