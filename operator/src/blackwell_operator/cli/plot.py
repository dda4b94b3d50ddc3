"""`btj plot [FILE] -o out.png`: the planner's memory breakdown and throughput-vs-micro-batch picture."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from blackwell_operator.cli import app
from blackwell_operator.cli.manifest import ManifestError, fail, load_manifest
from blackwell_operator.errors import SpecError


@app.command("plot")
def plot(
    manifest: Annotated[
        Path | None, typer.Argument(help="BTJ manifest (default: the embedded example).")
    ] = None,
    output: Annotated[Path, typer.Option("-o", "--output", help="PNG to write.")] = Path("btj-plan.png"),
    calibration: Annotated[
        str, typer.Option(help="Shipped calibration name or a calibration YAML file.")
    ] = "btj-trainer",
) -> None:
    """Draw the plan's memory breakdown and predicted tokens/s and memory against micro-batch per AC mode."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        fail("matplotlib not installed; pip install 'blackwell-training-operator[plot]'")
    from blackwell_operator.calibrate.plots import plot_btj
    from blackwell_operator.calibrate.predict import load_any_calibration

    try:
        job = load_manifest(manifest)
        cal = load_any_calibration(calibration)
        summary = plot_btj(job.spec, cal, output, title=job.metadata.name)
    except (ManifestError, SpecError, ValueError) as err:  # PlanningError is a SpecError
        fail(str(err))
    typer.echo(summary)
    typer.echo(f"wrote {output}")
