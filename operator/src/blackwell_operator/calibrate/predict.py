"""The planner's prediction for each measured record, side by side with the measurement."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import yaml

from blackwell_operator.calibrate.records import CalibrationRecord
from blackwell_operator.calibration import Calibration, list_calibrations, load_calibration
from blackwell_operator.catalogs import get_gpu, get_instance
from blackwell_operator.models.spec import BlackwellTrainingJobSpec
from blackwell_operator.planner import Evaluation, evaluate

# A run whose reserved pool reached this share of the room the allocator has ran at the GPU's capacity.
AT_CAPACITY = 0.985


def load_any_calibration(name_or_path: str | Path) -> Calibration:
    """A shipped calibration by name, or a calibration YAML file (e.g. one `btj calibrate fit` wrote)."""
    text = str(name_or_path)
    if text in list_calibrations():
        return load_calibration(text)
    path = Path(text)
    if not path.is_file():
        known = ", ".join(list_calibrations())
        raise ValueError(f"calibration {text!r}: no such file and not a shipped name ({known})")
    return Calibration.model_validate(yaml.safe_load(path.read_text()))


def record_spec(record: CalibrationRecord) -> BlackwellTrainingJobSpec:
    """The record's spec with no headroom: its predictions are compared with what fits the whole GPU."""
    return record.spec(memory_headroom=0.0)


def gpu_memory_bytes(record: CalibrationRecord) -> int:
    """Memory of the record's GPU per the catalog."""
    return get_gpu(get_instance(record.instance_type).gpu).memory_bytes


@dataclass(frozen=True)
class Comparison:
    """One record and the planner's prediction for it under one calibration."""

    record: CalibrationRecord
    evaluation: Evaluation
    capacity_bytes: int

    @property
    def predicted_tps(self) -> float:
        """Predicted tokens/s per GPU."""
        return self.evaluation.prediction.tokens_per_second_per_gpu

    @property
    def predicted_allocated(self) -> int:
        """Predicted peak allocated bytes (comparable to torch.cuda.max_memory_allocated)."""
        return self.evaluation.memory.peak_allocated

    @property
    def pool_capacity(self) -> int:
        """The most the caching allocator can hold: the GPU's memory less CUDA context and NCCL buffers."""
        return self.capacity_bytes - self.evaluation.memory.outside_allocator

    @property
    def reserved_demand(self) -> int:
        """The pool the run would reserve on a GPU large enough (the planner's allocator_reserved)."""
        return self.evaluation.memory.allocator_reserved

    @property
    def saturated(self) -> bool:
        """Predicted to fill the GPU: the pool it would reserve is larger than the pool there is room for."""
        return self.reserved_demand > self.pool_capacity

    @property
    def measured_at_capacity(self) -> bool:
        """The run filled the GPU: its step time includes the allocator's frees and retries at the cap.

        Records that counted the allocator's retries say so directly; older ones are judged by their pool.
        """
        if self.record.alloc_retries is not None:
            return self.record.ran and self.record.alloc_retries > 0
        m = self.record.peak_reserved_bytes
        return bool(self.record.ran and m and m >= AT_CAPACITY * self.pool_capacity)

    @property
    def predicted_reserved(self) -> int:
        """Predicted allocator pool (comparable to torch.cuda.max_memory_reserved).

        At the GPU's capacity PyTorch's caching allocator frees its cached blocks and retries instead of
        growing, and fails only when the live tensors themselves do not fit; a run whose demand exceeds the
        pool therefore measures the pool (H200: 136.7-138.5 GiB). The planner never plans such a run: its
        demand, not this, is what must fit within the headroom.
        """
        return min(self.reserved_demand, self.pool_capacity)

    @property
    def predicted_fits(self) -> bool:
        """Predicted peak (pool + CUDA context + NCCL) fits the whole GPU (no headroom)."""
        return self.evaluation.memory.peak_reserved <= self.capacity_bytes

    def fits_within(self, headroom: float) -> bool:
        """Predicted peak fits the GPU with a share of its memory kept free, as the planner requires."""
        return self.evaluation.memory.peak_reserved <= (1.0 - headroom) * self.capacity_bytes

    @property
    def tps_error(self) -> float | None:
        """Predicted / measured tokens/s - 1."""
        m = self.record.tokens_per_second_per_gpu
        return None if not self.record.ran or not m else self.predicted_tps / m - 1.0

    @property
    def reserved_error(self) -> float | None:
        """Predicted / measured reserved memory - 1."""
        m = self.record.peak_reserved_bytes
        return None if not self.record.ran or not m else self.predicted_reserved / m - 1.0


def as_ran(record: CalibrationRecord, cal: Calibration) -> Calibration:
    """The calibration as the trainer was when it made the record, whatever the profile plans with: a record
    of FSDP2 on one rank (every record before 2026-12-02, and `single_device=fsdp` since) is predicted with
    the single-device path off, a record of the path with it on; and with the loss chunk the record's plan
    ran (every record before 2026-12-07 ran 8,192 tokens, the profile's chunk then)."""
    update: dict[str, object] = {}
    if record.single_device_path != cal.trainer.single_device_path:
        update["single_device_path"] = record.single_device_path
    if record.candidate.loss_chunk_tokens != cal.trainer.loss_chunk_tokens:
        update["loss_chunk_tokens"] = record.candidate.loss_chunk_tokens
    if not update:
        return cal
    return cal.model_copy(update={"trainer": cal.trainer.model_copy(update=update)})


def compare(record: CalibrationRecord, cal: Calibration) -> Comparison:
    """Predict one record with a calibration (as its trainer ran: `as_ran`)."""
    ev = evaluate(record_spec(record), record.candidate, calibration=as_ran(record, cal))
    return Comparison(record, ev, gpu_memory_bytes(record))


def compare_all(records: Iterable[CalibrationRecord], cal: Calibration) -> list[Comparison]:
    """Predict every record (OOM and ran alike; errors and timeouts are left out)."""
    return [compare(r, cal) for r in records if r.ran or r.oom]
