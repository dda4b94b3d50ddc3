"""Calibration records: JSON Lines and JSON round-trips, keys, scenarios and specs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from blackwell_operator.calibrate.records import (
    CalibrationRecord,
    RecordStatus,
    Scenario,
    append_record,
    read_records,
    write_records,
)
from tests.support.calibration_records import candidate, record


def test_jsonl_round_trip_keeps_every_field(tmp_path: Path) -> None:
    recs = [
        record(
            "llama3.2-1b",
            4096,
            candidate(4, "none"),
            tokens_per_second_per_gpu=55000.0,
            loss=9.1,
            peak_allocated_bytes=10,
            peak_reserved_bytes=12,
            step_times_seconds=[0.3, 0.31],
        ),
        record(
            "llama3.1-8b",
            8192,
            candidate(2, "full", "fp8", "torchao-tensorwise", gpus=2),
            gpus=2,
            status=RecordStatus.OOM,
        ),
    ]
    path = tmp_path / "r.jsonl"
    write_records(path, recs)
    assert len(path.read_text().splitlines()) == 2
    assert read_records([path]) == recs
    append_record(path, recs[0])
    assert read_records([tmp_path]) == [*recs, recs[0]]


def test_json_list_and_wrapped_forms(tmp_path: Path) -> None:
    rec = record("llama3.2-3b", 2048, candidate(1, "selective"))
    (tmp_path / "a.json").write_text(json.dumps([rec.model_dump(mode="json")]))
    (tmp_path / "b.json").write_text(json.dumps({"records": [rec.model_dump(mode="json")]}))
    assert read_records([tmp_path / "a.json", tmp_path / "b.json"]) == [rec, rec]


def test_key_scenario_and_spec() -> None:
    rec = record("llama3.1-8b", 8192, candidate(4, "full", "fp8", "torchao-tensorwise", gpus=2), gpus=2)
    assert rec.key == "llama3.1-8b_s8192_g2_fp8-torchao-tensorwise_ac-full_shard-full_mbs4"
    assert rec.scenario == Scenario("llama3.1-8b", 8192, 2)
    spec = rec.spec()
    assert spec.cluster.gpus_per_node == 2 and spec.training.sequence_length == 8192
    assert spec.tuning.memory_headroom == 0.0


def test_unknown_fields_are_rejected() -> None:
    data = record("llama3.2-1b", 4096, candidate(1, "none")).model_dump(mode="json")
    data["tokens_per_sec"] = 1.0
    with pytest.raises(ValidationError):
        CalibrationRecord.model_validate(data)
