"""Report, plots and the CLI: files are produced and bad input gets one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from blackwell_operator.calibrate.checks import leave_one_out
from blackwell_operator.calibrate.predict import load_any_calibration
from blackwell_operator.calibrate.records import write_records
from blackwell_operator.calibrate.report import write_report
from blackwell_operator.calibration import Calibration
from blackwell_operator.cli import _register_commands, app
from tests.support.calibration_records import grid_stubs, measure

REFERENCE_GRID = Path(__file__).resolve().parents[1] / "planner" / "data" / "h200_reference_grid.yaml"
PNG = b"\x89PNG"


@pytest.fixture(scope="module")
def runner() -> CliRunner:
    _register_commands()
    return CliRunner()


def test_report_writes_markdown_and_one_png_per_scenario(tmp_path: Path, base: Calibration) -> None:
    records = measure(grid_stubs(["llama3.2-1b"], [4096, 8192], ["none", "full"], [1, 2, 4]), base, 0.01)
    check = leave_one_out(records, base, base, lambda recs, start: start)
    path = write_report(tmp_path, records, base, check, commands=["btj calibrate report ..."])
    text = path.read_text()
    assert "## Acceptance criteria" in text and "btj calibrate report ..." in text
    assert sum(line.startswith("| llama3.2-1b_s") for line in text.splitlines()) == len(records)
    pngs = sorted((tmp_path / "plots").glob("*.png"))
    assert [p.name for p in pngs] == ["llama3.2-1b_s4096_g1.png", "llama3.2-1b_s8192_g1.png"]
    for png in pngs:
        assert png.read_bytes()[:4] == PNG and png.stat().st_size > 10_000


def test_btj_plot_writes_a_png(tmp_path: Path, runner: CliRunner) -> None:
    out = tmp_path / "plan.png"
    result = runner.invoke(app, ["plot", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:4] == PNG and out.stat().st_size > 10_000
    assert "tokens/s per GPU predicted (modelled, not measured)" in result.output


def test_btj_plot_says_modelled_on_the_picture(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Issue 39: the picture travels alone; its B200 figures are modelled, and it says so.
    import matplotlib

    from blackwell_operator.calibrate.plots import plot_btj
    from blackwell_operator.cli.manifest import load_manifest

    monkeypatch.setitem(matplotlib.rcParams, "svg.fonttype", "none")  # text as text, to be read back
    out = tmp_path / "plan.svg"
    job = load_manifest(None)
    plot_btj(job.spec, load_any_calibration("btj-trainer"), out, title=job.metadata.name)
    svg = out.read_text()
    assert svg.count("modelled, not measured") == 3, "the title and both axes of predicted figures"
    # Its FP8 tensorwise selective line lies on AC none's (trainer.selective_recomputes_nothing): both
    # legends say why.
    assert svg.count("AC selective (runs as none)") == 2 and "AC full (runs as" not in svg


def test_btj_plot_draws_a_job_that_does_not_fit(tmp_path: Path, runner: CliRunner) -> None:
    manifest = tmp_path / "big.yaml"
    manifest.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "training.blackwell.dev/v1alpha1",
                "kind": "BlackwellTrainingJob",
                "metadata": {"name": "too-big"},
                "spec": {
                    "model": {"preset": "llama3.1-70b"},
                    "cluster": {"instanceType": "ml.p5en.48xlarge", "nodes": 1, "gpusPerNode": 1},
                },
            }
        )
    )
    out = tmp_path / "big.png"
    result = runner.invoke(app, ["plot", str(manifest), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "no plan" in result.output and out.stat().st_size > 10_000


def test_btj_plot_bad_input_is_one_line(tmp_path: Path, runner: CliRunner) -> None:
    result = runner.invoke(app, ["plot", str(tmp_path / "missing.yaml"), "-o", str(tmp_path / "x.png")])
    assert result.exit_code == 2 and result.output.startswith("error: ") and "Traceback" not in result.output
    result = runner.invoke(app, ["plot", "-o", str(tmp_path / "x.png"), "--calibration", "nope"])
    assert result.exit_code == 2 and "calibration 'nope'" in result.output
    result = runner.invoke(app, ["plot", "-o", str(tmp_path / "no" / "such" / "x.png")])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.output.startswith("error: -o/--output: folder ") and "does not exist" in result.output


def test_cli_import_fit_report_on_the_reference_grid(tmp_path: Path, runner: CliRunner) -> None:
    if not REFERENCE_GRID.exists():
        pytest.skip("tests/planner/data/h200_reference_grid.yaml is absent")
    records = tmp_path / "ref.jsonl"
    assert runner.invoke(app, ["calibrate", "import", str(REFERENCE_GRID), "-o", str(records)]).exit_code == 0
    cal_path = tmp_path / "h200-ref-fit.yaml"
    consts = "memory.act_hidden,memory.loss_bytes_per_logit,throughput.recipes.9.none.efficiency"
    fit = runner.invoke(
        app,
        [
            "calibrate",
            "fit",
            str(records),
            "--base",
            "h200-reference",
            "-o",
            str(cal_path),
            "--constants",
            consts,
        ],
    )
    assert fit.exit_code == 0, fit.output
    cal = load_any_calibration(cal_path)
    assert cal.name == "h200-ref-fit" and cal.status == "mixed" and "NOT measured" in cal.description
    assert "fitted by `btj calibrate fit" in cal.sources["memory.act_hidden"]
    assert cal_path.read_text().startswith("# Generated by: ")
    # The file fit wrote is a calibration every planning command takes (issue 16).
    job = tmp_path / "h200.yaml"
    job.write_text(
        "apiVersion: training.blackwell.dev/v1alpha1\nkind: BlackwellTrainingJob\nmetadata: {name: h}\n"
        "spec: {model: {preset: llama3.2-1b}, cluster: {instanceType: ml.p5en.48xlarge, nodes: 1}}\n"
    )
    planned = runner.invoke(app, ["plan", str(job), "-o", "json", "--calibration", str(cal_path)])
    assert planned.exit_code == 0, planned.output
    assert '"calibration": "h200-ref-fit' in planned.stdout
    report = runner.invoke(
        app,
        [
            "calibrate",
            "report",
            str(records),
            "--calibration",
            str(cal_path),
            "--base",
            "h200-reference",
            "--constants",
            consts,
            "-o",
            str(tmp_path / "rep"),
        ],
    )
    assert report.exit_code in (0, 1), report.output  # 1 = a leave-one-out criterion failed
    failed = [line for line in report.stdout.splitlines() if line.startswith("FAIL ")]
    assert (report.exit_code == 1) == bool(failed), report.output  # any failed criterion: exit 1
    assert "leave-one-out: pick >= 97%" in report.output
    assert (tmp_path / "rep" / "report.md").exists()
    assert len(list((tmp_path / "rep" / "plots").glob("*.png"))) == 5


def test_cli_fit_bad_input(tmp_path: Path, runner: CliRunner) -> None:
    result = runner.invoke(
        app, ["calibrate", "fit", str(tmp_path / "none.jsonl"), "-o", str(tmp_path / "o.yaml")]
    )
    assert result.exit_code == 2 and result.output.startswith("error: RECORDS:")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"hello": 1}\n')
    result = runner.invoke(app, ["calibrate", "fit", str(bad), "-o", str(tmp_path / "o.yaml")])
    assert result.exit_code == 2 and "not calibration records" in result.output
    good = tmp_path / "good.jsonl"
    write_records(
        good,
        measure(grid_stubs(["llama3.2-1b"], [4096], ["none"], [1]), load_any_calibration("btj-trainer"), 0),
    )
    result = runner.invoke(
        app, ["calibrate", "fit", str(good), "-o", str(tmp_path / "o.yaml"), "--constants", "memory.nope"]
    )
    assert result.exit_code == 2 and "memory.nope" in result.output
    mixed = "memory.act_hidden,+throughput.attention_efficiency"
    result = runner.invoke(
        app, ["calibrate", "fit", str(good), "-o", str(tmp_path / "o.yaml"), "--constants", mixed]
    )
    assert result.exit_code == 2 and "give either the whole list or only +names" in result.output
    result = runner.invoke(
        app, ["calibrate", "fit", str(good), "-o", str(tmp_path / "o.yaml"), "--base", "nope"]
    )
    assert result.exit_code == 2 and result.output.startswith("error: --base:")


def test_report_names_a_harness_ladder_cut_before_its_oom(tmp_path: Path, base: Calibration) -> None:
    stubs = [
        s.model_copy(update={"source": "harness"})
        for s in grid_stubs(["llama3.2-1b"], [4096], ["none"], [1, 2])
    ]
    records = measure(stubs, base, 0.01)  # mbs 1 and 2 both fit, and mbs 4 was never run
    check = leave_one_out(records, base, base, lambda recs, start: start)
    text = write_report(tmp_path, records, base, check, commands=["btj calibrate report ..."]).read_text()
    assert "## Grid coverage" in text
    assert "| llama3.2-1b s4096 g1 bf16 ac-none shard-full | 2 | 4 | not run |" in text
    imported = write_report(
        tmp_path / "imported",
        measure(grid_stubs(["llama3.2-1b"], [4096], ["none"], [1, 2]), base, 0.01),
        base,
        check,
        commands=[],
    ).read_text()
    assert "## Grid coverage" not in imported
