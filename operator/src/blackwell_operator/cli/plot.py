"""`btj plot [FILE] -o out.png`: the planner's memory breakdown and throughput-vs-micro-batch picture."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from blackwell_operator.cli import app
from blackwell_operator.cli.manifest import ManifestError, fail, load_manifest
from blackwell_operator.cli.options import DEFAULT_CALIBRATION, CalibrationOption, read_calibration
from blackwell_operator.errors import SpecError


@app.command("plot")
def plot(
    manifest: Annotated[
        Path | None, typer.Argument(help="BTJ manifest (default: the embedded example).")
    ] = None,
    output: Annotated[Path, typer.Option("-o", "--output", help="PNG to write.")] = Path("btj-plan.png"),
    calibration: CalibrationOption = DEFAULT_CALIBRATION,
) -> None:
    """Draw the plan's memory breakdown and predicted tokens/s and memory against micro-batch per AC mode."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        fail("matplotlib not installed; pip install 'blackwell-training-operator[plot]'")
    from blackwell_operator.calibrate.plots import plot_btj

    cal = read_calibration(calibration)
    if not output.parent.is_dir():  # matplotlib would end in a traceback after all the planning
        fail(f"-o/--output: folder {output.parent} does not exist; create it or choose another path")
    try:
        job = load_manifest(manifest)
        summary = plot_btj(job.spec, cal, output, title=job.metadata.name)
    except (ManifestError, SpecError, ValueError) as err:  # PlanningError is a SpecError
        fail(str(err))
    except OSError as err:
        fail(f"-o/--output: cannot write {output} ({err.strerror or err})")
    typer.echo(summary)
    typer.echo(f"wrote {output}")
