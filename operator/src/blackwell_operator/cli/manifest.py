"""Loading BTJ manifests for the CLI: clear one-line errors that name the field, never a traceback."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import NoReturn

import typer
import yaml
from pydantic import ValidationError

from blackwell_operator.models import BlackwellTrainingJob
from blackwell_operator.models.validation import format_validation_error

DEFAULT_EXAMPLE = "default.yaml"


def fail(message: str) -> NoReturn:
    """One clear message on stderr and exit code 2 (bad input), never a traceback."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=2)


class ManifestError(Exception):
    """A manifest that cannot be read or does not validate; the message is ready for the user."""


def read_manifest_text(path: Path | None) -> tuple[str, str]:
    """The manifest's text and a display name; the embedded default when no path is given."""
    if path is None:
        text = resources.files("blackwell_operator.examples").joinpath(DEFAULT_EXAMPLE).read_text()
        return text, f"(embedded example {DEFAULT_EXAMPLE})"
    try:
        return path.read_text(), str(path)
    except OSError as exc:
        raise ManifestError(f"{path}: cannot read the file ({exc.strerror})") from exc


def load_manifest(path: Path | None) -> BlackwellTrainingJob:
    """Parse and validate a BTJ manifest (one YAML document)."""
    text, name = read_manifest_text(path)
    try:
        documents = [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.YAMLError as exc:
        raise ManifestError(f"{name}: not valid YAML ({exc})") from exc
    jobs = [d for d in documents if isinstance(d, dict) and d.get("kind") == "BlackwellTrainingJob"]
    if len(jobs) != 1:
        raise ManifestError(f"{name}: expected exactly one BlackwellTrainingJob document, found {len(jobs)}")
    try:
        return BlackwellTrainingJob.model_validate(jobs[0])
    except ValidationError as exc:
        raise ManifestError(f"{name}: invalid BlackwellTrainingJob\n{format_validation_error(exc)}") from exc


def load_manifest_or_fail(path: Path | None) -> BlackwellTrainingJob:
    """`load_manifest` for a CLI command: a bad manifest ends the command with its one-line error."""
    try:
        return load_manifest(path)
    except ManifestError as exc:
        fail(str(exc))
