"""The measured coverage is built from the records: only completed runs count, per GPU and combination."""

from __future__ import annotations

import json
from pathlib import Path

from blackwell_operator.calibrate.measured import RECORDS, build_coverage
from blackwell_operator.calibrate.records import RecordStatus, read_records, write_records

ROOT = Path(__file__).resolve().parents[2]


def test_only_completed_runs_count_and_each_names_its_records(tmp_path: Path) -> None:
    real = read_records([ROOT / RECORDS / "h200-te"])
    ok = next(r for r in real if r.candidate.precision_recipe.value == "current")
    mx = ok.model_copy(deep=True)
    mx.candidate.precision_recipe = type(mx.candidate.precision_recipe)("mxfp8-block")
    oom = mx.model_copy(update={"status": RecordStatus.OOM})
    timeout = mx.model_copy(update={"status": RecordStatus.TIMEOUT})
    (tmp_path / RECORDS / "run-a").mkdir(parents=True)
    write_records(tmp_path / RECORDS / "run-a" / "r.jsonl", [ok, ok, oom, timeout])
    coverage = build_coverage(tmp_path)["btj-trainer"]
    assert [(c.recipe.value, c.runs, c.sources) for c in coverage.combinations] == [
        ("current", 2, [f"{RECORDS}/run-a"])
    ]
    assert coverage.combinations[0].gpu == "H200"
    # The same configuration completing once makes the recipe's path verified.
    write_records(tmp_path / RECORDS / "run-b.jsonl", [mx])
    recipes = {c.recipe.value for c in build_coverage(tmp_path)["btj-trainer"].combinations}
    assert recipes == {"current", "mxfp8-block"}
    assert build_coverage(tmp_path)["btj-trainer"].path_checks == []


def test_a_context_parallel_check_counts_only_when_it_exited_zero(tmp_path: Path) -> None:
    (tmp_path / RECORDS).mkdir(parents=True)
    results = tmp_path / "benchmarks" / "results"
    results.mkdir(parents=True)
    real = read_records([ROOT / RECORDS / "h200-te"])[:1]
    write_records(tmp_path / RECORDS / "r.jsonl", real)
    check = {
        "environment": {"gpus": ["NVIDIA H200"] * 4},
        "context_parallel": {
            "cp1": {"rc": 0},
            "cp2": {"rc": 0},
            "cp4": {"rc": 1},
            "steps_compared": 6,
            "worst_relative_loss_difference": 0.01,
        },
    }
    (results / "gpu_e2e_check_h200x4.json").write_text(json.dumps(check))
    checks = build_coverage(tmp_path)["btj-trainer"].path_checks
    assert [(p.degree, p.gpu, p.gpus, p.result) for p in checks] == [
        (2, "H200", 4, "ran 6 steps, loss within 1.0% of the unsplit run")
    ]
