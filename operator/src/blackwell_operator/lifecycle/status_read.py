"""Reading a stored status tolerantly: what validates, and a line for each part that does not.

A status written by an older operator, or by hand, may hold a key or a condition the status models
refuse. No writer may crash on it, and none may lose it: each key (each condition, each plan-history
entry) is validated on its own, the typed status holds what validates, and the rest is named, so that the
caller logs it and the serializer keeps an unreadable condition it was not asked to change.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from blackwell_operator.models.status import (
    PLAN_HISTORY_LIMIT,
    BlackwellTrainingJobStatus,
    Condition,
    PlanChange,
)

_ALIASES = {info.alias or name: name for name, info in BlackwellTrainingJobStatus.model_fields.items()}


@dataclass(frozen=True)
class StoredStatus:
    """A stored status as the models read it."""

    status: BlackwellTrainingJobStatus
    problems: tuple[str, ...] = ()  # one line per unreadable part: "status.KEY: why"
    unreadable_conditions: tuple[Mapping[str, Any], ...] = field(default=())


def _why(exc: ValidationError) -> str:
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error["loc"])
    return f"{where}: {error['msg']}" if where else str(error["msg"])


def read_status(raw: Mapping[str, Any] | None) -> StoredStatus:
    """The typed status of `raw` (a BTJ's .status); never raises on what is stored."""
    raw = raw if isinstance(raw, Mapping) else {}
    try:
        return StoredStatus(BlackwellTrainingJobStatus.model_validate(raw))
    except ValidationError:
        pass  # the usual case is above; only a status that fails is taken apart
    good: dict[str, Any] = {}
    problems: list[str] = []
    unreadable: list[Mapping[str, Any]] = []
    for key, value in raw.items():
        if key not in _ALIASES:
            problems.append(f"status.{key}: not a key this operator knows")
        elif key == "conditions" and isinstance(value, list):
            good[key] = []
            for item in value:
                try:
                    good[key].append(Condition.model_validate(item))
                except ValidationError as exc:
                    unreadable.append(item if isinstance(item, Mapping) else {"value": item})
                    problems.append(f"status.conditions[{_type_of(item)}]: {_why(exc)}")
        elif key == "planHistory" and isinstance(value, list):
            good[key] = []
            for index, item in enumerate(value):
                try:
                    good[key].append(PlanChange.model_validate(item))
                except ValidationError as exc:
                    problems.append(f"status.planHistory[{index}]: {_why(exc)}")
            if len(good[key]) > PLAN_HISTORY_LIMIT:
                problems.append(
                    f"status.planHistory: more than {PLAN_HISTORY_LIMIT} entries; the oldest are not read"
                )
                good[key] = good[key][-PLAN_HISTORY_LIMIT:]
        else:
            try:
                BlackwellTrainingJobStatus.model_validate({key: value})
                good[key] = value
            except ValidationError as exc:
                problems.append(f"status.{key}: {_why(exc)}")
    return StoredStatus(BlackwellTrainingJobStatus.model_validate(good), tuple(problems), tuple(unreadable))


@dataclass(frozen=True)
class ReadBtj:
    """A BTJ as one GET returned it, with its status parsed once: a reconcile pass's stored status, handed
    to everything in the pass that reads it (the re-plan's correction, an elastic job's node count, the
    preflight, the write) so that none parses it again."""

    body: Mapping[str, Any]
    stored: StoredStatus

    @property
    def status(self) -> BlackwellTrainingJobStatus:
        """The typed status (what validates)."""
        return self.stored.status

    @property
    def generation(self) -> int:
        """The spec generation of the BTJ read (metadata.generation, 1 when missing)."""
        return int((self.body.get("metadata") or {}).get("generation") or 1)


def read_btj(body: Mapping[str, Any]) -> ReadBtj:
    """`body` with its status parsed (read_status)."""
    return ReadBtj(body, read_status(body.get("status")))


def read_keys(raw: Mapping[str, Any] | None, *keys: str) -> StoredStatus:
    """Only these keys of `raw` (wire names, e.g. "phase", "conditions"), each read as read_status reads it
    (the problems named are those of these keys).

    For the checks that run on every watch event of every BTJ (its phase for the metrics, whether it has
    converged, whether its child is wanted back) and for the serializer, which reads the conditions: a
    stored plan is most of a status (about 15 KB), and reading it whole for a few small keys cost a quarter
    of a millisecond each time. No rule of the status models spans two keys, so a key reads alone as it
    reads among the others.
    """
    raw = raw if isinstance(raw, Mapping) else {}
    return read_status({key: raw[key] for key in keys if key in raw})


def _type_of(item: Any) -> str:
    return str(item.get("type", "?")) if isinstance(item, Mapping) else "?"


# A BTJ's status: typed, or as stored (read tolerantly).
StatusLike = BlackwellTrainingJobStatus | Mapping[str, Any]


def typed(status: StatusLike | None) -> BlackwellTrainingJobStatus:
    """`status` as the status models read it (what does not validate is left out, never raised on)."""
    if isinstance(status, BlackwellTrainingJobStatus):
        return status
    return read_status(status).status
