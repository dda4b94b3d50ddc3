"""The console the CLI's tables print to: as wide as the terminal, or 140 columns into a pipe or file."""

from __future__ import annotations

import os
import sys

from rich.console import Console

# Into a pipe or a file there is no width to fit: a table keeps its rows on one line up to this.
UNBOUNDED_COLUMNS = 140


def table_console() -> Console:
    """rich's console at the terminal's width (or $COLUMNS); 140 columns when stdout is not a terminal."""
    if sys.stdout.isatty() or os.environ.get("COLUMNS"):
        return Console()  # rich reads the terminal's width and $COLUMNS itself
    return Console(width=UNBOUNDED_COLUMNS)
