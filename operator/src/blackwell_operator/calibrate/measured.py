"""Build the shipped measured coverage (calibration/measured/<trainer>.json) from records and GPU checks."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from blackwell_operator.calibrate.records import CalibrationRecord, read_records
from blackwell_operator.calibration.measured import MeasuredCombination, MeasuredCoverage, PathCheck
from blackwell_operator.catalogs import get_instance, list_gpus

# Where the repository keeps what ran on a GPU: calibration records (speed and memory of whole steps),
# and the end-to-end GPU checks (a path's numerics only).
RECORDS = "benchmarks/calibration/records"
GPU_CHECKS = "benchmarks/results"
GPU_CHECK_GLOB = "gpu_e2e_check_*.json"


def catalog_gpu(device_name: str, instance_type: str) -> str:
    """The catalog name of the GPU a record ran on: from CUDA's device name, else the instance type."""
    words = set(device_name.replace("-", " ").split())
    for gpu in list_gpus():
        if gpu.name in words:
            return gpu.name
    return get_instance(instance_type).gpu


def _combinations(records: Iterable[tuple[CalibrationRecord, str]]) -> dict[str, list[MeasuredCombination]]:
    runs: dict[tuple[Any, ...], list[str]] = defaultdict(list)
    for rec, source in records:
        if not rec.ran:
            continue  # an OOM, timeout or skip measured no step: it verifies nothing about speed
        c = rec.candidate
        key = (
            rec.trainer,
            catalog_gpu(rec.gpu_name, rec.instance_type),
            c.precision,
            c.precision_recipe,
            c.activation_checkpointing,
            c.sharding,
            rec.nodes,
            rec.gpus_per_node,
            c.context_parallel,
        )
        runs[key].append(source)
    out: dict[str, list[MeasuredCombination]] = defaultdict(list)
    for key, sources in sorted(runs.items(), key=lambda kv: [str(k) for k in kv[0]]):
        trainer, gpu, precision, recipe, ac, sharding, nodes, gpn, cp = key
        out[str(trainer)].append(
            MeasuredCombination.model_validate(
                {
                    "gpu": gpu,
                    "precision": precision,
                    "recipe": recipe,
                    "activation_checkpointing": ac,
                    "sharding": sharding,
                    "nodes": nodes,
                    "gpus_per_node": gpn,
                    "context_parallel": cp,
                    "runs": len(sources),
                    "sources": sorted(set(sources)),
                }
            )
        )
    return out


def _record_sources(root: Path) -> list[tuple[CalibrationRecord, str]]:
    """Every record under the records folder, with the folder (or top-level file) it came from."""
    base = root / RECORDS
    out: list[tuple[CalibrationRecord, str]] = []
    for entry in sorted(base.iterdir()):
        if entry.is_dir() or entry.suffix in (".jsonl", ".json"):
            source = entry.relative_to(root).as_posix()
            out.extend((rec, source) for rec in read_records([entry]))
    return out


def _path_checks(root: Path) -> list[PathCheck]:
    """Context-parallel runs of the end-to-end GPU checks that exited 0 (this trainer's CP path on a GPU)."""
    checks: list[PathCheck] = []
    for file in sorted((root / GPU_CHECKS).glob(GPU_CHECK_GLOB)):
        data = json.loads(file.read_text())
        devices = data.get("environment", {}).get("gpus", [])
        cp = data.get("context_parallel") or {}
        if not devices:
            continue
        gpu = catalog_gpu(devices[0], "")
        worst = cp.get("worst_relative_loss_difference")
        steps = cp.get("steps_compared")
        for name, run in sorted(cp.items()):
            if not (name.startswith("cp") and name[2:].isdigit() and isinstance(run, dict)):
                continue
            degree = int(name[2:])
            if degree < 2 or run.get("rc") != 0:
                continue
            result = f"ran {steps} steps"
            if worst is not None:
                result += f", loss within {worst:.1%} of the unsplit run"
            checks.append(
                PathCheck(
                    feature="context_parallel",
                    degree=degree,
                    gpu=gpu,
                    gpus=len(devices),
                    source=file.relative_to(root).as_posix(),
                    result=result,
                )
            )
    return checks


def _parameter_ranges(records: Iterable[tuple[CalibrationRecord, str]]) -> dict[str, dict[str, list[int]]]:
    """Per trainer and GPU, the smallest and largest model whose steps ran (outside them: extrapolated)."""
    sizes: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for rec, _ in records:
        if rec.ran:
            sizes[rec.trainer][catalog_gpu(rec.gpu_name, rec.instance_type)].append(
                rec.architecture.parameter_count()
            )
    return {
        trainer: {gpu: [min(counts), max(counts)] for gpu, counts in sorted(by_gpu.items())}
        for trainer, by_gpu in sizes.items()
    }


def build_coverage(root: Path) -> dict[str, MeasuredCoverage]:
    """The coverage of every trainer that has records under `root` (the repository)."""
    records = _record_sources(root)
    combos = _combinations(records)
    ranges = _parameter_ranges(records)
    checks = _path_checks(root)
    return {
        trainer: MeasuredCoverage(
            trainer=trainer,
            combinations=found,
            # The GPU checks run this project's trainer.
            path_checks=checks if trainer == "btj-trainer" else [],
            parameter_range=ranges.get(trainer, {}),
        )
        for trainer, found in sorted(combos.items())
    }
