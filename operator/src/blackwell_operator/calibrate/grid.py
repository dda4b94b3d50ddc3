"""Compare a calibration's predictions with a measured grid of runs (memory, OOMs, throughput)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from blackwell_operator.calibration.profile import Calibration
from blackwell_operator.errors import PlanningError
from blackwell_operator.models.spec import BlackwellTrainingJobSpec
from blackwell_operator.planner import evaluate, plan_job
from blackwell_operator.units import GIB
from blackwell_trainer.plan.config import (
    ActivationCheckpointing,
    Candidate,
    Plan,
    Precision,
    PrecisionRecipe,
    Sharding,
)


@dataclass(frozen=True)
class GridRow:
    """One measured configuration next to the planner's prediction for it."""

    model: str
    mbs: int
    ac: str
    oom: bool
    measured_tps: float | None
    measured_allocated_gib: float | None
    measured_reserved_gib: float | None
    predicted_tps: float
    predicted_allocated_gib: float
    predicted_reserved_gib: float
    predicted_fits: bool
    peak_phase: str

    @property
    def reserved_error(self) -> float | None:
        """Relative error of predicted allocator-reserved memory."""
        if self.measured_reserved_gib is None:
            return None
        return self.predicted_reserved_gib / self.measured_reserved_gib - 1.0

    @property
    def tps_error(self) -> float | None:
        """Relative error of predicted tokens/s."""
        if self.measured_tps is None:
            return None
        return self.predicted_tps / self.measured_tps - 1.0


def grid_spec(
    grid: dict[str, Any], model: str, memory_headroom: float = 0.0, sequences: int | None = None
) -> BlackwellTrainingJobSpec:
    """The one-GPU spec a grid model ran as; `sequences` pins its global batch (else the planner's rule)."""
    training: dict[str, Any] = {"sequenceLength": grid["sequence_length"]}
    if sequences is not None:
        training["globalBatchTokens"] = sequences * grid["sequence_length"]
    return BlackwellTrainingJobSpec.model_validate(
        {
            "model": grid["models"][model],
            "cluster": {"instanceType": grid["instance_type"], "nodes": 1, "gpusPerNode": grid["gpus"]},
            "training": training,
            "tuning": {"memoryHeadroom": memory_headroom},
        }
    )


def grid_plan(grid: dict[str, Any], model: str, cal: Calibration) -> Plan:
    """The planner's choice for a grid model, at the largest measured micro-batch's global batch that plans:
    the grid's runs had one micro-batch a step, so their batch is the fair one to plan for."""
    sizes = sorted({r["mbs"] for r in grid["runs"] if r["model"] == model and not r.get("oom")}, reverse=True)
    for sequences in sizes[:-1]:
        try:
            return plan_job(grid_spec(grid, model, sequences=sequences), calibration=cal)
        except PlanningError:
            continue
    return plan_job(grid_spec(grid, model, sequences=sizes[-1]), calibration=cal)


def grid_candidate(mbs: int, ac: str, gpus: int = 1) -> Candidate:
    """How the reference trainer ran: BF16, eager, full fp32 logits, FSDP2 full shard over `gpus`."""
    return Candidate(
        precision=Precision.BF16,
        precision_recipe=PrecisionRecipe.NONE,
        activation_checkpointing=ActivationCheckpointing(ac),
        micro_batch_size=mbs,
        gradient_accumulation_steps=1,
        sharding=Sharding.FULL,
        shard_degree=gpus,
        replicate_degree=1,
        compile=False,
        loss_chunk_tokens=0,
    )


def compare(grid: dict[str, Any], cal: Calibration, memory_headroom: float = 0.0) -> list[GridRow]:
    """Predict every run of the grid with `cal`."""
    rows = []
    for run in grid["runs"]:
        spec = grid_spec(grid, run["model"], memory_headroom)
        ev = evaluate(spec, grid_candidate(run["mbs"], run["ac"]), calibration=cal)
        oom = bool(run.get("oom", False))
        rows.append(
            GridRow(
                model=run["model"],
                mbs=run["mbs"],
                ac=run["ac"],
                oom=oom,
                measured_tps=None if oom else float(run["tokens_per_second"]),
                measured_allocated_gib=None if oom else float(run["allocated_gib"]),
                measured_reserved_gib=None if oom else float(run["reserved_gib"]),
                predicted_tps=ev.prediction.tokens_per_second_per_gpu,
                predicted_allocated_gib=ev.memory.peak_allocated / GIB,
                predicted_reserved_gib=ev.memory.allocator_reserved / GIB,
                predicted_fits=ev.fits,
                peak_phase=ev.memory.peak_phase,
            )
        )
    return rows
