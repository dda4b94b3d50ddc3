"""btj plan --cluster-calibration: an export or a ConfigMap copy corrects plans; a bad file is one line."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from typer.testing import CliRunner

from blackwell_operator.calibration.cluster import MIN_RUNS, ClusterCalibration, Sample
from blackwell_operator.calibration.learned_memory import MIN_READINGS, MemoryReading, MemorySource
from blackwell_operator.cli import _register_commands, app
from blackwell_operator.cli.cluster import memory_table
from blackwell_operator.cli.console import table_console
from blackwell_operator.handlers.cluster_calibration import body_of
from blackwell_trainer.plan.config import ActivationCheckpointing, PrecisionRecipe

_register_commands()
runner = CliRunner()
JOB = {
    "apiVersion": "training.blackwell.dev/v1alpha1",
    "kind": "BlackwellTrainingJob",
    "metadata": {"name": "j", "namespace": "team-a"},
    "spec": {
        "model": {"preset": "llama3.1-8b"},
        "cluster": {"instanceType": "ml.p6-b200.48xlarge", "nodes": 2},
        "training": {"sequenceLength": 8192, "steps": 100},
        "tuning": {"precision": "bf16", "activationCheckpointing": "selective"},
    },
}


def _calibration(runs: int = MIN_RUNS) -> ClusterCalibration:
    cal = ClusterCalibration()
    for i in range(runs):
        cal = cal.record(
            Sample(
                job=f"team-a/j{i}",
                uid=f"u{i}",
                instance_type="ml.p6-b200.48xlarge",
                precision_recipe=PrecisionRecipe.NONE,
                activation_checkpointing=ActivationCheckpointing.SELECTIVE,
                tokens_ratio=0.7,
                memory_ratio=1.0,
                observed_at="2026-12-01T10:00:00Z",
            )
        )
    return cal


def _files(tmp_path: Path) -> tuple[Path, Path]:
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(JOB))
    return job, tmp_path / "cluster.json"


def test_an_export_and_a_config_map_copy_give_the_same_corrected_plan(tmp_path: Path) -> None:
    job, export = _files(tmp_path)
    export.write_text(_calibration().model_dump_json(by_alias=True))
    copy = tmp_path / "cm.yaml"
    copy.write_text(yaml.safe_dump(body_of(_calibration(), "btj-system")))
    plans = []
    for source in (export, copy):
        result = runner.invoke(app, ["plan", str(job), "-o", "json", "--cluster-calibration", str(source)])
        assert result.exit_code == 0, result.output
        plans.append(json.loads(result.stdout))
    assert plans[0] == plans[1]
    assert (
        plans[0]["clusterCorrection"]["runs"] == MIN_RUNS
        and plans[0]["clusterCorrection"]["tokensFactor"] == 0.7
    )
    table = runner.invoke(app, ["plan", str(job), "--cluster-calibration", str(export)])
    assert "cluster correction" in table.output and "corrected from 3 runs on this cluster" in table.output


def test_too_few_runs_leave_the_plan_as_it_was(tmp_path: Path) -> None:
    job, export = _files(tmp_path)
    # One job: below MIN_RUNS for its family's speed and below MIN_READINGS for the GPU type's memory.
    export.write_text(_calibration(1).model_dump_json(by_alias=True))
    corrected = runner.invoke(app, ["plan", str(job), "-o", "json", "--cluster-calibration", str(export)])
    plain = runner.invoke(app, ["plan", str(job), "-o", "json"])
    assert json.loads(corrected.stdout) == json.loads(plain.stdout)


def test_a_learned_memory_factor_is_shown_with_its_readings_and_speed_stays_modelled(tmp_path: Path) -> None:
    job, export = _files(tmp_path)
    export.write_text(_calibration(MIN_READINGS).model_dump_json(by_alias=True))
    corrected = runner.invoke(app, ["plan", str(job), "-o", "json", "--cluster-calibration", str(export)])
    plain = json.loads(runner.invoke(app, ["plan", str(job), "-o", "json"]).stdout)
    correction = json.loads(corrected.stdout)["clusterCorrection"]
    assert correction["memoryReadings"] == MIN_READINGS and correction["tokensFactor"] == 1.0
    assert json.loads(corrected.stdout)["predicted"] == plain["predicted"]
    (line,) = [e for e in json.loads(corrected.stdout)["explanation"] if "on this cluster" in e]
    assert f"peak memory x1.00 (learned from {MIN_READINGS} measured peaks on this GPU type)" in line
    assert "tokens/s as modelled" in line


def test_a_bad_file_is_one_line_naming_the_option_and_the_fix(tmp_path: Path) -> None:
    job, _ = _files(tmp_path)
    cases = {
        "missing": (None, "cannot read"),
        "not yaml": ("{samples: [", "is not valid YAML or JSON"),
        "wrong shape": (json.dumps({"samples": [{"uid": "x"}]}), "is not a cluster calibration (samples.0"),
        "empty config map": (yaml.safe_dump({"kind": "ConfigMap", "data": {}}), "is missing"),
    }
    for name, (text, problem) in cases.items():
        path = tmp_path / f"{name}.json"
        if text is not None:
            path.write_text(text)
        result = runner.invoke(app, ["plan", str(job), "--cluster-calibration", str(path)])
        assert result.exit_code == 2, (name, result.output)
        (line,) = [x for x in result.output.splitlines() if x.strip()]
        assert line.startswith("error: --cluster-calibration: ") and problem in line, (name, line)


def test_show_lists_each_namespace_s_gpu_type_memory_readings_floors_and_factor() -> None:
    floor = MemoryReading(
        job="team-b/x",
        uid="ux/oom-1",
        instance_type="ml.p6-b200.48xlarge",
        source=MemorySource.OUT_OF_MEMORY,
        ratio=1.05,
        observed_at="2026-12-01T10:00:00Z",
    )
    calibration = _calibration(MIN_READINGS).record(
        Sample.model_validate({**_calibration(1).samples[0].model_dump(), "job": "team-c/y", "uid": "uy"})
    )
    console = table_console()
    with console.capture() as captured:
        console.print(memory_table(calibration.record_memory(floor)))
    rows = {line.split()[1]: line for line in captured.get().splitlines() if "team-" in line}
    assert "x1.00" in rows["team-a"] and "2" in rows["team-a"]
    assert "x1.05" in rows["team-b"]  # a floor alone
    assert "nothing yet (1 more reading(s) needed)" in rows["team-c"]
