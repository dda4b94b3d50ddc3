"""The inputs of one planning problem: hardware from the catalogs and the search problem from a spec."""

from __future__ import annotations

from blackwell_operator.calibration import Calibration
from blackwell_operator.catalogs import get_gpu, get_instance, resolve_model
from blackwell_operator.errors import PlanningError
from blackwell_operator.models.spec import BlackwellTrainingJobSpec
from blackwell_operator.planner.figures import memory_budget
from blackwell_operator.planner.global_batch import ChosenBatch, choose_global_batch
from blackwell_operator.planner.layout import Hardware
from blackwell_operator.planner.search import Problem
from blackwell_operator.planner.shapes import Shapes
from blackwell_trainer.plan.config import DatasetKind


def hardware_for(spec: BlackwellTrainingJobSpec, nodes: int | None = None) -> Hardware:
    """The nodes a spec asks for (or `nodes` of them), with their GPU."""
    instance = get_instance(spec.cluster.instance_type)
    gpu = get_gpu(instance.gpu)
    gpn = spec.cluster.gpus_per_node or instance.gpus_per_node
    if gpn > instance.gpus_per_node:
        raise PlanningError(
            "spec.cluster.gpusPerNode",
            f"{gpn} GPUs per node, but {instance.instance_type} has {instance.gpus_per_node}",
            f"use at most {instance.gpus_per_node} or leave it unset",
        )
    return Hardware(gpu, instance, nodes or spec.cluster.nodes, gpn)


def problem_for(
    spec: BlackwellTrainingJobSpec, cal: Calibration, hw: Hardware, kept: int | None = None
) -> Problem:
    """The search problem of a spec on some hardware: shapes, sequence, global batch, memory budget.

    The global batch is the spec's (spec.training.globalBatchTokens), else `kept` (the one stored with the
    job, status.globalBatch: lifecycle/global_batch.py), else the rule's; every one is reached exactly.
    """
    _, arch = resolve_model(spec.model)
    chat = spec.training.dataset.kind == DatasetKind.CHAT
    if chat and spec.tuning.context_parallel not in ("auto", 1):
        # The document mask of packed rows is built per row; context parallelism splits a row's sequence.
        raise PlanningError(
            "spec.tuning.contextParallel",
            f"{spec.tuning.context_parallel} splits each packed chat row across GPUs, which the document "
            "mask of dataset.kind chat does not support",
            "use 1 or auto for chat data",
        )
    budget = memory_budget(hw.gpu.memory_bytes, spec.tuning.memory_headroom)
    shapes = Shapes.of(arch)
    tokens = spec.training.global_batch_tokens
    kept_batch = tokens is None and kept is not None
    if tokens is None:
        tokens = kept if kept is not None else chosen_global_batch(spec, shapes, hw).tokens
    return Problem(
        shapes,
        hw,
        cal,
        spec.training.sequence_length,
        tokens,
        budget,
        document_mask=chat,
        kept_batch=kept_batch,
    )


def chosen_global_batch(spec: BlackwellTrainingJobSpec, shapes: Shapes, hw: Hardware) -> ChosenBatch:
    """The rule's global batch for a spec without spec.training.globalBatchTokens (global_batch.py)."""
    return choose_global_batch(shapes.total_params, spec.training.sequence_length, hw.world)
