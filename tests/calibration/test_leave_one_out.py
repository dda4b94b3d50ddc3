"""Leave-one-scenario-out: refit without a scenario, pick among its measured configurations, judge."""

from __future__ import annotations

from collections.abc import Sequence

from blackwell_operator.calibrate.checks import Thresholds, by_scenario, default_fitter, leave_one_out
from blackwell_operator.calibrate.fit import with_constants
from blackwell_operator.calibrate.records import CalibrationRecord, RecordStatus
from blackwell_operator.calibration import Calibration
from tests.support.calibration_records import grid_stubs, measure

CONSTANTS = ["memory.act_hidden", "throughput.recipes.9.none.efficiency"]


def _grid(truth: Calibration) -> list[CalibrationRecord]:
    stubs = grid_stubs(["llama3.2-1b", "llama3.2-3b"], [4096, 8192], ["none", "full"], [1, 2, 4, 8, 16])
    return measure(stubs, truth, 0.003)


def test_synthetic_grid_passes_every_criterion(base: Calibration) -> None:
    truth = with_constants(base, {"memory.act_hidden": 9.0, "throughput.recipes.9.none.efficiency": 0.68})
    records = _grid(truth)
    assert len(by_scenario(records)) == 4
    seen: list[int] = []

    def fitter(recs: Sequence[CalibrationRecord], start: Calibration) -> Calibration:
        seen.append(len({r.scenario for r in recs}))
        return default_fitter(CONSTANTS)(recs, start)

    result = leave_one_out(records, base, fitter(records, base), fitter)
    # One refit for the full calibration, then one per scenario, each without that scenario's records.
    assert seen == [4, 3, 3, 3, 3]
    assert len(result.picks) == 4 and all(p.passed for p in result.picks)
    verdicts = {c.name: c.verdict for c in result.criteria}
    assert set(verdicts.values()) <= {"PASS"}, verdicts
    assert all(p.pick is not None and p.pick.record.ran for p in result.picks)


def test_missed_oom_and_bad_pick_fail(base: Calibration) -> None:
    records = _grid(base)
    # Pretend the largest run of each scenario OOMed and the others reserved 20% more than predicted:
    # the base believes the largest fits and is fastest, picks it, and fails all three criteria.
    worst: list[CalibrationRecord] = []
    for rs in by_scenario(records).values():
        ran = [r for r in rs if r.ran]
        largest = max(ran, key=lambda r: r.candidate.micro_batch_size)
        for r in ran:
            if r is largest:
                worst.append(
                    r.model_copy(
                        update={
                            "status": RecordStatus.OOM,
                            "tokens_per_second_per_gpu": None,
                            "peak_allocated_bytes": None,
                            "peak_reserved_bytes": None,
                        }
                    )
                )
            else:
                worst.append(
                    r.model_copy(update={"peak_reserved_bytes": int((r.peak_reserved_bytes or 0) * 1.2)})
                )
    keep = lambda recs, start: start  # noqa: E731  (no refit: the base is what is judged)
    result = leave_one_out(worst, base, base, keep)
    verdicts = {
        c.name.split(":")[1].strip()[:20]: c.verdict for c in result.criteria if c.name.startswith("leave")
    }
    assert list(verdicts.values()) == ["FAIL", "FAIL", "FAIL"], verdicts
    assert any(p.pick is not None and p.pick.record.oom for p in result.picks)


def test_scenario_without_runs_has_no_data(base: Calibration) -> None:
    records = [r.model_copy(update={"status": RecordStatus.OOM}) for r in _grid(base)[:3]]
    result = leave_one_out(records, base, base, lambda recs, start: start)
    assert result.criteria[0].verdict == "NO DATA"
    assert result.criteria[1].verdict == "NO DATA"


def test_a_scenario_measured_on_part_of_its_grid_is_named(base: Calibration) -> None:
    # 1B at 8192 lost its full-AC family (a call budget cut it): its pick may pass, but the criterion
    # says it was judged on 1 of the 2 families 1B measured at 4096.
    records = [
        r
        for r in _grid(base)
        if not (
            r.sequence_length == 8192
            and r.model_name == "llama3.2-1b"
            and r.candidate.activation_checkpointing.value == "full"
        )
    ]
    result = leave_one_out(records, base, base, default_fitter(CONSTANTS))
    coverage = {p.scenario.label(): (p.families_measured, p.families_expected) for p in result.picks}
    assert coverage["llama3.2-1b s8192 g1"] == (1, 2)
    assert coverage["llama3.2-1b s4096 g1"] == (2, 2) and coverage["llama3.2-3b s8192 g1"] == (2, 2)
    detail = {c.name: c.detail for c in result.criteria}[
        "leave-one-out: pick >= 97% of best measured, never OOM"
    ]
    assert "judged on part of its grid: llama3.2-1b s8192 g1 (1 of 2 families)" in detail


def test_tighter_thresholds_judge_tokens_and_name_their_limits(base: Calibration) -> None:
    # Issue 37's bar for a GPU's own profile: picks at 99%, memory within 3%, tokens/s within 5%. Measured
    # 8% faster than modelled everywhere: issue 6's criteria pass (they do not judge tokens/s), these fail it.
    records = [
        r.model_copy(update={"tokens_per_second_per_gpu": (r.tokens_per_second_per_gpu or 0) * 1.08})
        if r.ran
        else r
        for r in _grid(base)
    ]
    keep = lambda recs, start: start  # noqa: E731  (no refit: the base is what is judged)
    default = leave_one_out(records, base, base, keep)
    assert not any("tokens/s" in c.name for c in default.criteria)
    tight = leave_one_out(records, base, base, keep, thresholds=Thresholds(0.99, 0.03, 0.05))
    verdicts = {c.name: c.verdict for c in tight.criteria}
    assert verdicts["leave-one-out: tokens/s within 5% on every run"] == "FAIL"
    assert verdicts["in-sample: tokens/s within 5% on every run"] == "FAIL"
    assert verdicts["leave-one-out: reserved memory within 3% on every run"] == "PASS"
    assert "leave-one-out: pick >= 99% of best measured, never OOM" in verdicts
    assert all(p.pick_ratio == 0.99 for p in tight.picks)
