"""Pydantic models of the BlackwellTrainingJob: spec, status and the plan (the single source of truth)."""

from blackwell_operator.models.spec import (
    AUTO,
    Backend,
    BlackwellTrainingJob,
    BlackwellTrainingJobSpec,
    ClusterSpec,
    ModelSpec,
    TrainingSpec,
    TuningSpec,
)
from blackwell_operator.models.status import BlackwellTrainingJobStatus, ChildReference, Condition, Phase
from blackwell_trainer.plan.config import Architecture, Plan

__all__ = [
    "AUTO",
    "Architecture",
    "Backend",
    "BlackwellTrainingJob",
    "BlackwellTrainingJobSpec",
    "BlackwellTrainingJobStatus",
    "ChildReference",
    "ClusterSpec",
    "Condition",
    "ModelSpec",
    "Phase",
    "Plan",
    "TrainingSpec",
    "TuningSpec",
]
