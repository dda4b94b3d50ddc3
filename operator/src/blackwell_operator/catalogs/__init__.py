"""Catalogs as data: GPUs, SageMaker instance types and model presets, with typed loaders."""

from __future__ import annotations

from importlib import resources
from typing import Any

import yaml

from blackwell_operator.catalogs.models import GpuSpec, InstanceSpec, ModelPreset
from blackwell_operator.errors import SpecError
from blackwell_operator.models.spec import ModelSpec
from blackwell_operator.shared_cache import shared_cache
from blackwell_trainer.plan.config import Architecture

__all__ = [
    "GpuSpec",
    "InstanceSpec",
    "ModelPreset",
    "get_gpu",
    "get_instance",
    "get_preset",
    "list_gpus",
    "list_instances",
    "list_presets",
    "resolve_model",
]


def _load(name: str) -> Any:
    return yaml.safe_load(resources.files("blackwell_operator.catalogs").joinpath("data", name).read_text())


@shared_cache
def _gpus() -> dict[str, GpuSpec]:
    return {g["name"]: GpuSpec.model_validate(g) for g in _load("gpus.yaml")["gpus"]}


@shared_cache
def _instances() -> dict[str, InstanceSpec]:
    return {i["instanceType"]: InstanceSpec.model_validate(i) for i in _load("instances.yaml")["instances"]}


@shared_cache
def _presets() -> dict[str, ModelPreset]:
    return {p["name"]: ModelPreset.model_validate(p) for p in _load("models.yaml")["presets"]}


def list_gpus() -> list[GpuSpec]:
    """Every GPU in the catalog."""
    return list(_gpus().values())


def list_instances() -> list[InstanceSpec]:
    """Every instance type in the catalog."""
    return list(_instances().values())


def list_presets() -> list[ModelPreset]:
    """Every model preset, in catalog order."""
    return list(_presets().values())


def get_gpu(name: str) -> GpuSpec:
    """A GPU by catalog name or alias (case-insensitive)."""
    for gpu in _gpus().values():
        if name.lower() in {gpu.name.lower(), *(a.lower() for a in gpu.aliases)}:
            return gpu
    known = ", ".join(_gpus())
    raise SpecError("gpu", f"unknown GPU {name!r}", f"use one of {known}")


def get_instance(instance_type: str) -> InstanceSpec:
    """An instance type by its SageMaker name (enum values are accepted too)."""
    key = str(getattr(instance_type, "value", instance_type))
    try:
        return _instances()[key]
    except KeyError:
        known = ", ".join(_instances())
        raise SpecError(
            "spec.cluster.instanceType", f"unknown instance type {key!r}", f"use one of {known}"
        ) from None


def get_preset(name: str) -> ModelPreset:
    """A model preset by name (case-insensitive)."""
    preset = _presets().get(name.lower())
    if preset is None:
        known = ", ".join(_presets())
        raise SpecError("spec.model.preset", f"unknown preset {name!r}", f"use one of {known}")
    return preset


def resolve_model(model_spec: ModelSpec) -> tuple[str, Architecture]:
    """The model's name ('custom' for an explicit architecture) and its architecture."""
    if model_spec.preset is not None:
        preset = get_preset(model_spec.preset)
        return preset.name, preset.architecture
    if model_spec.architecture is None:  # the spec validator forbids this; keep mypy and callers honest
        raise SpecError("spec.model", "neither preset nor architecture is set", "set model.preset")
    return "custom", model_spec.architecture
