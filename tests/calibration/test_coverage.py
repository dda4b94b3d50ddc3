"""Grid coverage: a ladder that stops before its first OOM is named, a complete one is not."""

from __future__ import annotations

from blackwell_operator.calibrate.coverage import LADDER_TOP, open_ladders
from blackwell_operator.calibrate.records import CalibrationRecord, RecordStatus
from tests.support.calibration_records import candidate, record


def _ladder(ac: str, statuses: dict[int, RecordStatus], source: str = "harness") -> list[CalibrationRecord]:
    return [
        record("llama3.2-1b", 4096, candidate(m, ac), status=s, source=source) for m, s in statuses.items()
    ]


OK, OOM, SKIPPED = RecordStatus.OK, RecordStatus.OOM, RecordStatus.SKIPPED


def test_ladders_closed_by_an_oom_or_the_top_size_are_complete() -> None:
    records = [
        *_ladder("none", {4: OK, 8: OK, 16: OOM}),
        *_ladder("full", {LADDER_TOP // 2: OK, LADDER_TOP: OK}),
        *_ladder("selective", {1: OOM}),  # nothing ran: no ladder to close
    ]
    assert open_ladders(records) == []


def test_a_cut_or_missing_next_rung_is_named_with_its_status() -> None:
    cut = _ladder("none", {4: OK, 8: OK, 16: SKIPPED})
    missing = _ladder("full", {8: OK})
    gaps = open_ladders([*cut, *missing])
    assert [(g.family, g.largest_ran, g.next_size, g.next_status) for g in gaps] == [
        ("llama3.2-1b s4096 g1 bf16 ac-full shard-full", 8, 16, "not run"),
        ("llama3.2-1b s4096 g1 bf16 ac-none shard-full", 8, 16, "skipped"),
    ]


def test_a_later_oom_replaces_an_earlier_cut_of_the_same_rung() -> None:
    records = _ladder("none", {4: OK, 8: SKIPPED}) + _ladder("none", {8: OOM})
    assert open_ladders(records) == []
    assert open_ladders(list(reversed(records))) == []


def test_imported_runs_are_not_ladders() -> None:
    assert open_ladders(_ladder("none", {4: OK}, source="trainer_h200")) == []
