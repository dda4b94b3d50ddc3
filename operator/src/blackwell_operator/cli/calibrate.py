"""`btj calibrate import|fit|report`: records -> calibration data file -> report with acceptance checks."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated

import typer
import yaml
from pydantic import ValidationError

from blackwell_operator.admission.yamlread import yaml_problem
from blackwell_operator.calibrate import MEMORY_TOLERANCE, PICK_RATIO, PRIOR_WEIGHT
from blackwell_operator.cli import app
from blackwell_operator.cli.manifest import fail
from blackwell_operator.cli.options import CALIBRATION_HELP, DEFAULT_CALIBRATION, read_calibration

calibrate_app = typer.Typer(
    help="Fit the planner's constants to measured records and report predicted vs measured.",
    no_args_is_help=True,
)
app.add_typer(calibrate_app, name="calibrate")

Records = Annotated[list[Path], typer.Argument(help="Record files (.jsonl/.json) or folders of them.")]
Prior = Annotated[float, typer.Option(min=0.0, help="Pull of each constant towards its base value.")]
Constants = Annotated[
    str,
    typer.Option(
        help="Comma-separated dotted constants to fit (default: all the records can determine); "
        "+name adds one to that default."
    ),
]


def _command(sub: str, records: list[Path], **options: object) -> str:
    """The command line that reproduces this run (written into the outputs as provenance)."""
    words = ["btj", "calibrate", sub, *(str(p) for p in records)]
    for flag, value in options.items():
        values = value if isinstance(value, list) else [value]
        words += [w for v in values if v not in ("", None) for w in (f"--{flag.replace('_', '-')}", str(v))]
    return " ".join(shlex.quote(w) for w in words)


def _need_numerics() -> None:
    """numpy (fit) and matplotlib (plots) come with the `plot` extra: say so instead of a traceback."""
    import importlib.util

    missing = [m for m in ("numpy", "matplotlib") if importlib.util.find_spec(m) is None]
    if missing:
        fail(f"{', '.join(missing)} not installed; pip install 'blackwell-training-operator[plot]'")


def _load(paths: list[Path]):  # type: ignore[no-untyped-def]
    _need_numerics()
    from blackwell_operator.calibrate.records import read_records

    for p in paths:
        if not p.exists():
            fail(f"RECORDS: {p} does not exist; pass record files or folders")
    try:
        records = read_records(paths)
    except (ValidationError, ValueError) as err:
        fail(f"RECORDS: not calibration records ({str(err).splitlines()[0]}); see `btj calibrate import`")
    if not records:
        fail("RECORDS: no records found; run `python -m benchmarks.calibration.harness` first")
    return records


def _base(name: str, option: str = "--base"):  # type: ignore[no-untyped-def]
    return read_calibration(name, option)


def _constants(text: str) -> list[str] | None:
    return [c.strip() for c in text.split(",") if c.strip()] or None


@calibrate_app.command("import")
def import_records(
    source: Annotated[
        Path,
        typer.Argument(
            help="Reference grid YAML, or a result JSON of benchmarks/trainer_h200.py, trainer_ab_h200.py or "
            "titan_h200.py."
        ),
    ],
    output: Annotated[Path, typer.Option("-o", "--output", help="JSON Lines file to write.")],
) -> None:
    """Convert earlier measurements (reference grid YAML, benchmark JSON) into calibration records."""
    from blackwell_operator.calibrate.importers import (
        UnknownDeviceError,
        from_reference_grid,
        from_result_file,
    )
    from blackwell_operator.calibrate.records import write_records

    if not source.is_file():
        fail(f"SOURCE: {source} is not a file")
    try:
        records = from_result_file(source) if source.suffix == ".json" else from_reference_grid(source)
    except yaml.YAMLError as err:
        fail(f"SOURCE: {source} is not valid YAML ({yaml_problem(err)})")
    except UnknownDeviceError as err:
        fail(f"SOURCE: {err}")
    except (KeyError, ValueError, TypeError, AttributeError, OSError) as err:  # JSON errors are ValueErrors
        fail(f"SOURCE: {source} is neither a reference grid nor a trainer benchmark result ({err!r:.200})")
    write_records(output, records)
    typer.echo(f"{len(records)} records -> {output}")


@calibrate_app.command("fit")
def fit(
    records: Records,
    output: Annotated[Path, typer.Option("-o", "--output", help="Calibration YAML to write.")],
    base: Annotated[str, typer.Option(help=f"The calibration to start from: {CALIBRATION_HELP}")] = (
        DEFAULT_CALIBRATION
    ),
    name: Annotated[str, typer.Option(help="Name of the new calibration (default: the file's stem).")] = "",
    constants: Constants = "",
    prior_weight: Prior = PRIOR_WEIGHT,
) -> None:
    """Fit the constants the records determine (least squares) and write the planner's calibration file."""
    from blackwell_operator.calibrate.fit import fit_calibration
    from blackwell_operator.calibrate.output import fitted_calibration, provenance_lines, write_calibration

    recs = _load(records)
    base_cal = _base(base)
    command = _command(
        "fit",
        records,
        base=base,
        output=output,
        name=name,
        constants=constants,
        prior_weight=prior_weight if prior_weight != PRIOR_WEIGHT else "",
    )
    try:
        result = fit_calibration(
            recs, base_cal, _constants(constants), prior_weight=prior_weight, progress=typer.echo
        )
    except KeyError as err:
        fail(f"--constants: {err.args[0]}")
    usable = [r for r in recs if r.ran or r.oom]
    cal = fitted_calibration(result, base_cal, usable, name or output.stem, command)
    prov = provenance_lines(result, base_cal, usable, command)
    write_calibration(output, cal, prov)
    typer.echo("\n".join(prov[4:]))
    typer.echo(f"wrote {output} ({len(result.fitted)} constants fitted from {len(usable)} records)")


@calibrate_app.command("report")
def report(
    records: Records,
    calibration: Annotated[
        Path, typer.Option(help="The fitted calibration YAML (from `btj calibrate fit`).")
    ],
    output: Annotated[Path, typer.Option("-o", "--output", help="Folder for report.md and plots/.")],
    base: Annotated[
        str, typer.Option(help="Base the leave-one-out refits start from (as for fit).")
    ] = "btj-trainer",
    constants: Constants = "",
    prior_weight: Prior = PRIOR_WEIGHT,
    title: Annotated[str, typer.Option(help="Report title.")] = "Calibration report",
    note: Annotated[list[str] | None, typer.Option(help="Extra paragraph(s) for the report.")] = None,
    fit_command: Annotated[str, typer.Option(help="The fit command, to list with the report's.")] = "",
    pick_ratio: Annotated[
        float, typer.Option(min=0.5, max=1.0, help="A pick passes at this share of the best measured.")
    ] = PICK_RATIO,
    memory_tolerance: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="Reserved memory passes within this relative error.")
    ] = MEMORY_TOLERANCE,
    tokens_tolerance: Annotated[
        float | None,
        typer.Option(min=0.0, max=1.0, help="Also judge tokens/s, passing within this relative error."),
    ] = None,
) -> None:
    """Predicted vs measured tables, plots, leave-one-out picks, and pass/fail per acceptance criterion."""
    from blackwell_operator.calibrate.checks import Thresholds, default_fitter, leave_one_out
    from blackwell_operator.calibrate.report import write_report

    recs = _load(records)
    cal = _base(str(calibration), "--calibration")
    base_cal = _base(base)
    thresholds = Thresholds(pick_ratio, memory_tolerance, tokens_tolerance)
    fitter = default_fitter(_constants(constants), prior_weight)
    check = leave_one_out(recs, base_cal, cal, fitter, thresholds=thresholds)
    command = _command(
        "report",
        records,
        calibration=calibration,
        base=base,
        constants=constants,
        prior_weight=prior_weight if prior_weight != PRIOR_WEIGHT else "",
        title=title if title != "Calibration report" else "",
        pick_ratio=pick_ratio if pick_ratio != PICK_RATIO else "",
        memory_tolerance=memory_tolerance if memory_tolerance != MEMORY_TOLERANCE else "",
        tokens_tolerance=tokens_tolerance if tokens_tolerance is not None else "",
        output=output,
    )
    commands = [c for c in (fit_command, command) if c]
    path = write_report(output, recs, cal, check, commands=commands, title=title, notes=note or [])
    for c in check.criteria:
        typer.echo(f"{c.verdict:8s} {c.name}: {c.detail}")
    typer.echo(f"wrote {path}")
    failed = [c.name for c in check.criteria if c.passed is False]
    if failed:  # a report whose acceptance criteria fail is a failed check, for scripts and CI alike
        typer.echo(f"FAILED: {len(failed)} of {len(check.criteria)} criteria ({', '.join(failed)})", err=True)
        raise typer.Exit(code=1)
