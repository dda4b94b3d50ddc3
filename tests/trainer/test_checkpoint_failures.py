"""A checkpoint save that fails (a full file system): an interval save is counted and training goes on;
three in a row, the final save or the preemption save end the run with one line and exit 2."""

from __future__ import annotations

import errno
import json
import logging
import signal
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from torch.distributed.checkpoint.api import CheckpointException

import blackwell_trainer.checkpoint.store as checkpoint_module
from blackwell_trainer.checkpoint.manager import MAX_FAILED_SAVES_IN_A_ROW
from blackwell_trainer.checkpoint.store import list_complete
from blackwell_trainer.loop.preemption import PreemptionGuard
from blackwell_trainer.loop.trainer import Trainer
from blackwell_trainer.plan.config import PERMANENT_ERROR_PREFIX, Plan
from blackwell_trainer.train import main
from tests.ports import free_port
from tests.support.plans import tiny_plan_dict

from .conftest import spawn_two_ranks

ENOSPC = "No space left on device"


def write_plan(folder: Path, *, steps: int, interval: int) -> Path:
    """The tiny plan on one process (8 sequences per step, as the 2-rank plan), checkpointing to folder."""
    plan = tiny_plan_dict(microBatchSize=8, shardDegree=1)
    plan.update(gpusPerNode=1, steps=steps, metricsPort=free_port(), logEverySteps=1000)
    plan["parameterCount"] = Plan.model_validate(plan).architecture.parameter_count()
    plan["checkpoint"] = {"path": str(folder / "ckpt"), "intervalSteps": interval, "keepLatest": 2}
    path = folder / "plan.json"
    path.write_text(json.dumps(plan))
    return path


def fail_saves(monkeypatch: pytest.MonkeyPatch, failing: Callable[[int], bool]) -> None:
    """DCP's save of the steps `failing` picks writes part of a shard, then the file system is full.

    Raised as DCP raises it on every rank when one rank's write fails: a CheckpointException that
    carries the OSError of the rank that failed.
    """
    real = checkpoint_module.dcp_save

    def save(state: dict[str, Any], *, checkpoint_id: str) -> Any:
        if failing(int(checkpoint_id.rsplit("-", 1)[1])):
            (Path(checkpoint_id) / "__0_0.distcp").write_bytes(b"half a shard")
            err = OSError(errno.ENOSPC, ENOSPC, f"{checkpoint_id}/__0_0.distcp")
            raise CheckpointException("save failed", {0: (err, traceback.StackSummary())})
        return real(state, checkpoint_id=checkpoint_id)

    monkeypatch.setattr(checkpoint_module, "dcp_save", save)


def errors(stderr: str) -> list[str]:
    assert "Traceback" not in stderr, stderr
    return [line for line in stderr.splitlines() if line.startswith("error: ")]


def test_a_failed_interval_save_is_counted_and_the_next_one_is_complete(
    tmp_path: Path,
    world_of_one: None,
    monkeypatch: pytest.MonkeyPatch,
    scraped: dict[str, float],
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    plan = write_plan(tmp_path, steps=12, interval=4)
    fail_saves(monkeypatch, lambda step: step == 8)
    with caplog.at_level(logging.INFO):
        assert main(["--plan", str(plan)]) == 0
    assert errors(capsys.readouterr().err) == []

    root = tmp_path / "ckpt"
    assert scraped["btj_trainer_steps_total"] == 12  # training reached plan.steps
    assert scraped["btj_trainer_checkpoint_failures_total"] == 1
    assert scraped["btj_trainer_step"] == scraped["btj_trainer_planned_steps"] == 12  # the job's progress
    assert [c.step for c in list_complete(root)] == [4, 12]
    assert sorted(p.name for p in root.iterdir()) == ["step-000004", "step-000012"]  # no temporary left
    (line,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert f"checkpoint of step 8 not written to spec.training.checkpoint.path {root}" in line
    assert "free of" in line and ENOSPC in line and "newest complete checkpoint is step 4" in line
    assert "tries again at step 12" in line and "\n" not in line

    # The checkpoint written after the failure is one to resume from: a longer run starts there.
    plan.write_text(json.dumps({**json.loads(plan.read_text()), "steps": 14}))
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    caplog.clear()
    with caplog.at_level(logging.INFO):
        assert main(["--plan", str(plan)]) == 0
    assert any(m.startswith("resumed at step 12:") for m in caplog.messages)
    assert scraped["btj_trainer_steps_total"] == 2
    # This container ran 2 steps; the job's step counts the 12 before the resume (status.progress).
    assert scraped["btj_trainer_step"] == scraped["btj_trainer_planned_steps"] == 14
    assert [c.step for c in list_complete(root)] == [12, 14]


def test_failed_saves_in_a_row_stop_the_run_with_one_line(
    tmp_path: Path,
    world_of_one: None,
    monkeypatch: pytest.MonkeyPatch,
    scraped: dict[str, float],
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert MAX_FAILED_SAVES_IN_A_ROW == 3
    plan = write_plan(tmp_path, steps=20, interval=2)
    # Step 4 fails, step 6 succeeds (the count restarts), then 8, 10 and 12 fail: the run stops at 12.
    fail_saves(monkeypatch, lambda step: step in (4, 8, 10, 12, 14))
    assert main(["--plan", str(plan)]) == 2
    (line,) = errors(capsys.readouterr().err)
    stop = "error: 3 interval checkpoints in a row not written, the last checkpoint of step 12 not written"
    assert line.startswith(stop)
    assert "spec.training.checkpoint.path" in line and ENOSPC in line
    assert "newest complete checkpoint is step 6" in line
    assert scraped["btj_trainer_steps_total"] == 12
    assert scraped["btj_trainer_checkpoint_failures_total"] == 4
    logged = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert [m.split(" not written")[0] for m in logged] == [f"checkpoint of step {s}" for s in (4, 8, 10)]
    assert [c.step for c in list_complete(tmp_path / "ckpt")] == [2, 6]


def test_a_failed_final_save_exits_2_with_one_line(
    tmp_path: Path, world_of_one: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = write_plan(tmp_path, steps=6, interval=4)
    fail_saves(monkeypatch, lambda step: step == 6)
    monkeypatch.setenv("BTJ_TERMINATION_LOG", str(tmp_path / "termination-log"))
    assert main(["--plan", str(plan)]) == 2
    (line,) = errors(capsys.readouterr().err)
    assert line.startswith("error: final checkpoint of step 6 not written to spec.training.checkpoint.path")
    assert ENOSPC in line and "newest complete checkpoint is step 4" in line
    assert [c.step for c in list_complete(tmp_path / "ckpt")] == [4]
    # The same line is the pod's termination message (Kubernetes shows it in lastState.terminated).
    assert (tmp_path / "termination-log").read_text() == line + "\n"


def test_a_failed_preemption_save_exits_2_with_one_line(
    tmp_path: Path, world_of_one: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = write_plan(tmp_path, steps=100, interval=4)
    fail_saves(monkeypatch, lambda step: step == 5)
    guard = PreemptionGuard()
    step = Trainer.step

    def step_then_sigterm(self: Trainer, batches: Any) -> Any:
        result = step(self, batches)
        if self.step_index == 5:
            guard._handle(signal.SIGTERM, None)  # what the kubelet's SIGTERM does, without sending one
        return result

    monkeypatch.setattr(Trainer, "step", step_then_sigterm)
    try:
        assert main(["--plan", str(plan)], guard=guard) == 2
    finally:
        guard.restore()
    (line,) = errors(capsys.readouterr().err)
    assert line.startswith("error: preempted at step 5: checkpoint of step 5 not written")
    assert ENOSPC in line and "newest complete checkpoint is step 4" in line
    assert [c.step for c in list_complete(tmp_path / "ckpt")] == [4]


# --- two ranks (gloo): one rank's failure is every rank's, so no rank waits in a collective alone


def _two_rank_saves(rank: int, init: str, root: str) -> None:
    """Each failure on one rank only; every rank must raise SaveFailed naming it, then a save works."""
    from contextlib import AbstractContextManager, nullcontext
    from datetime import timedelta
    from unittest import mock

    import torch
    import torch.distributed as dist
    from torch import nn

    from blackwell_trainer.checkpoint.store import Checkpointer, SaveFailed
    from blackwell_trainer.plan.config import CheckpointConfig

    # A short timeout: a rank left waiting in a barrier fails the test instead of hanging it.
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2, timeout=timedelta(seconds=60))
    try:
        model = nn.Linear(4, 4)
        optimizer = torch.optim.AdamW(model.parameters())
        ckpt = Checkpointer(CheckpointConfig(path=root, interval_steps=1, keep_latest=5), rank=rank)
        ckpt.save(1, model, optimizer, {"step": 1})
        full = OSError(errno.ENOSPC, ENOSPC)
        attempts: list[tuple[int, int, AbstractContextManager[Any]]] = [
            # Rank 1's extra file: DCP does not see it, only the Checkpointer's agreement does.
            (2, 1, mock.patch.object(checkpoint_module, "_write_extra", side_effect=full)),
            # Rank 0's marker, after every rank wrote its files.
            (3, 0, mock.patch.object(checkpoint_module, "_file_sizes", side_effect=full)),
        ]
        outcome: dict[str, Any] = {}
        for step, failing_rank, fault in attempts:
            try:
                with fault if rank == failing_rank else nullcontext():
                    ckpt.save(step, model, optimizer, {"step": step})
                outcome[str(step)] = "saved"
            except SaveFailed as err:
                outcome[str(step)] = f"rank {err.failed_rank}: {err.detail}"
        outcome["4"] = "saved" if ckpt.save(4, model, optimizer, {"step": 4}) else "skipped"
        Path(root, f"outcome-{rank}.json").write_text(json.dumps(outcome))
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
def test_a_failure_on_one_rank_raises_on_every_rank(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    root.mkdir()
    spawn_two_ranks(_two_rank_saves, (f"file://{tmp_path / 'rendezvous'}", str(root)))
    outcomes = [json.loads((root / f"outcome-{rank}.json").read_text()) for rank in (0, 1)]
    assert outcomes[0] == outcomes[1]
    assert outcomes[0]["2"] == f"rank 1: [Errno 28] {ENOSPC}"
    assert outcomes[0]["3"] == f"rank 0: [Errno 28] {ENOSPC}"
    assert outcomes[0]["4"] == "saved"
    assert [c.step for c in list_complete(root)] == [1, 4]
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == ["step-000001", "step-000004"]


def test_a_plan_the_trainer_refuses_is_a_permanent_error_in_the_termination_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # No restart can help: the operator reads the prefix and stops the job (storage failures above
    # keep plain `error: `, since full storage may be freed).
    monkeypatch.setenv("BTJ_TERMINATION_LOG", str(tmp_path / "termination-log"))
    assert main(["--plan", str(tmp_path / "missing.json")]) == 2
    (line,) = errors(capsys.readouterr().err)
    assert line.startswith("error: plan file not found")
    assert (tmp_path / "termination-log").read_text() == PERMANENT_ERROR_PREFIX + line[
        len("error: ") :
    ] + "\n"
