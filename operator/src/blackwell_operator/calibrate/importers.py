"""Convert measurements made before the harness existed into calibration records.

- the plain-PyTorch reference grid (tests/planner/data/h200_reference_grid.yaml, from
  docs/reference/h200-measurements.md) -> trainer ``h200-reference``;
- ``benchmarks/trainer_h200.py`` output (``trainer_h200*.json``) -> trainer ``btj-trainer``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from blackwell_operator.calibrate.grid import grid_candidate
from blackwell_operator.calibrate.records import CalibrationRecord, RecordStatus, Versions
from blackwell_operator.catalogs import resolve_model
from blackwell_operator.models.spec import ModelSpec
from blackwell_operator.units import GIB
from blackwell_trainer.config import (
    ActivationCheckpointing,
    Candidate,
    Precision,
    PrecisionRecipe,
    Sharding,
)

H200_INSTANCE = "ml.p5en.48xlarge"
REFERENCE_DATE = "2026-11-29"
REFERENCE_TORCH = "2.11.0+cu130"
# trainer_h200.py's short model names and the presets they hard-code.
TRAINER_LOSS_CHUNK = 8192  # btj-trainer calibration: trainer.loss_chunk_tokens
TRAINER_H200_PRESETS = {"1b": "llama3.2-1b", "3b": "llama3.2-3b", "8b": "llama3.1-8b"}
# The reference's second table: Llama-3.1-8B on two H200s, eager BF16 (its compiled columns ran another
# trainer).
REFERENCE_TWO_GPU_EAGER: list[dict[str, Any]] = [{"mbs": 2, "ac": "none", "tokens_per_second": 9413}]


def _bytes(gib: float | None) -> int | None:
    return None if gib is None else round(float(gib) * GIB)


def from_reference_grid(path: str | Path) -> list[CalibrationRecord]:
    """Records of the reference grid YAML (one GPU, sequence 4096) plus its eager two-GPU 8B point."""
    grid: dict[str, Any] = yaml.safe_load(Path(path).read_text())
    names: dict[str, tuple[str, Any]] = {}
    for short, model in grid["models"].items():
        name, arch = resolve_model(ModelSpec.model_validate(model))
        names[short] = (name if "preset" in model else f"custom-{short}", arch)
    common: dict[str, Any] = dict(
        source="reference-grid",
        trainer="h200-reference",
        instance_type=grid.get("instance_type", H200_INSTANCE),
        sequence_length=int(grid["sequence_length"]),
        gpu_name="NVIDIA H200",
        date=REFERENCE_DATE,
        versions=Versions(torch=REFERENCE_TORCH),
        command="docs/reference/h200-measurements.md (plain PyTorch FSDP2 reference)",
    )
    out = []
    for run in grid["runs"]:
        name, arch = names[run["model"]]
        oom = bool(run.get("oom", False))
        out.append(
            CalibrationRecord(
                model_name=name,
                architecture=arch,
                gpus_per_node=int(grid.get("gpus", 1)),
                candidate=grid_candidate(int(run["mbs"]), str(run["ac"])),
                status=RecordStatus.OOM if oom else RecordStatus.OK,
                tokens_per_second_per_gpu=None if oom else float(run["tokens_per_second"]),
                step_time_seconds=None
                if oom
                else int(run["mbs"]) * int(grid["sequence_length"]) / float(run["tokens_per_second"]),
                peak_allocated_bytes=None if oom else _bytes(run["allocated_gib"]),
                peak_reserved_bytes=None if oom else _bytes(run["reserved_gib"]),
                **common,  # type: ignore[arg-type]
            )
        )
    if "8b" in names:
        name, arch = names["8b"]
        for run in REFERENCE_TWO_GPU_EAGER:
            out.append(
                CalibrationRecord(
                    model_name=name,
                    architecture=arch,
                    gpus_per_node=2,
                    candidate=grid_candidate(int(run["mbs"]), str(run["ac"]), gpus=2),
                    status=RecordStatus.OK,
                    tokens_per_second_per_gpu=float(run["tokens_per_second"]),
                    detail="memory reported only as a range (106-123 GiB) for the two-GPU table",
                    **common,
                )
            )
    return out


def from_trainer_h200(path: str | Path) -> list[CalibrationRecord]:
    """Records of a ``benchmarks/trainer_h200.py`` result file (checks, variants and skipped runs dropped)."""
    data: dict[str, Any] = json.loads(Path(path).read_text())
    meta: dict[str, Any] = data.get("meta", {})
    seq = int(meta.get("sequence_length", 4096))
    versions = Versions(
        torch=meta.get("torch"),
        cuda=meta.get("cuda"),
        transformer_engine=meta.get("transformer_engine"),
        torchao=meta.get("torchao"),
        triton=meta.get("triton"),
    )
    out = []
    for rec in data.get("records", []):
        cfg: dict[str, Any] = rec.get("config") or {}
        status = str(rec.get("status"))
        if cfg.get("kind", "train") != "train" or cfg.get("model") not in TRAINER_H200_PRESETS:
            continue
        if cfg.get("sdpa", "default") != "default" or status not in {s.value for s in RecordStatus}:
            continue
        if status == RecordStatus.SKIPPED or int(cfg.get("loss_chunk", 8192)) != TRAINER_LOSS_CHUNK:
            continue  # the planner models the trainer's one loss chunk size, not variants of it
        preset = TRAINER_H200_PRESETS[cfg["model"]]
        name, arch = resolve_model(ModelSpec(preset=preset))
        gpus = int(cfg.get("gpus", 1))
        times = [float(t) for t in rec.get("step_seconds") or []]
        losses = [float(v) for v in rec.get("losses") or []]
        ok = status == RecordStatus.OK
        out.append(
            CalibrationRecord(
                source="trainer_h200",
                trainer="btj-trainer",
                model_name=name,
                architecture=arch,
                instance_type=H200_INSTANCE,
                gpus_per_node=gpus,
                sequence_length=seq,
                candidate=Candidate(
                    precision=Precision(cfg.get("precision", "bf16")),
                    precision_recipe=PrecisionRecipe(cfg.get("recipe", "none")),
                    activation_checkpointing=ActivationCheckpointing(cfg.get("ac", "none")),
                    micro_batch_size=int(cfg["mbs"]),
                    gradient_accumulation_steps=1,
                    sharding=Sharding.FULL,
                    shard_degree=gpus,
                    replicate_degree=1,
                    compile=bool(cfg.get("compile", True)),
                    loss_chunk_tokens=int(cfg.get("loss_chunk", 8192)),
                ),
                status=RecordStatus(status),
                tokens_per_second_per_gpu=rec.get("tokens_per_s_per_gpu") if ok else None,
                step_time_seconds=sorted(times)[len(times) // 2] if ok and times else None,
                step_times_seconds=times,
                peak_allocated_bytes=_bytes(rec.get("peak_allocated_gib")) if ok else None,
                peak_reserved_bytes=_bytes(rec.get("peak_reserved_gib")) if ok else None,
                loss=losses[-1] if losses else None,
                losses=losses,
                gpu_name=str(meta.get("device", "")),
                date=str(meta.get("date_utc", "")),
                versions=versions,
                command=str(meta.get("command", "benchmarks/trainer_h200.py")),
                detail=str(rec.get("detail", ""))[:500],
            )
        )
    return out
