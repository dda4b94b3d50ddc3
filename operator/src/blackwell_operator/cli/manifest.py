"""Loading BTJ manifests for the CLI: clear one-line errors that name the field, never a traceback."""

from __future__ import annotations

import os
import sys
from importlib import resources
from pathlib import Path
from typing import Any, NoReturn

import typer

from blackwell_operator.admission import InputError, decode, load_documents
from blackwell_operator.admission.job import Rejected, validate_manifest
from blackwell_operator.admission.limits import MAX_REQUEST_BYTES
from blackwell_operator.models import BlackwellTrainingJob
from blackwell_operator.models.spec import KIND
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


def read_manifest_text(path: Path | None, notes: list[str] | None = None) -> tuple[str, str]:
    """The manifest's text and a display name; the embedded default when no path is given, stdin for `-`.

    notes: gets a line for each thing kubectl reads silently that a person may not mean (a byte that is
    not UTF-8).
    """
    if path is None:
        text = resources.files("blackwell_operator.examples").joinpath(DEFAULT_EXAMPLE).read_text()
        return text, f"(embedded example {DEFAULT_EXAMPLE})"
    name = "(standard input)" if path == STDIN else str(path)
    size = None
    try:
        if path == STDIN:
            data = sys.stdin.buffer.read(MAX_REQUEST_BYTES + 1)
        elif path.is_dir():
            raise ManifestError(f"{path}: a directory, not a manifest file")
        else:
            with path.open("rb") as handle:  # never more than the limit: a 50 MB file is refused unread
                size = os.fstat(handle.fileno()).st_size
                data = handle.read(MAX_REQUEST_BYTES + 1)
    except OSError as exc:
        raise ManifestError(f"{path}: cannot read the file ({exc.strerror})") from exc
    try:
        return decode(data, name, size=size, notes=notes), name
    except InputError as exc:
        raise ManifestError(str(exc)) from None


def _kind_of(document: Any) -> str:
    return {list: "a list", str: "a string", bool: "a boolean"}.get(type(document), "a number")


def pick_job_document(documents: list[Any], name: str) -> dict[str, Any]:
    """The one BlackwellTrainingJob among a file's documents, read as `kubectl apply -f` reads them.

    kubectl sends every document and refuses one that is not an object; btj does the same, skips the
    objects of other kinds (a Namespace or a ConfigMap next to the job) and plans one job a run.
    """
    for number, document in enumerate(documents, 1):
        if not isinstance(document, dict):
            raise ManifestError(
                f"{name}: document {number} is {_kind_of(document)}, not a Kubernetes object (kubectl "
                "refuses it too); each document must be a mapping with apiVersion, kind and metadata"
            )
        kind = str(document.get("kind", ""))
        if kind.endswith("List") and isinstance(document.get("items"), list):
            raise ManifestError(
                f"{name}: document {number} is a {kind} (what `kubectl get -o yaml` writes), which btj does "
                f"not read: it reads one {KIND} object; save the job alone (`kubectl get btj NAME -o yaml`) "
                "or copy the item out of items"
            )
    jobs = [d for d in documents if d.get("kind") == KIND]
    if not jobs and len(documents) == 1:
        return dict(documents[0])  # judged as a BTJ: its errors (kind, apiVersion, ...) name the fix
    if not jobs:
        kinds = ", ".join(sorted({str(d.get("kind")) for d in documents})) or "none: the file is empty"
        raise ManifestError(f"{name}: no {KIND} document (kinds found: {kinds})")
    if len(jobs) > 1:
        names = ", ".join(str((job.get("metadata") or {}).get("name")) for job in jobs)
        raise ManifestError(
            f"{name}: {len(jobs)} {KIND} documents ({names}); btj plans and renders one job a run: put "
            "each in its own file (kubectl apply -f takes a folder of them)"
        )
    return dict(jobs[0])


# What the API server sets on an object, which `kubectl get -o yaml` writes and a create does not take: it
# refuses a create that sets metadata.resourceVersion ("resourceVersion should not be set on objects to be
# created"; kubectl apply of an object that exists sends it as a precondition), and fills uid, generation,
# creationTimestamp and managedFields itself; status is the status subresource's, dropped on create.
SERVER_SET_METADATA = ("resourceVersion", "uid", "generation", "creationTimestamp", "managedFields")


def server_set_fields(document: dict[str, Any]) -> list[str]:
    """The fields of a manifest that came from `kubectl get` (the API server's own), in manifest order."""
    metadata = document.get("metadata")
    found = (
        [f"metadata.{key}" for key in metadata if key in SERVER_SET_METADATA]
        if isinstance(metadata, dict)
        else []
    )
    return [*found, *(["status"] if "status" in document else [])]


def _server_set_note(document: dict[str, Any], name: str) -> str | None:
    """The warning for a manifest pasted from `kubectl get`: which fields, and what the cluster does."""
    fields = server_set_fields(document)
    if not fields:
        return None
    refused = (
        "; `kubectl create` refuses metadata.resourceVersion, and `kubectl apply` uses it as a precondition "
        "on a job that exists"
        if "metadata.resourceVersion" in fields
        else ""
    )
    return (
        f"{name}: {', '.join(fields)} come from `kubectl get` (the API server sets them and ignores them on "
        f"create{refused}); btj ignores them: delete them before applying the file as a new job"
    )


def _warn(notes: list[str]) -> None:
    for note in dict.fromkeys(notes):
        typer.echo(f"warning: {note}", err=True)


def load_manifest(path: Path | None) -> BlackwellTrainingJob:
    """Read, bound, parse and admit a BTJ manifest (one BlackwellTrainingJob document)."""
    notes: list[str] = []
    text, name = read_manifest_text(path, notes)
    try:
        documents = load_documents(text, name, notes)
    except InputError as exc:
        raise ManifestError(str(exc)) from None
    _warn(notes)
    try:
        document = pick_job_document(documents, name)
        pasted = _server_set_note(document, name)
        if pasted:
            _warn([pasted])
        return validate_manifest(document)
    except Rejected as exc:
        header = "" if exc.spec_error else f"{name}: invalid BlackwellTrainingJob\n"
        raise ManifestError(f"{header}{exc}") from None


def load_manifest_or_fail(path: Path | None) -> BlackwellTrainingJob:
    """`load_manifest` for a CLI command: a bad manifest ends the command with its one-line error."""
    try:
        return load_manifest(path)
    except ManifestError as exc:
        fail(str(exc))
