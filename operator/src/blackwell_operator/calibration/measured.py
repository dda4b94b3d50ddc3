"""What a trainer ran on a GPU here: the combinations its records measured, the paths checked for numerics.

The files under `calibration/measured/` are generated from the calibration records and GPU check results
(`scripts/generate.sh`; `blackwell_operator.calibrate.measured` builds them), never edited by hand: the
planner's provenance (measured or modelled, per choice) reads them.
"""

from __future__ import annotations

from importlib import resources

from pydantic import BaseModel, ConfigDict, Field

from blackwell_operator.shared_cache import shared_cache
from blackwell_trainer.plan.config import ActivationCheckpointing, Precision, PrecisionRecipe, Sharding

MEASURED_FOLDER = "measured"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MeasuredCombination(_Strict):
    """One combination of choices that ran to completion on a GPU here, with its speed and memory recorded."""

    gpu: str = Field(description="Catalog GPU name, e.g. H200.")
    precision: Precision
    recipe: PrecisionRecipe
    activation_checkpointing: ActivationCheckpointing
    sharding: Sharding
    nodes: int = Field(ge=1)
    gpus_per_node: int = Field(ge=1)
    context_parallel: int = Field(ge=1)
    runs: int = Field(ge=1, description="Configurations (model, sequence, micro-batch) that ran.")
    sources: list[str] = Field(description="Record files or folders, relative to the repository.")


class PathCheck(_Strict):
    """A trainer path that ran on a GPU here for its numerics only (no speed or memory record)."""

    feature: str = Field(description="What ran, e.g. context_parallel.")
    degree: int = Field(ge=1, description="Its degree (CP ranks), 1 where none applies.")
    gpu: str = Field(description="Catalog GPU name.")
    gpus: int = Field(ge=1, description="GPUs the check used.")
    source: str = Field(description="Result file, relative to the repository.")
    result: str = Field(description="What it showed, in a few words.")


class MeasuredCoverage(_Strict):
    """Everything one trainer ran on a GPU here."""

    trainer: str
    combinations: list[MeasuredCombination] = Field(default_factory=list)
    path_checks: list[PathCheck] = Field(default_factory=list)
    parameter_range: dict[str, list[int]] = Field(
        default_factory=dict,
        description="Per GPU, the smallest and the largest model (parameters) whose steps ran on it here.",
    )

    def to_json(self) -> str:
        """The generated file's text."""
        return self.model_dump_json(indent=2) + "\n"


@shared_cache
def load_measured(calibration: str) -> MeasuredCoverage:
    """The shipped coverage of the trainer a calibration describes (empty when nothing of it ran here).

    A calibration named after a trainer (btj-trainer, h200-reference) has that trainer's coverage; one
    derived from it and named `<trainer>-<suffix>` (btj-trainer-h200, h200-reference-fit: a fit's output, a
    user's copy) describes the same trainer, so it has the same coverage; so does `<trainer>@<GPU>`, the
    view a job on that GPU plans with (Calibration.for_gpu, where the profile has a gpus.<GPU> block).
    """
    folder = resources.files("blackwell_operator.calibration").joinpath(MEASURED_FOLDER)
    shipped = sorted(
        (f.name.removesuffix(".json") for f in folder.iterdir() if f.name.endswith(".json")),
        key=len,
        reverse=True,
    )
    for trainer in shipped:
        if calibration == trainer or calibration.startswith((f"{trainer}-", f"{trainer}@")):
            return MeasuredCoverage.model_validate_json(folder.joinpath(f"{trainer}.json").read_text())
    return MeasuredCoverage(trainer=calibration)
