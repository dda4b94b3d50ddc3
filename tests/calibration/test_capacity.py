"""At the GPU's capacity: reserved memory saturates, no speed fit there; picks keep headroom."""

from __future__ import annotations

from blackwell_operator.calibrate.checks import DEFAULT_HEADROOM, pick
from blackwell_operator.calibrate.fit import _residuals
from blackwell_operator.calibrate.predict import compare
from blackwell_operator.calibrate.records import CalibrationRecord, RecordStatus
from blackwell_operator.calibration import Calibration
from blackwell_operator.units import GIB
from tests.support.calibration_records import candidate, record


def _ran(
    preset: str, mbs: int, ac: str, tps: float, reserved_gib: float, allocated_gib: float | None = None
) -> CalibrationRecord:
    """A run at sequence 4096 that measured `tps` and reserved `reserved_gib` (allocated 5 GiB less)."""
    return record(
        preset,
        4096,
        candidate(mbs, ac),
        tokens_per_second_per_gpu=tps,
        peak_reserved_bytes=round(reserved_gib * GIB),
        peak_allocated_bytes=round((reserved_gib - 5 if allocated_gib is None else allocated_gib) * GIB),
    )


def test_a_demand_over_the_gpu_is_compared_at_the_room_the_allocator_has(base: Calibration) -> None:
    # 8B without checkpointing at mbs 2 on one H200: the pool it would reserve is larger than the GPU.
    r = record("llama3.1-8b", 4096, candidate(2, "none"), peak_reserved_bytes=round(138.5 * GIB))
    c = compare(r, base)
    assert c.saturated and not c.predicted_fits
    assert c.pool_capacity == c.capacity_bytes - c.evaluation.memory.outside_allocator
    assert c.predicted_reserved == c.pool_capacity < c.reserved_demand
    # The pool measured at the cap is then within a few percent of the prediction.
    assert abs(c.reserved_error or 1.0) < 0.02


def test_runs_that_filled_the_gpu_are_kept_out_of_the_speed_fit(base: Calibration) -> None:
    at_cap = _ran("llama3.1-8b", 1, "none", 6000.0, 138.4, allocated_gib=125)
    roomy = _ran("llama3.2-1b", 8, "none", 60000.0, 62, allocated_gib=58)
    capped, fine = compare(at_cap, base), compare(roomy, base)
    assert capped.measured_at_capacity and not fine.measured_at_capacity
    assert _residuals(capped, "throughput") == []
    assert len(_residuals(fine, "throughput")) == 1
    # Their memory still counts.
    assert len(_residuals(capped, "memory")) == 2


def test_the_pick_keeps_the_planners_headroom(base: Calibration) -> None:
    small = [_ran("llama3.2-1b", m, "none", 60000.0 + m, 40.0 + 4 * m) for m in (4, 8)]
    comps = [compare(r, base) for r in small]
    scenario = comps[0].record.scenario
    chosen = pick(scenario, comps)
    assert chosen.pick is not None and chosen.passed
    assert all(c.fits_within(DEFAULT_HEADROOM) for c in comps)
    # With no headroom left at all, nothing fits: a refusal.
    assert pick(scenario, comps, headroom=0.99).pick is None


def test_a_refusal_passes_only_when_every_run_measured_over_the_budget(base: Calibration) -> None:
    # 8B on one H200 under FSDP2 (these records predate the single-device path): nothing fits with 5%.
    over = [_ran("llama3.1-8b", m, "full", 9000.0 + m, 136.0) for m in (4, 8)]
    comps = [compare(r, base) for r in over]
    scenario = comps[0].record.scenario
    refused = pick(scenario, comps)
    assert refused.pick is None and refused.refusal_confirmed and refused.passed
    # Had one of them measured comfortably within the budget (the model predicts 8B full AC at mbs 2 over
    # it too: its optimizer phase), refusing would be a miss.
    within = [*over, _ran("llama3.1-8b", 2, "full", 8000.0, 100.0)]
    comps = [compare(r, base) for r in within]
    missed = pick(scenario, comps)
    assert missed.pick is None and not missed.refusal_confirmed and not missed.passed


def test_the_best_within_the_budget_is_named_beside_the_best(base: Calibration) -> None:
    # As 13B on two H200s: the fastest runs reserved more than the planner's budget allows, so the best the
    # planner may choose is a slower one; the strict ratio still compares with the fastest.
    fast_over = _ran("llama3.1-8b", 4, "none", 15000.0, 136.0)
    slow_within = _ran("llama3.1-8b", 4, "full", 12000.0, 120.0)
    comps = [compare(r, base) for r in (fast_over, slow_within)]
    result = pick(comps[0].record.scenario, comps)
    assert result.best is fast_over
    assert result.best_within_budget is slow_within
    # When nothing measured within the budget there is none to name.
    only_over = [compare(fast_over, base)]
    assert pick(only_over[0].record.scenario, only_over).best_within_budget is None


def test_an_oom_is_never_a_pick(base: Calibration) -> None:
    oom = record("llama3.2-1b", 4096, candidate(64, "none"), status=RecordStatus.OOM)
    c = compare(oom, base)
    assert not c.fits_within(DEFAULT_HEADROOM)


def test_counted_allocator_retries_decide_whether_a_run_was_at_capacity(base: Calibration) -> None:
    def run(retries: int | None, reserved_gib: float) -> bool:
        r = record(
            "llama3.2-3b",
            4096,
            candidate(8, "none"),
            tokens_per_second_per_gpu=26000.0,
            peak_reserved_bytes=round(reserved_gib * GIB),
            alloc_retries=retries,
        )
        return compare(r, base).measured_at_capacity

    # Without the count (older records) a pool at the cap is taken as at capacity; with it, the count rules.
    assert run(None, 138.4) and not run(None, 100.0)
    assert not run(0, 138.4) and run(3, 120.0)
