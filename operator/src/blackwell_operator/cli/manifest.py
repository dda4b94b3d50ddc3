"""Loading BTJ manifests for the CLI: clear one-line errors that name the field, never a traceback."""

from __future__ import annotations

import sys
from importlib import resources
from pathlib import Path
from typing import NoReturn

import typer

from blackwell_operator.admission import InputError, decode, load_documents
from blackwell_operator.admission.job import Rejected, validate_manifest
from blackwell_operator.admission.limits import MAX_REQUEST_BYTES
from blackwell_operator.models import BlackwellTrainingJob
from blackwell_operator.models.validation import format_validation_error

__all__ = ["ManifestError", "fail", "format_validation_error", "load_manifest", "load_manifest_or_fail"]

DEFAULT_EXAMPLE = "default.yaml"


def fail(message: str) -> NoReturn:
    """One clear message on stderr and exit code 2 (bad input), never a traceback."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=2)


class ManifestError(Exception):
    """A manifest that cannot be read or does not validate; the message is ready for the user."""


STDIN = Path("-")


def read_manifest_text(path: Path | None) -> tuple[str, str]:
    """The manifest's text and a display name; the embedded default when no path is given, stdin for `-`."""
    if path is None:
        text = resources.files("blackwell_operator.examples").joinpath(DEFAULT_EXAMPLE).read_text()
        return text, f"(embedded example {DEFAULT_EXAMPLE})"
    name = "(standard input)" if path == STDIN else str(path)
    try:
        if path == STDIN:
            data = sys.stdin.buffer.read(MAX_REQUEST_BYTES + 1)
        elif path.is_dir():
            raise ManifestError(f"{path}: a directory, not a manifest file")
        else:
            with path.open("rb") as handle:  # never more than the limit: a 50 MB file is refused unread
                data = handle.read(MAX_REQUEST_BYTES + 1)
    except OSError as exc:
        raise ManifestError(f"{path}: cannot read the file ({exc.strerror})") from exc
    try:
        return decode(data, name), name
    except InputError as exc:
        raise ManifestError(str(exc)) from None


def load_manifest(path: Path | None) -> BlackwellTrainingJob:
    """Read, bound, parse and admit a BTJ manifest (one BlackwellTrainingJob document)."""
    text, name = read_manifest_text(path)
    try:
        documents = load_documents(text, name)
    except InputError as exc:
        raise ManifestError(str(exc)) from None
    jobs = [d for d in documents if isinstance(d, dict) and d.get("kind") == "BlackwellTrainingJob"]
    if len(jobs) != 1:
        raise ManifestError(f"{name}: expected exactly one BlackwellTrainingJob document, found {len(jobs)}")
    try:
        return validate_manifest(jobs[0])
    except Rejected as exc:
        header = "" if exc.spec_error else f"{name}: invalid BlackwellTrainingJob\n"
        raise ManifestError(f"{header}{exc}") from None


def load_manifest_or_fail(path: Path | None) -> BlackwellTrainingJob:
    """`load_manifest` for a CLI command: a bad manifest ends the command with its one-line error."""
    try:
        return load_manifest(path)
    except ManifestError as exc:
        fail(str(exc))
