"""CLI habits: --version, -h everywhere, one calibration option, the right option blamed, no hang."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from blackwell_operator import __version__
from blackwell_operator.cli import _register_commands, app

_register_commands()
runner = CliRunner()

COMMANDS = [
    [],
    ["plan"],
    ["render"],
    ["plot"],
    ["demo"],
    ["run"],
    ["release-children"],
    ["crd"],
    ["presets"],
    ["calibrate"],
    ["calibrate", "import"],
    ["calibrate", "fit"],
    ["calibrate", "report"],
]


def test_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.stdout.strip() == f"btj {__version__}"


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "btj")
def test_short_help_on_every_command(command: list[str]) -> None:
    short, long = runner.invoke(app, [*command, "-h"]), runner.invoke(app, [*command, "--help"])
    assert short.exit_code == 0 and "Usage: btj" in short.stdout, short.output
    assert short.stdout == long.stdout


def test_planning_commands_share_the_calibration_option() -> None:
    helps = {c: runner.invoke(app, [c, "-h"]).stdout for c in ("plan", "plot")}
    for command, text in helps.items():
        assert "--calibration" in text and "calibrate fit" in " ".join(text.split()), command
    for command in ("plan", "plot"):
        result = runner.invoke(app, [command, "--calibration", "nope"])
        assert result.exit_code == 2
        assert result.stderr.startswith("error: --calibration: unknown calibration 'nope'"), result.stderr


@pytest.fixture
def records(tmp_path: Path) -> Path:
    from blackwell_operator.calibrate.records import write_records
    from blackwell_operator.calibration import load_calibration
    from tests.support.calibration_records import grid_stubs, measure

    path = tmp_path / "records.jsonl"
    write_records(path, measure(grid_stubs(["llama3.2-1b"], [4096], ["none"], [1]), load_calibration(), 0))
    return path


def test_a_broken_calibration_file_is_one_line_naming_the_option(tmp_path: Path, records: Path) -> None:
    broken = tmp_path / "cal.yaml"
    broken.write_text("name: [\n")
    out = str(tmp_path / "out")
    for option, argv in (
        ("--calibration", ["plan", "--calibration", str(broken)]),
        ("--calibration", ["plot", "-o", f"{tmp_path}/x.png", "--calibration", str(broken)]),
        ("--base", ["calibrate", "fit", str(records), "-o", out, "--base", str(broken)]),
        ("--calibration", ["calibrate", "report", str(records), "-o", out, "--calibration", str(broken)]),
        (
            "--base",
            [
                "calibrate",
                "report",
                str(records),
                "-o",
                out,
                "--calibration",
                "btj-trainer",
                "--base",
                str(broken),
            ],
        ),
    ):
        result = runner.invoke(app, argv)
        assert result.exit_code == 2 and "Traceback" not in result.output, argv
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith(f"error: {option}: {broken} is not valid YAML (line 2"), (argv, line)


def test_report_blames_calibration_not_base(tmp_path: Path, records: Path) -> None:
    result = runner.invoke(
        app, ["calibrate", "report", str(records), "--calibration", "nope", "-o", str(tmp_path / "out")]
    )
    assert result.exit_code == 2
    assert result.stderr.startswith("error: --calibration: unknown calibration 'nope'"), result.stderr


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"models: [\n", "is not valid YAML (line 2"),
        (b"\xff\xfe not text", "is neither a reference grid"),
        (b"just a string\n", "is neither a reference grid"),
    ],
    ids=["broken-yaml", "binary", "not-a-grid"],
)
def test_calibrate_import_on_bad_input_is_one_line(tmp_path: Path, content: bytes, expected: str) -> None:
    source = tmp_path / "grid.yaml"
    source.write_bytes(content)
    result = runner.invoke(app, ["calibrate", "import", str(source), "-o", str(tmp_path / "r.jsonl")])
    assert result.exit_code == 2 and "Traceback" not in result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: SOURCE: ") and expected in line, line


def test_calibrate_import_of_a_result_from_an_unknown_gpu_names_the_field_and_the_fix(tmp_path: Path) -> None:
    source = tmp_path / "titan_side_by_side.json"
    meta = {"device": "NVIDIA A100-SXM4-80GB, 550.54.15, 81920 MiB", "sequence_length": 4096}
    source.write_text(json.dumps({"meta": meta, "rows": []}))
    result = runner.invoke(app, ["calibrate", "import", str(source), "-o", str(tmp_path / "r.jsonl")])
    assert result.exit_code == 2 and "Traceback" not in result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: SOURCE: ") and "meta.device 'NVIDIA A100-SXM4-80GB'" in line, line
    assert "Fix: " in line and not (tmp_path / "r.jsonl").exists()


def test_run_without_a_cluster_ends_with_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing-kubeconfig"))
    started = time.perf_counter()
    result = runner.invoke(app, ["run", "--metrics-bind", "off"])
    assert time.perf_counter() - started < 30, "no retry loop"
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: no cluster credentials:") and "missing-kubeconfig" in line
