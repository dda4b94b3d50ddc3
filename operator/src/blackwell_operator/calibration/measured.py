"""What a trainer ran on a GPU here: the combinations its records measured, the paths checked for numerics.

The files under `calibration/measured/` are generated from the calibration records and GPU check results
(`scripts/generate.sh`; `blackwell_operator.calibrate.measured` builds them), never edited by hand: the
planner's provenance (measured or modelled, per choice) reads them.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from pydantic import BaseModel, ConfigDict, Field

from blackwell_trainer.config import ActivationCheckpointing, Precision, PrecisionRecipe, Sharding

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

    def to_json(self) -> str:
        """The generated file's text."""
        return self.model_dump_json(indent=2) + "\n"


@cache
def load_measured(trainer: str) -> MeasuredCoverage:
    """The shipped coverage of a trainer (empty when nothing of it ran here: every choice is modelled)."""
    folder = resources.files("blackwell_operator.calibration").joinpath(MEASURED_FOLDER)
    path = folder.joinpath(f"{trainer}.json")
    if not path.is_file():
        return MeasuredCoverage(trainer=trainer)
    return MeasuredCoverage.model_validate_json(path.read_text())
