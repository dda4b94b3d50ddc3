"""One measured trainer configuration as a typed record (shared by the harness, importers, fit and report)."""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Sequence
from enum import StrEnum
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from blackwell_operator.models.spec import BlackwellTrainingJobSpec
from blackwell_trainer.plan.config import Architecture, Candidate, Prediction

RECORD_SCHEMA_VERSION = 1


class RecordStatus(StrEnum):
    """How a configuration ended."""

    OK = "ok"
    OOM = "oom"
    ERROR = "error"
    TIMEOUT = "timeout"
    SKIPPED = "skipped"


class Scenario(NamedTuple):
    """What a user fixes (model, sequence, GPUs); the planner chooses everything else within it."""

    model: str
    sequence_length: int
    gpus: int

    def label(self) -> str:
        """Short display name, e.g. llama3.1-8b s8192 g2."""
        return f"{self.model} s{self.sequence_length} g{self.gpus}"


class Versions(BaseModel):
    """Software the measurement ran on."""

    model_config = ConfigDict(extra="forbid")

    python: str | None = None
    torch: str | None = None
    cuda: str | None = None
    transformer_engine: str | None = None
    torchao: str | None = None
    triton: str | None = None


@lru_cache(maxsize=4096)
def _spec(
    arch_json: str, instance: str, nodes: int, gpn: int, seq: int, compiled: bool, headroom: float
) -> BlackwellTrainingJobSpec:
    return BlackwellTrainingJobSpec.model_validate(
        {
            "model": {"architecture": json.loads(arch_json)},
            "cluster": {"instanceType": instance, "nodes": nodes, "gpusPerNode": gpn},
            "training": {"sequenceLength": seq},
            "tuning": {"memoryHeadroom": headroom, "compile": compiled},
        }
    )


class CalibrationRecord(BaseModel):
    """One configuration of a trainer on real hardware: what ran, what it measured, what was predicted."""

    model_config = ConfigDict(extra="forbid")

    schema_version: Literal[1] = 1
    source: str = Field(description="Who produced it: harness, reference-grid, trainer_h200, synthetic.")
    trainer: str = Field(
        default="btj-trainer",
        description="The trainer that ran: the shipped calibration whose capabilities describe it.",
    )
    single_device_path: bool = Field(
        default=False,
        description="The trainer ran its one GPU without FSDP2 (its single-device path, from 2026-12-01); "
        "records made before it ran FSDP2 on one rank and are predicted so.",
    )
    model_name: str = Field(description="Preset name or a custom label (e.g. custom-13b).")
    architecture: Architecture
    instance_type: str = Field(description="Catalog instance type whose GPU ran it, e.g. ml.p5en.48xlarge.")
    nodes: int = Field(default=1, ge=1)
    gpus_per_node: int = Field(ge=1)
    sequence_length: int = Field(ge=1)
    candidate: Candidate = Field(description="The full configuration the trainer executed.")
    status: RecordStatus
    tokens_per_second_per_gpu: float | None = Field(default=None, ge=0)
    step_time_seconds: float | None = Field(default=None, ge=0, description="Median timed step.")
    step_times_seconds: list[float] = Field(default_factory=list)
    peak_allocated_bytes: int | None = Field(
        default=None, ge=0, description="torch.cuda.max_memory_allocated."
    )
    peak_reserved_bytes: int | None = Field(default=None, ge=0, description="torch.cuda.max_memory_reserved.")
    alloc_retries: int | None = Field(
        default=None,
        ge=0,
        description="The caching allocator's num_alloc_retries (largest rank): frees and retries when the "
        "GPU was full, i.e. the run was at capacity.",
    )
    loss: float | None = Field(default=None, description="Loss of the last step.")
    losses: list[float] = Field(default_factory=list)
    gpu_name: str = Field(default="", description="Device name as CUDA reports it (or 'cpu').")
    date: str = Field(default="", description="UTC date-time of the measurement (ISO 8601).")
    versions: Versions = Field(default_factory=Versions)
    predicted: Prediction | None = Field(default=None, description="The planner's prediction when it ran.")
    predicted_calibration: str | None = None
    command: str = Field(default="", description="Command line that produced the record.")
    detail: str = Field(default="", description="Error text, notes.")

    @property
    def gpus(self) -> int:
        """Trainer processes (GPUs) of the run."""
        return self.nodes * self.gpus_per_node

    @property
    def scenario(self) -> Scenario:
        """The (model, sequence, GPUs) this record belongs to."""
        return Scenario(self.model_name, self.sequence_length, self.gpus)

    @property
    def ran(self) -> bool:
        """It completed its timed steps."""
        return self.status is RecordStatus.OK

    @property
    def oom(self) -> bool:
        """It ran out of GPU memory."""
        return self.status is RecordStatus.OOM

    @property
    def key(self) -> str:
        """Unique name of the configuration (scenario + candidate)."""
        return config_key(
            self.model_name,
            self.sequence_length,
            self.gpus,
            self.candidate,
            single_device=self.single_device_path,
        )

    def spec(self, memory_headroom: float = 0.0) -> BlackwellTrainingJobSpec:
        """The BTJ spec this configuration answers (architecture given explicitly).

        Cached: fitting evaluates the same records thousands of times.
        """
        return _spec(
            self.architecture.model_dump_json(by_alias=True),
            self.instance_type,
            self.nodes,
            self.gpus_per_node,
            self.sequence_length,
            self.candidate.compile,
            memory_headroom,
        )


def config_key(
    model: str, sequence_length: int, gpus: int, c: Candidate, *, single_device: bool = False
) -> str:
    """A readable unique name: model, sequence, GPUs, precision/recipe, AC, sharding, CP, micro-batch, and
    `single` for the trainer's single-device path (so a run and its FSDP2 twin on one rank differ)."""
    prec = (
        c.precision.value
        if c.precision_recipe.value == "none"
        else f"{c.precision.value}-{c.precision_recipe.value}"
    )
    parts = [model, f"s{sequence_length}", f"g{gpus}", prec, f"ac-{c.activation_checkpointing.value}"]
    parts += [f"shard-{c.sharding.value}", f"mbs{c.micro_batch_size}"]
    if c.context_parallel > 1:
        parts.append(f"cp{c.context_parallel}")
    if c.gradient_accumulation_steps > 1:
        parts.append(f"ga{c.gradient_accumulation_steps}")
    if not c.compile:
        parts.append("eager")
    if single_device:
        parts.append("single")
    return "_".join(parts)


def family_key(record: CalibrationRecord) -> tuple[Any, ...]:
    """Everything but the micro-batch: one line of a throughput-vs-micro-batch plot."""
    c = record.candidate
    return (
        record.scenario,
        c.precision.value,
        c.precision_recipe.value,
        c.activation_checkpointing.value,
        c.sharding.value,
        c.context_parallel,
        c.compile,
    )


def median(values: Sequence[float]) -> float | None:
    """Median, or None for no values."""
    return statistics.median(values) if values else None


def read_records(paths: Iterable[str | Path]) -> list[CalibrationRecord]:
    """Records from JSON Lines, JSON (a record, a list or {"records": [...]}) files or folders of them."""
    out: list[CalibrationRecord] = []
    for raw in paths:
        path = Path(raw)
        files = sorted([*path.glob("*.jsonl"), *path.glob("*.json")]) if path.is_dir() else [path]
        for file in files:
            out.extend(_read_file(file))
    return out


def _read_file(file: Path) -> list[CalibrationRecord]:
    text = file.read_text()
    if file.suffix == ".jsonl":
        return [CalibrationRecord.model_validate_json(line) for line in text.splitlines() if line.strip()]
    data = json.loads(text)
    items = data.get("records", [data]) if isinstance(data, dict) else data
    return [CalibrationRecord.model_validate(item) for item in items]


def write_records(path: str | Path, records: Iterable[CalibrationRecord]) -> None:
    """Write records as JSON Lines (one configuration per line)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("".join(r.model_dump_json() + "\n" for r in records))


def append_record(path: str | Path, record: CalibrationRecord) -> None:
    """Append one record to a JSON Lines file (the harness calls this after every configuration)."""
    with open(path, "a") as f:
        f.write(record.model_dump_json() + "\n")
