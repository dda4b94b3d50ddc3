"""`--backend` of `btj plan` and `btj render`: the job kind, chosen offline as the operator would."""

from __future__ import annotations

from typing import Annotated

import typer
from pydantic import ValidationError

from blackwell_operator.cli.manifest import fail, format_validation_error
from blackwell_operator.lifecycle.backends import CONCRETE, auto_order, choose_backend, with_backend
from blackwell_operator.models.spec import Backend, BlackwellTrainingJobSpec

BackendOption = Annotated[
    Backend | None,
    typer.Option(
        "--backend",
        help="PyTorchJob, HyperPodPyTorchJob, TrainJob or auto (default: the manifest's spec.backend). "
        "Offline, auto takes the first of its order as if the cluster served every job API.",
    ),
]


def resolve_offline(
    spec: BlackwellTrainingJobSpec, override: Backend | None
) -> tuple[BlackwellTrainingJobSpec, str]:
    """The spec with a concrete backend, and one line saying which and why."""
    if override is not None:
        # Validated again: a backend may refuse the rest of the spec (TrainJob refuses autoResume).
        wire = {**spec.model_dump(by_alias=True, exclude_none=True), "backend": override.value}
        try:
            spec = BlackwellTrainingJobSpec.model_validate(wire)
        except ValidationError as exc:
            fail(f"--backend {override.value}: {format_validation_error(exc, prefix='spec.')}")
    if spec.backend != Backend.AUTO:
        return spec, f"  backend: {spec.backend.value}"
    chosen = choose_backend(spec, CONCRETE) or auto_order(spec)[0]  # every kind counts as served offline
    order = ", ".join(backend.value for backend in auto_order(spec))
    note = (
        f"  backend: auto -> {chosen.value} offline (the operator takes the first of {order} that the "
        "cluster serves; pass --backend to choose)"
    )
    return with_backend(spec, chosen), note
