"""The harness's micro-batch ladders: from the prediction, up to the first OOM, down when the start OOMs."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest
from benchmarks.calibration import grid, scheduler

from blackwell_operator.calibrate.records import CalibrationRecord, RecordStatus
from blackwell_operator.calibration import Calibration


def _harness(base: Calibration, tmp_path: Path, **overrides: Any) -> Any:
    """A one-GPU Harness writing to tmp_path, ten minutes of budget; `overrides` replace its fields."""
    fields: dict[str, Any] = dict(
        out=tmp_path,
        cal=base,
        instance=grid.H200_INSTANCE,
        deadline=time.time() + 600,
        gpus=1,
        warmup=1,
        timed=1,
        max_mbs=64,
        config_timeout=60,
        start_from_prediction=True,
        env={"gpu_name": "test", "versions": {}},
    )
    return scheduler.Harness(**{**fields, **overrides})


def _runner(
    base: Calibration,
    tmp_path: Path,
    oom_from: int,
    done: dict[str, CalibrationRecord] | None = None,
    error: bool = False,
) -> tuple[Any, list[int]]:
    h = _harness(base, tmp_path, done=done or {})
    ran: list[int] = []

    def run_config(fam: Any, mbs: int, gpu_ids: list[int]) -> CalibrationRecord:
        # The measurement stand-in: OOM from a given micro-batch size up.
        ran.append(mbs)
        stub: CalibrationRecord = grid.build_plan(fam, mbs, base, grid.H200_INSTANCE)[1]
        status = RecordStatus.OOM if mbs >= oom_from else RecordStatus.OK
        status = RecordStatus.ERROR if error else status
        return stub.model_copy(
            update={"status": status, "tokens_per_second_per_gpu": 1.0 if status == "ok" else None}
        )

    h.run_config = run_config
    return h, ran


def test_ladder_starts_below_the_prediction_and_stops_at_the_first_oom(
    base: Calibration, tmp_path: Path
) -> None:
    fam = grid.Family("1b", 2048, 1, "bf16", "none", "none")
    largest = 1  # the largest power of two the planner predicts to fit
    while True:
        plan, _ = grid.build_plan(fam, largest * 2, base, grid.H200_INSTANCE)
        if plan.predicted.memory.peak_reserved > plan.gpu.memory_bytes:
            break
        largest *= 2
    h, ran = _runner(base, tmp_path, oom_from=1000)
    start = h.ladder(fam)[0]
    assert start == max(1, largest // 4) and start > 1
    h, ran = _runner(base, tmp_path, oom_from=start * 4)
    h.run_family(fam, [0])
    assert ran == [start, start * 2, start * 4]
    assert [r.status.value for r in h.records] == ["ok", "ok", "oom"]


def test_an_oom_at_the_start_walks_down(base: Calibration, tmp_path: Path) -> None:
    fam = grid.Family("1b", 2048, 1, "bf16", "none", "none")
    h, ran = _runner(base, tmp_path, oom_from=1)
    start = h.ladder(fam)[0]
    h.run_family(fam, [0])
    assert ran[0] == start and ran[-1] == 1 and ran == sorted(ran, reverse=True)
    recs = [r for r in h.records if r.status is RecordStatus.OOM]
    assert len(recs) == len(ran)


def test_resumed_configurations_are_not_run_again(base: Calibration, tmp_path: Path) -> None:
    fam = grid.Family("3b", 4096, 1, "bf16", "none", "none")
    first, ran_first = _runner(base, tmp_path, oom_from=8)
    first.run_family(fam, [0])
    again, ran_again = _runner(base, tmp_path, oom_from=8, done={r.key: r for r in first.records})
    again.run_family(fam, [0])
    assert ran_first and ran_again == []


def test_a_grid_whose_first_configurations_fail_stops_early(base: Calibration, tmp_path: Path) -> None:
    families = [grid.Family(m, 2048, 1, "bf16", "none", ac) for m in ("1b", "3b") for ac in grid.ACS]
    h, ran = _runner(base, tmp_path, oom_from=1000, error=True)
    h.run(families)
    # Each failure ends its family's ladder; after the fail-fast count no family starts.
    assert len(ran) == scheduler.FAIL_FAST_ERRORS
    assert h.failing()


def test_one_good_record_turns_fail_fast_off(base: Calibration, tmp_path: Path) -> None:
    fam = grid.Family("1b", 2048, 1, "bf16", "none", "none")
    h, _ = _runner(base, tmp_path, oom_from=1000)
    h.run_family(fam, [0])
    errors = [r.model_copy(update={"status": RecordStatus.ERROR}) for r in h.records] * 3
    h.records.extend(errors)
    assert not h.failing()


def test_kill_tree_reaches_workers_in_sessions_of_their_own(tmp_path: Path) -> None:
    import os
    import subprocess

    pid_file = tmp_path / "worker.pid"
    # A parent in its own group that starts a worker in a new session, as torchrun does.
    script = (
        "import subprocess, sys, time;"
        "w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'],"
        " start_new_session=True);"
        f"open({str(pid_file)!r}, 'w').write(str(w.pid)); time.sleep(300)"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], start_new_session=True)
    deadline = time.time() + 30
    while not (pid_file.exists() and pid_file.read_text()) and time.time() < deadline:
        time.sleep(0.05)
    worker = int(pid_file.read_text())
    scheduler.kill_tree(parent.pid)
    parent.wait(timeout=10)
    deadline = time.time() + 10
    while time.time() < deadline:
        try:
            os.kill(worker, 0)
        except ProcessLookupError:
            break
        # A killed child of the dead parent is reaped by init; until then it is a zombie.
        if Path(f"/proc/{worker}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
            break
        time.sleep(0.05)
    else:
        raise AssertionError("the worker outlived kill_tree")


def test_a_configuration_cut_by_the_call_deadline_is_left_for_the_next_call(
    base: Calibration, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A real worker process (the CPU smoke model) that the call's deadline overtakes: it is killed and
    # recorded as skipped, not as a timeout, so --resume runs it again; its log is kept.
    monkeypatch.setattr(scheduler, "MIN_START_S", 0.0)
    fam = grid.GRIDS["cpu-smoke"][0]
    # The harness kills 10 s before the deadline: half a second to run.
    h = _harness(base, tmp_path, deadline=time.time() + 10.5, start_from_prediction=False)
    rec = h.run_config(fam, 1, [0])
    assert rec.status is RecordStatus.SKIPPED
    assert rec.detail.startswith("call budget exhausted (killed after"), rec.detail
    assert f"===== {rec.key}" in (tmp_path / "worker_logs.txt").read_text()


def test_a_fine_ladder_steps_through_the_predicted_limit(base: Calibration, tmp_path: Path) -> None:
    # 3B at 4096 on one H100: the planner's limit lies between two doublings; a fine ladder measures one
    # step under it, the limit itself, and steps on to the first OOM.
    fam = grid.Family("3b", 4096, 1, "fp8", "torchao-tensorwise", "none")
    h = _harness(base, tmp_path, instance=grid.H100_INSTANCE, fine=True)
    limit = h.predicted_limit(fam)
    assert h.fits(fam, limit) and not h.fits(fam, limit + 1)
    step = max(1, limit // 4)
    assert h.ladder(fam)[:3] == [max(1, limit - step), limit, limit + step]
    h, ran = _runner(base, tmp_path, oom_from=limit + step)
    h.fine, h.instance = True, grid.H100_INSTANCE
    h.run_family(fam, [0])
    assert ran == [max(1, limit - step), limit, limit + step]
    assert [r.status.value for r in h.records] == ["ok", "ok", "oom"]
