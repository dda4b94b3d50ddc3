"""The one verdict on a BTJ for every surface: the API server's admission (our CRD), then the models."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from blackwell_operator.admission import admission_errors
from blackwell_operator.admission.openapi import prune_nulls
from blackwell_operator.errors import SpecError
from blackwell_operator.models.spec import BlackwellTrainingJob, BlackwellTrainingJobSpec
from blackwell_operator.models.validation import format_validation_error


class Rejected(ValueError):
    """A BTJ the API server (or the models) would refuse; `lines` are one field each, ready for users."""

    def __init__(self, lines: list[str], *, spec_error: bool = False) -> None:
        self.lines = lines or ["manifest: invalid"]
        self.spec_error = spec_error  # the planner's own words for a rule it shares with the CRD
        super().__init__("\n".join(self.lines))


def _model_lines(exc: ValidationError, prefix: str = "") -> list[str]:
    return format_validation_error(exc, prefix=prefix).splitlines()


def validate_manifest(obj: Any) -> BlackwellTrainingJob:
    """A manifest as a user wrote it: refused when the API server would refuse it, else the model.

    The models' messages come first where both object (they merge union alternatives into one line);
    a manifest only the CRD refuses (`nodes: true`, which pydantic reads as 1) gets the CRD's.
    """
    admission = admission_errors(obj)
    try:  # the models see what the API server would store: its nulls pruned
        job = BlackwellTrainingJob.model_validate(prune_nulls(obj))
    except ValidationError as exc:
        raise Rejected(_model_lines(exc)) from None
    if admission:
        _storage_first(job.spec)
        raise Rejected(admission)
    return job


def _storage_first(spec: BlackwellTrainingJobSpec) -> None:
    """The storage rules (CEL in the CRD) in the planner's words, which name the volume and the fix."""
    from blackwell_operator.planner.storage import check_storage

    try:
        check_storage(spec)
    except SpecError as exc:
        raise Rejected([exc.message], spec_error=True) from None


def _plain(value: Any) -> Any:
    """Plain dicts and lists (Kopf hands over mapping views)."""
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value


def validate_body(body: Mapping[str, Any]) -> BlackwellTrainingJobSpec:
    """A BTJ read from the API server (the operator): the same check on what the user wrote.

    The CRD is the first line where the API server enforces it; this is the last wherever it is not
    (an older CRD installed, a server without CEL).
    """
    obj = _plain({"metadata": body.get("metadata"), "spec": body.get("spec")})
    admission = admission_errors(obj, server_side=True)
    spec = obj["spec"]
    if not isinstance(spec, Mapping):  # a string, list or number: the models cannot even start
        raise Rejected(admission)
    try:
        parsed = BlackwellTrainingJobSpec.model_validate(prune_nulls(spec))
    except ValidationError as exc:
        raise Rejected(_model_lines(exc, prefix="spec.")) from None
    if admission:
        _storage_first(parsed)
        raise Rejected(admission)
    return parsed
