"""Loading BTJ manifests for the CLI: clear one-line errors that name the field, never a traceback."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import NoReturn

import typer
import yaml
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from blackwell_operator.models import BlackwellTrainingJob

DEFAULT_EXAMPLE = "default.yaml"


def fail(message: str) -> NoReturn:
    """One clear message on stderr and exit code 2 (bad input), never a traceback."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=2)


class ManifestError(Exception):
    """A manifest that cannot be read or does not validate; the message is ready for the user."""


# loc parts that name a union branch or a validator, not a field.
_BRANCH_PREFIXES = ("literal[", "str-enum[", "enum[", "constrained-", "function-", "lax-", "json-or-python[")
_BRANCH_NAMES = {"int", "float", "str", "bool"}
_NUMBER_ERRORS = {"int_parsing", "int_type", "int_from_float", "float_parsing", "float_type"}
_BOUND_ERRORS = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}


def _field_path(loc: tuple[int | str, ...]) -> str:
    parts = [str(p) for p in loc]
    return ".".join(p for p in parts if p not in _BRANCH_NAMES and not p.startswith(_BRANCH_PREFIXES))


def _merge_union(items: list[ErrorDetails]) -> str | None:
    """One message for a union field (auto | enum | number): the allowed values and what was given."""
    literals: list[str] = []
    others: list[str] = []
    for item in items:
        kind, ctx = item["type"], item.get("ctx") or {}
        if kind in ("literal_error", "enum"):
            literals.extend(v.strip() for v in str(ctx.get("expected", "")).replace(" or ", ", ").split(","))
        elif kind in _NUMBER_ERRORS:
            others.append("a whole number" if kind.startswith("int") else "a number")
        elif kind in _BOUND_ERRORS:
            others.append(f"a number {_BOUND_ERRORS[kind]} {next(iter(ctx.values()), '')}")
        else:
            return None
    values = list(dict.fromkeys(v for v in literals if v))
    text = " or ".join(
        [*([f"one of {', '.join(values)}"] if len(values) > 1 else values), *dict.fromkeys(others)]
    )
    return f"must be {text} (got {items[0].get('input')!r})"


def format_validation_error(error: ValidationError, prefix: str = "") -> str:
    """One line per field: the dotted wire path and what is wrong (union alternatives merged)."""
    grouped: dict[str, list[ErrorDetails]] = {}
    for item in error.errors():
        grouped.setdefault(_field_path(item["loc"]), []).append(item)
    lines = []
    for path, items in grouped.items():
        where = f"{prefix}{path}" if path else prefix.rstrip(".") or "manifest"
        merged = _merge_union(items) if len(items) > 1 else None
        if merged is not None:
            lines.append(f"{where}: {merged}")
        else:
            lines.extend(f"{where}: {item['msg']}" for item in items)
    return "\n".join(dict.fromkeys(lines))


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
