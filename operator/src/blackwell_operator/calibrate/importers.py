"""Convert measurements made before the harness existed into calibration records.

- the plain-PyTorch reference grid (tests/planner/data/h200_reference_grid.yaml, from
  docs/reference/h200-measurements.md) -> trainer ``h200-reference``;
- ``benchmarks/trainer_h200.py`` output (``trainer_h200*.json``) -> trainer ``btj-trainer``, on the path its
  meta's ``trainer_tuning`` names (FSDP2 on one rank where the meta predates that key);
- ``benchmarks/trainer_ab_h200.py`` output (``trainer_ab_h200.json``): the single-device path and its FSDP2
  twins on one rank, each record saying which it ran;
- ``benchmarks/titan_h200.py`` output (``titan_h200*.json``): this trainer's side of each row.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from blackwell_operator.calibrate.grid import grid_candidate
from blackwell_operator.calibrate.records import CalibrationRecord, RecordStatus, Versions
from blackwell_operator.catalogs import list_gpus, list_instances, resolve_model
from blackwell_operator.models.spec import ModelSpec
from blackwell_operator.units import GIB
from blackwell_trainer.plan.config import (
    ActivationCheckpointing,
    Architecture,
    Candidate,
    Precision,
    PrecisionRecipe,
    Sharding,
)
from blackwell_trainer.plan.tuning import Tuning, TuningError

H200_INSTANCE = "ml.p5en.48xlarge"
REFERENCE_DATE = "2026-11-29"
REFERENCE_TORCH = "2.11.0+cu130"
# trainer_h200.py's short model names and the presets they hard-code.
# The loss chunk the benchmark records ran (benchmarks/trainer_h200.py's Config.loss_chunk): the btj-trainer
# profile's trainer.loss_chunk_tokens until 2026-12-07 (4,096 since; records keep theirs, predict.as_ran).
TRAINER_LOSS_CHUNK = 8192
# The chunks a profile of this trainer has planned (8,192 until 2026-12-07, 4,096 since; the side by side
# runs the profile's since then): records at either are the trainer's own configuration, predicted with the
# chunk they ran (predict.as_ran). Other chunks (0: full fp32 logits) were variants measured beside them.
PLANNED_LOSS_CHUNKS = frozenset({8192, 4096})
TRAINER_H200_PRESETS = {"1b": "llama3.2-1b", "3b": "llama3.2-3b", "8b": "llama3.1-8b"}
# The untied shapes trainer_ab_h200.py and titan_h200.py run (torchtitan's llama3 ties nothing): the preset
# with its own output projection (benchmarks/trainer_h200.py SHAPES; tests hold the counts equal).
UNTIED_PRESETS = {"1b-untied": "llama3.2-1b", "3b-untied": "llama3.2-3b"}
# trainer_ab_h200.py's tunings of the two paths as the trainer runs them by default; its variants (fused
# projections, recast blocks, another loss chunk or compile mode) are switches the planner does not model.
AB_PATHS = {"single_device=auto": True, "single_device=fsdp": False}
# The reference's second table: Llama-3.1-8B on two H200s, eager BF16 (its compiled columns ran another
# trainer).
REFERENCE_TWO_GPU_EAGER: list[dict[str, Any]] = [{"mbs": 2, "ac": "none", "tokens_per_second": 9413}]
# Recipes the trainer runs without Transformer Engine (bf16 and torchao); any other runs TE where it is
# installed, and TE keeps FSDP2 even on one rank (blackwell_trainer.plan.tuning.Tuning.use_single_device).
NON_TE_RECIPES = {PrecisionRecipe.NONE, PrecisionRecipe.TORCHAO_TENSORWISE, PrecisionRecipe.TORCHAO_ROWWISE}
# What trainer_h200.py wrote as trainer_tuning when BTJ_TRAINER_TUNING was unset: the defaults of whichever
# trainer ran, which say nothing of the path (the default changed on 2026-12-02).
UNNAMED_TUNING = "the trainer's defaults"


class UnknownDeviceError(ValueError):
    """A result file measured on a GPU the catalogs do not know."""


def instance_of(meta: dict[str, Any], path: str | Path) -> str:
    """The instance type of the GPU a result file ran on, from its ``meta.device`` (nvidia-smi's name first).

    H200_INSTANCE where the file names no device (the result files from before it was recorded all ran on
    one H200) or names an H200; otherwise the catalog's first instance of the named GPU (an H100:
    ml.p5.48xlarge, as the calibration harness records it). A device the catalog does not know is refused:
    a record planned on another GPU's figures would move that GPU's fit without a word.
    """
    device = str(meta.get("device", "")).split(",")[0].strip()
    if not device:
        return H200_INSTANCE
    for gpu in list_gpus():
        if re.search(rf"\b{re.escape(gpu.name)}\b", device):
            if gpu.name == "H200":
                return H200_INSTANCE
            return next(i.instance_type for i in list_instances() if i.gpu == gpu.name)
    known = ", ".join(g.name for g in list_gpus())
    raise UnknownDeviceError(
        f"{path}: meta.device {device!r} names none of the catalog's GPUs ({known}), so its records would "
        "have no GPU to be predicted on. Fix: import results measured on one of them, or add the GPU and an "
        "instance to the catalogs (operator/src/blackwell_operator/catalogs/data)"
    )


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
                **common,
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


def trainer_h200_single_device(meta: dict[str, Any], gpus: int, recipe: PrecisionRecipe) -> bool:
    """Whether a ``trainer_h200.py`` run took the single-device path, from its file's ``meta.trainer_tuning``
    (ran_single_device)."""
    te = recipe not in NON_TE_RECIPES and bool(meta.get("transformer_engine"))
    return ran_single_device(meta, "trainer_tuning", gpus=gpus, te=te)


def ran_single_device(meta: dict[str, Any], key: str, *, gpus: int, te: bool) -> bool:
    """Whether a run of this trainer took the single-device path, from the switches its result file's
    ``meta[key]`` records (BTJ_TRAINER_TUNING as the benchmark scripts write it).

    No such key: the file predates it (before 2026-12-02), when FSDP2 was the trainer's only path. A
    ``key=value`` string: the switches the run exported, resolved as the trainer resolves them (one rank, no
    context parallelism, not Transformer Engine). "the trainer's defaults" names no path: refused.
    """
    if key not in meta:
        return False
    text = str(meta[key]).strip()
    if text == UNNAMED_TUNING:
        raise ValueError(
            f"meta.{key} is '{UNNAMED_TUNING}': the file does not say whether one GPU ran the "
            "single-device path or FSDP2 (rerun with BTJ_TRAINER_TUNING=single_device=auto or =fsdp)"
        )
    try:
        tuning = Tuning.parse(text)
    except TuningError as err:
        raise ValueError(f"meta.{key}: {err}") from err
    return tuning.use_single_device(world_size=gpus, context_parallel=1, backend="te" if te else "")


def from_trainer_h200(path: str | Path) -> list[CalibrationRecord]:
    """Records of a ``benchmarks/trainer_h200.py`` result file (checks, variants and skipped runs dropped).

    Document-masked runs (``config.docmask``, packed chat) are left out: a record has no field for the
    mask, and the planner models causal attention over the whole sequence.
    """
    data: dict[str, Any] = json.loads(Path(path).read_text())
    meta: dict[str, Any] = data.get("meta", {})
    instance = instance_of(meta, path)
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
        if status not in {s.value for s in RecordStatus} or status == RecordStatus.SKIPPED:
            continue
        if not _as_plans_run(cfg) or not _timed_as_run(rec):
            continue
        preset = TRAINER_H200_PRESETS[cfg["model"]]
        name, arch = resolve_model(ModelSpec(preset=preset))
        gpus = int(cfg.get("gpus", 1))
        recipe = PrecisionRecipe(cfg.get("recipe", "none"))
        times = [float(t) for t in rec.get("step_seconds") or []]
        losses = [float(v) for v in rec.get("losses") or []]
        ok = status == RecordStatus.OK
        out.append(
            CalibrationRecord(
                source="trainer_h200",
                trainer="btj-trainer",
                single_device_path=trainer_h200_single_device(meta, gpus, recipe),
                model_name=name,
                architecture=arch,
                instance_type=instance,
                gpus_per_node=gpus,
                sequence_length=seq,
                candidate=Candidate(
                    precision=Precision(cfg.get("precision", "bf16")),
                    precision_recipe=recipe,
                    activation_checkpointing=ActivationCheckpointing(cfg.get("ac", "none")),
                    micro_batch_size=int(cfg["mbs"]),
                    gradient_accumulation_steps=1,
                    sharding=Sharding.FULL,
                    shard_degree=gpus,
                    replicate_degree=1,
                    compile=bool(cfg.get("compile", True)),
                    loss_chunk_tokens=int(cfg.get("loss_chunk", TRAINER_LOSS_CHUNK)),
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


def _untied(short: str) -> tuple[str, Architecture]:
    preset = UNTIED_PRESETS[short]
    _, arch = resolve_model(ModelSpec(preset=preset))
    return f"{preset}-untied", arch.model_copy(update={"tie_word_embeddings": False})


def _one_gpu_record(
    *,
    source: str,
    cfg: dict[str, Any],
    run: dict[str, Any],
    tokens_per_second: float | None,
    single_device: bool,
    meta: dict[str, Any],
    versions: Versions,
    instance_type: str,
) -> CalibrationRecord:
    """One run of this trainer on one GPU of ``instance_type``, one micro-batch a step."""
    name, arch = _untied(str(cfg["model"]))
    times = [float(t) for t in run.get("step_seconds") or []]
    losses = [float(v) for v in run.get("losses") or []]
    retries = run.get("alloc_retries")
    return CalibrationRecord(
        source=source,
        trainer="btj-trainer",
        single_device_path=single_device,
        model_name=name,
        architecture=arch,
        instance_type=instance_type,
        gpus_per_node=1,
        sequence_length=int(meta.get("sequence_length", 4096)),
        candidate=Candidate(
            precision=Precision(cfg.get("precision", "bf16")),
            precision_recipe=PrecisionRecipe(cfg.get("recipe", "none")),
            activation_checkpointing=ActivationCheckpointing(cfg.get("ac", "none")),
            micro_batch_size=int(cfg["mbs"]),
            gradient_accumulation_steps=1,
            sharding=Sharding.FULL,
            shard_degree=1,
            replicate_degree=1,
            compile=bool(cfg.get("compile", True)),
            loss_chunk_tokens=int(cfg.get("loss_chunk", TRAINER_LOSS_CHUNK)),
        ),
        status=RecordStatus.OK,
        tokens_per_second_per_gpu=tokens_per_second,
        step_time_seconds=sorted(times)[len(times) // 2] if times else None,
        step_times_seconds=times,
        peak_allocated_bytes=_bytes(run.get("peak_allocated_gib")),
        peak_reserved_bytes=_bytes(run.get("peak_reserved_gib")),
        alloc_retries=None if retries is None else int(retries),
        loss=losses[-1] if losses else None,
        losses=losses,
        gpu_name=str(meta.get("device", "")).split(",")[0],
        date=str(meta.get("date_utc", "")),
        versions=versions,
        command=str(meta.get("command", "")),
        detail=str(run.get("detail", ""))[:500],
    )


def _as_plans_run(cfg: dict[str, Any]) -> bool:
    """A benchmark configuration of the trainer the planner models: torch's attention order, a loss chunk
    plans run (not a variant measured beside them), causal attention over whole rows (a document mask is
    attention the records cannot describe), and no switches of its own (``Config.tuning``, a side by side's
    ``ours-...+key=value``)."""
    return (
        cfg.get("sdpa", "default") == "default"
        and int(cfg.get("loss_chunk", TRAINER_LOSS_CHUNK)) in PLANNED_LOSS_CHUNKS
        and not cfg.get("docmask", 0)
        and not cfg.get("tuning")
    )


def _timed_as_run(rec: dict[str, Any]) -> bool:
    """Not a run whose allocator history was recorded as it ran (``memory_history``, set by
    benchmarks/trainer_h200.py since 2026-12-07): each allocation paid for its stack trace."""
    return not rec.get("memory_history", False)


def _usable_one_gpu_run(cfg: dict[str, Any], status: str) -> bool:
    """A completed training run of an untied shape on one GPU, as plans run it."""
    return (
        status == RecordStatus.OK
        and cfg.get("kind", "train") == "train"
        and cfg.get("model") in UNTIED_PRESETS
        and int(cfg.get("gpus", 1)) == 1
        and not cfg.get("profile", False)  # the profiler's own overhead is in its step times
        and _as_plans_run(cfg)
    )


def from_trainer_ab_h200(path: str | Path) -> list[CalibrationRecord]:
    """Records of a ``benchmarks/trainer_ab_h200.py`` result: each path's run with the default switches."""
    data: dict[str, Any] = json.loads(Path(path).read_text())
    meta: dict[str, Any] = data.get("meta", {})
    instance = instance_of(meta, path)  # refused here, whatever the rows
    versions = Versions(
        torch=meta.get("torch"), cuda=meta.get("cuda"), torchao=meta.get("torchao"), triton=meta.get("triton")
    )
    out = []
    for rec in data.get("records", []):
        cfg: dict[str, Any] = rec.get("config") or {}
        tuning = str(rec.get("tuning", ""))
        if tuning not in AB_PATHS or not _usable_one_gpu_run(cfg, str(rec.get("status"))):
            continue
        if not _timed_as_run(rec):
            continue
        if str(rec.get("name", "")).endswith("-profiled"):
            continue  # it records the allocator history as it runs: not a speed figure (the script says so)
        # The record says which path the process took (a TE backend or CP would have kept FSDP2).
        single = bool(rec.get("single_device", AB_PATHS[tuning]))
        out.append(
            _one_gpu_record(
                source="trainer_ab_h200",
                cfg=cfg,
                run=rec,
                tokens_per_second=rec.get("tokens_per_s"),
                single_device=single,
                meta=meta,
                versions=versions,
                instance_type=instance,
            )
        )
    return out


def from_titan_h200(path: str | Path) -> list[CalibrationRecord]:
    """Records of this trainer's side of a ``benchmarks/titan_h200.py`` result (torchtitan's is left out).

    Which path this trainer ran: the run's own ``single_device`` where it carries one, else the switches
    the file's ``meta.ours_tuning`` records (ran_single_device; the two 2026-12-02 files were annotated by
    hand, ``meta.ours_tuning_note`` says so); neither is FSDP2 on one rank, the default before 2026-12-02.
    """
    data: dict[str, Any] = json.loads(Path(path).read_text())
    meta: dict[str, Any] = data.get("meta", {})
    instance = instance_of(meta, path)  # refused here, whatever the rows
    found: dict[str, Any] = meta.get("versions") or {}
    versions = Versions(
        python=meta.get("python"),
        torch=found.get("torch"),
        torchao=found.get("torchao"),
        triton=found.get("triton"),
    )
    # One GPU, torchao or BF16: the Transformer Engine never runs here.
    tuned = ran_single_device(meta, "ours_tuning", gpus=1, te=False)
    out = []
    for row in data.get("rows", []):
        ours: dict[str, Any] = row.get("ours") or {}
        cfg: dict[str, Any] = ours.get("config") or {}
        if not _usable_one_gpu_run(cfg, str(ours.get("status"))) or not _timed_as_run(ours):
            continue
        out.append(
            _one_gpu_record(
                source="titan_h200",
                cfg=cfg,
                run=ours,
                tokens_per_second=ours.get("tokens_per_s_per_gpu"),
                single_device=bool(ours.get("single_device", tuned)),
                meta=meta,
                versions=versions,
                instance_type=instance,
            )
        )
    return out


def from_result_file(path: str | Path) -> list[CalibrationRecord]:
    """Records of any of the trainer's result files above, told apart by their shape."""
    data: Any = json.loads(Path(path).read_text())
    if isinstance(data, dict) and "rows" in data:
        return from_titan_h200(path)
    records = data.get("records", []) if isinstance(data, dict) else []
    if any(isinstance(r, dict) and "tuning" in r for r in records):
        return from_trainer_ab_h200(path)
    return from_trainer_h200(path)
