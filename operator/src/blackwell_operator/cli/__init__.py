"""The `btj` command line: plan, render and run BlackwellTrainingJobs."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from blackwell_operator import __version__


def _flags_take_no_value() -> None:
    """Help shows no `<bool>` after a flag (`--explain`, `--help`): it takes no value (issue 39).

    typer 0.29's rich help prints every option's type, flags' included; a flag's type column is left empty.
    """
    from typer.core import TyperOption

    shown = TyperOption.display_type_rich

    def display_type_rich(self: TyperOption, ctx: Any) -> str | None:
        return None if self.is_flag and not self.metavar else shown(self, ctx)

    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]


_flags_take_no_value()

app = typer.Typer(
    name="btj",
    help="Plan, render and run BlackwellTrainingJobs (offline previews need no cluster).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    # -h as well as --help, on every command (subcommands inherit the group's context settings).
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"btj {__version__}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """Plan, render and run BlackwellTrainingJobs (offline previews need no cluster)."""


def _register_commands() -> None:
    # Each command lives in its own module; importing it registers it on `app`.
    from blackwell_operator.cli import (
        calibrate,  # noqa: F401
        cluster,  # noqa: F401
        manifest,  # noqa: F401
        operator,  # noqa: F401
        plan,  # noqa: F401
        plot,  # noqa: F401
        release,  # noqa: F401
        render,  # noqa: F401
        train,  # noqa: F401
    )


def main() -> None:
    """Console-script entry point."""
    _register_commands()
    app()
