"""The `btj` command line: plan, render and run BlackwellTrainingJobs."""

from __future__ import annotations

import typer

app = typer.Typer(
    name="btj",
    help="Plan, render and run BlackwellTrainingJobs (offline previews need no cluster).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _register_commands() -> None:
    # Each command lives in its own module; importing it registers it on `app`.
    from blackwell_operator.cli import (
        calibrate,  # noqa: F401
        manifest,  # noqa: F401
        operator,  # noqa: F401
        plan,  # noqa: F401
        plot,  # noqa: F401
        render,  # noqa: F401
    )


def main() -> None:
    """Console-script entry point."""
    _register_commands()
    app()
