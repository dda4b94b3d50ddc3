"""The calibration harness end to end on CPU: a tiny model in one process and in two (gloo)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from blackwell_operator.calibrate.records import RecordStatus, read_records

# The two-GPU configuration is two gloo ranks under torchrun.
pytestmark = pytest.mark.distributed

ROOT = Path(__file__).resolve().parents[2]


def _harness(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    # As on the GPU machine: a module of the repository, run from its root, importing the installed packages.
    cmd = [sys.executable, "-m", "benchmarks.calibration.harness", "--cpu-smoke", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False, cwd=ROOT)


def test_cpu_smoke_writes_one_record_per_configuration(tmp_path: Path) -> None:
    proc = _harness("--out", str(tmp_path), timeout=170)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    records = read_records([tmp_path / "records.jsonl"])
    assert sorted(r.gpus for r in records) == [1, 1, 2]
    for r in records:
        assert r.status is RecordStatus.OK, r.detail
        assert r.tokens_per_second_per_gpu and r.tokens_per_second_per_gpu > 0
        assert len(r.step_times_seconds) == 2 and r.loss is not None
        assert r.predicted is not None and r.predicted_calibration == "btj-trainer"
        assert r.versions.torch and r.gpu_name == "cpu" and r.date
        assert r.source == "harness"
        # Where the configuration's time went, for speeding the harness up.
        assert all(f"{phase} " in r.detail for phase in ("import", "setup", "warmup", "timed")), r.detail
    # The path each one really ran, as the trainer decided it: one process trains without FSDP2.
    assert {r.gpus: r.single_device_path for r in records} == {1: True, 2: False}
    # Accumulation: both micro-batches of a step ran, and the step's tokens count both.
    one, two = (
        next(r for r in records if r.gpus == 1 and r.candidate.gradient_accumulation_steps == n)
        for n in (1, 2)
    )
    assert "_ga2" in two.key and two.predicted is not None
    assert two.step_time_seconds and one.step_time_seconds
    assert two.tokens_per_second_per_gpu == pytest.approx(2 * 128 / two.step_time_seconds)
    assert (tmp_path / "summary.txt").read_text().count("_mbs1") == 3
    # Resuming from those records: everything is measured already, nothing runs again.
    again = tmp_path / "again"
    proc = _harness("--out", str(again), "--resume", str(tmp_path / "records.jsonl"), timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert not (again / "records.jsonl").exists()


def test_a_call_with_too_little_budget_left_starts_nothing(tmp_path: Path) -> None:
    # Under MIN_START_S a configuration would only be killed at the call's deadline: it is left for the
    # next call (named, no record, so --resume runs it) instead of being started and lost as a timeout.
    proc = _harness("--out", str(tmp_path), "--budget-s", "20", timeout=60)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stdout.count("not started (budget)") == 3
    assert not (tmp_path / "records.jsonl").exists()


def test_a_lane_s_next_configuration_starts_in_a_pre_started_worker(tmp_path: Path) -> None:
    # Two one-GPU families, each on its own lane with two sizes: each lane's second configuration runs in
    # the worker started (and imported) while the first trained; nothing is left waiting at the end.
    proc = _harness("--gpus", "1", "--max-mbs", "2", "--out", str(tmp_path), timeout=170)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    records = read_records([tmp_path / "records.jsonl"])
    assert len(records) == 4 and all(r.status is RecordStatus.OK for r in records), records
    started: dict[int, list[bool]] = {r.candidate.micro_batch_size: [] for r in records}
    for r in records:
        started[r.candidate.micro_batch_size].append("prewarmed (imports" in r.detail)
    assert started == {1: [False, False], 2: [True, True]}
    # Its own import phase is then what was left after the early imports: the trainer's modules are loaded.
    assert all("import 0.0 s" in r.detail for r in records if r.candidate.micro_batch_size == 2)


def test_the_pool_ends_the_workers_it_started_and_hands_out_only_live_ones(tmp_path: Path) -> None:
    import os

    from benchmarks.calibration.prewarm import WarmPool
    from benchmarks.calibration.scheduler import WORKER, kill_tree

    pool = WarmPool(WORKER, ROOT)
    env = dict(os.environ)
    pool.spawn((0,), env)
    pool.spawn((0,), env)  # one per lane: the second call keeps the first
    pool.spawn((1,), env)
    lane0, lane1 = pool.waiting[(0,)], pool.waiting[(1,)]
    assert lane0.alive() and lane1.alive() and len(pool.waiting) == 2
    kill_tree(lane1.proc.pid)
    lane1.proc.wait()
    assert pool.take((1,)) is None  # a dead one is not handed out: that configuration starts cold
    pool.close(kill_tree)
    assert not lane0.alive() and pool.take((0,)) is None


def test_without_prewarm_every_configuration_starts_cold(tmp_path: Path) -> None:
    proc = _harness("--gpus", "1", "--max-mbs", "2", "--no-prewarm", "--out", str(tmp_path), timeout=170)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    records = read_records([tmp_path / "records.jsonl"])
    assert len(records) == 4 and not any("prewarmed" in r.detail for r in records)


def test_a_pre_started_worker_whose_imports_started_cuda_exits_instead_of_waiting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import torch
    from benchmarks.calibration import worker

    class Exited(Exception):
        def __init__(self, code: int) -> None:
            self.code = code

    def exit_now(code: int) -> None:
        raise Exited(code)

    monkeypatch.setattr(worker, "PRELOAD", ("json",))  # the imports themselves are not what is tested
    monkeypatch.setattr(worker, "OPTIONAL_PRELOAD", ())
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)  # as if an import had started CUDA
    monkeypatch.setattr(worker.os, "_exit", exit_now)
    (tmp_path / worker.GO_FILE).write_text("{}")  # a configuration is even waiting: it must not be run
    with pytest.raises(Exited) as exited:
        worker.wait_in(tmp_path)
    assert exited.value.code == 1  # no result: the scheduler's take() sees it dead and starts cold
    assert "CUDA was started by the imports" in capsys.readouterr().out
    assert not list(tmp_path.glob("result.rank*.json"))
