"""Shared helpers for planner tests: specs, hardware and settings in one line."""

from __future__ import annotations

import copy
from typing import Any

from blackwell_operator.calibration import Calibration
from blackwell_operator.catalogs import get_gpu, get_instance, get_preset
from blackwell_operator.models.spec import BlackwellTrainingJobSpec
from blackwell_operator.planner.layout import Hardware, Layout, Setting
from blackwell_operator.planner.shapes import Shapes
from blackwell_trainer.plan.config import ActivationCheckpointing, Precision, PrecisionRecipe, Sharding


def make_spec(
    preset: str = "llama3.1-8b",
    instance: str = "ml.p6-b200.48xlarge",
    nodes: int = 1,
    seq: int = 4096,
    gpus_per_node: int | None = None,
    **tuning: Any,
) -> BlackwellTrainingJobSpec:
    """A spec with the given knobs (tuning keys in camelCase)."""
    cluster: dict[str, Any] = {"instanceType": instance, "nodes": nodes}
    if gpus_per_node is not None:
        cluster["gpusPerNode"] = gpus_per_node
    return BlackwellTrainingJobSpec.model_validate(
        {
            "model": {"preset": preset},
            "cluster": cluster,
            "training": {"sequenceLength": seq},
            "tuning": tuning,
        }
    )


def hardware(instance: str = "ml.p6-b200.48xlarge", nodes: int = 1, gpus_per_node: int = 8) -> Hardware:
    inst = get_instance(instance)
    return Hardware(get_gpu(inst.gpu), inst, nodes, gpus_per_node)


def shapes(preset: str = "llama3.1-8b") -> Shapes:
    return Shapes.of(get_preset(preset).architecture)


def setting(
    ac: str = "none",
    mbs: int = 1,
    sharding: str = "full",
    precision: str = "bf16",
    recipe: str = "none",
    cp: int = 1,
    compile_blocks: bool = True,
) -> Setting:
    return Setting(
        Precision(precision),
        PrecisionRecipe(recipe),
        ActivationCheckpointing(ac),
        mbs,
        Sharding(sharding),
        cp,
        compile_blocks,
    )


def layout(s: Setting, hw: Hardware) -> Layout:
    return Layout.of(s, hw)


def with_remedy(spec: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """A spec dict (camelCase, as a manifest's spec) with a refusal's remedy applied as written: each
    dotted `spec.` path set to its value, or left out where the value is None."""
    out = copy.deepcopy(spec)
    for path, value in changes.items():
        *parents, leaf = path.removeprefix("spec.").split(".")
        node = out
        for key in parents:
            node = node.setdefault(key, {})
        if value is None:
            node.pop(leaf, None)
        else:
            node[leaf] = value
    return out


def fsdp_on_one_gpu(cal: Calibration) -> Calibration:
    """The profile with one GPU planned as FSDP2 on one rank (BTJ_TRAINER_TUNING=single_device=fsdp, the
    trainer's default before 2026-12-02), for tests of what FSDP2 does on one GPU."""
    trainer = cal.trainer.model_copy(update={"single_device_path": False})
    return cal.model_copy(update={"trainer": trainer})
