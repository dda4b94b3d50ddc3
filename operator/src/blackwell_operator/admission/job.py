"""The one verdict on a BTJ for every surface: the API server's admission (our CRD), then the models."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from blackwell_operator.admission import admission_errors
from blackwell_operator.admission.openapi import prune_nulls
from blackwell_operator.errors import SpecError
from blackwell_operator.models.spec import BlackwellTrainingJob, BlackwellTrainingJobSpec
from blackwell_operator.models.validation import FieldMessage, field_messages


class Rejected(ValueError):
    """A BTJ the API server (or the models) would refuse; `lines` are one field each, ready for users."""

    def __init__(self, lines: list[str], *, spec_error: bool = False) -> None:
        self.lines = lines or ["manifest: invalid"]
        self.spec_error = spec_error  # the planner's own words for a rule it shares with the CRD
        super().__init__("\n".join(self.lines))


def _path(line: str) -> str:
    return line.split(": ", 1)[0]


def _words(line: str) -> str:
    """A refusal's words, whichever field it is written under: `a.b: needs x` and `a.b needs x` alike."""
    return line.replace(": ", " ", 1)


def combined(admission: list[str], models: list[FieldMessage]) -> list[str]:
    """Every field's refusal once: the CRD's line, or the models' where theirs says more.

    The CRD's lines name each field the API server refuses, with the fix; the models' replace them
    where they are the models' own rule (a fix in their words, a union's alternatives merged) and add
    the fields only the models check. Unknown fields are the CRD's (it names the closest known one).
    """
    own = {m.path: m for m in models if m.own}
    lines = [str(own[_path(line)]) if _path(line) in own else line for line in admission]
    covered = {_path(line) for line in admission}
    said = {_words(line) for line in lines}
    for message in models:
        parent = message.path.rpartition(".")[0]
        if message.path in covered or (message.kind == "extra_forbidden" and parent in covered):
            continue
        # A rule both check (a CEL rule of the CRD and the models' validator on the whole spec): the CRD
        # names the field (`spec.cluster.elastic: needs ...`), the models the spec (`spec: spec.cluster.
        # elastic needs ...`); the same words once.
        if message.text in said:
            continue
        lines.append(str(message))
    return list(dict.fromkeys(lines))


def validate_manifest(obj: Any) -> BlackwellTrainingJob:
    """A manifest as a user wrote it: refused when the API server would refuse it, else the model.

    Every field either refuses is named in one pass (`combined`); a manifest only the CRD refuses
    (`nodes: true`, which pydantic reads as 1) is refused all the same.
    """
    admission = admission_errors(obj)
    try:  # the models see what the API server would store: its nulls pruned
        job = BlackwellTrainingJob.model_validate(prune_nulls(obj))
    except ValidationError as exc:
        raise Rejected(combined(admission, field_messages(exc))) from None
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
        raise Rejected(combined(admission, field_messages(exc, prefix="spec."))) from None
    if admission:
        _storage_first(parsed)
        raise Rejected(admission)
    return parsed
