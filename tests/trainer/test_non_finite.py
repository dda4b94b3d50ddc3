"""A step whose loss, gradient norm or parameters are not finite stops the run before it saves: no NaN
checkpoint is written, none known to be good is pruned, and the exit code and one line say which step,
which value and which rank."""

from __future__ import annotations

import json
import logging
import math
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest
import torch

from blackwell_trainer.checkpoint.store import list_complete
from blackwell_trainer.loop.preemption import PreemptionGuard
from blackwell_trainer.loop.trainer import Trainer
from blackwell_trainer.train import EXIT_NON_FINITE, main
from tests.ports import free_port

from .conftest import REAL_STEP, before_step, join_two_rank_world, spawn_two_ranks
from .test_checkpoint_resume import error_lines, train, write_plan


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard under FSDP2 (two ranks), the tensor itself on the single-device path (one)."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) else tensor


def poison_norm_weight(trainer: Trainer) -> None:
    """NaN in this rank's shard of the final norm's weight: the real forward then gives a NaN loss."""
    with torch.no_grad():
        _local(trainer.model.norm.weight).fill_(math.nan)


def poison_second_moments(trainer: Trainer) -> None:
    """Adam's second moments made negative: loss and gradients stay finite, the update is NaN (sqrt)."""
    for state in trainer.optimizer.state.values():
        _local(state["exp_avg_sq"]).fill_(-1.0)


@pytest.mark.usefixtures("world_of_one")
def test_a_nan_loss_stops_the_run_without_writing_or_pruning_checkpoints(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
    scraped: dict[str, float],
) -> None:
    # keepLatest 1: the step-4 save alone would prune step 2 if step 4 counted as good before step 5.
    plan = write_plan(tmp_path, steps=20, interval=2, keep=1)
    before_step(monkeypatch, 5, poison_norm_weight)
    termination = tmp_path / "termination-log"
    monkeypatch.setenv("BTJ_TERMINATION_LOG", str(termination))
    rc, losses = train(plan, monkeypatch, caplog)

    assert rc == EXIT_NON_FINITE == 3
    assert sorted(losses) == [1, 2, 3, 4]  # step 5 is never logged or counted as a step
    assert scraped["btj_trainer_steps_total"] == 4
    (line,) = error_lines(capsys.readouterr().err)
    assert line == (
        "error: step 5: the loss is not finite on rank 0 (loss nan); stopped before saving it; a restart "
        "resumes from step 4. If it recurs at this step, lower optimizer.learningRate (spec.training) or "
        "inspect the data it reads"
    )
    # A restart may help (a faulty GPU, a transient spike): not a permanent error for the operator.
    assert termination.read_text() == line + "\n"
    root = tmp_path / "ckpt"
    # Step 4 was never followed by a finite step, so step 2 (followed by steps 3 and 4) is kept too.
    assert sorted(p.name for p in root.iterdir()) == ["step-000002", "step-000004"]

    # And the next start resumes from step 4 and trains on (the poison is gone with the process).
    monkeypatch.setattr(Trainer, "step", REAL_STEP)
    plan.write_text(json.dumps({**json.loads(plan.read_text()), "steps": 6}))
    rc, losses = train(plan, monkeypatch, caplog)
    assert (
        rc == 0
        and sorted(losses) == [5, 6]
        and any(m.startswith("resumed at step 4:") for m in caplog.messages)
    )
    assert [c.step for c in list_complete(root)] == [4, 6]  # final step 6 keeps step 4, known good


@pytest.mark.usefixtures("world_of_one")
def test_non_finite_parameters_after_a_finite_step_are_never_saved(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Step 4 is a save step: its loss and gradients are finite, its update is not.
    plan = write_plan(tmp_path, steps=20, interval=2, keep=1)
    before_step(monkeypatch, 4, poison_second_moments)
    with caplog.at_level(logging.INFO):
        rc, losses = train(plan, monkeypatch, caplog)
    assert rc == 3 and sorted(losses) == [1, 2, 3]
    (line,) = error_lines(capsys.readouterr().err)
    assert line.startswith("error: step 4: the parameters after the optimizer step are not finite on rank 0")
    assert "a restart resumes from step 2" in line
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step-000002"]


# --- two ranks (gloo): the ranks agree on the stop and name the rank where the value went bad


def _two_ranks_poisoned(rank: int, plan: str, port: int, folder: str) -> None:
    """One rank of a 2-rank main() run whose rank 1 corrupts its optimizer shard before step 4."""
    join_two_rank_world(rank, port, f"{folder}/termination-{rank}")

    def step(self: Trainer, batches: Any) -> Any:
        if rank == 1 and self.step_index + 1 == 4:
            poison_second_moments(self)
        return REAL_STEP(self, batches)

    Trainer.step = step  # type: ignore[method-assign]
    Path(folder, f"rc-{rank}").write_text(str(main(["--plan", plan])))


@pytest.mark.distributed
def test_two_ranks_stop_together_naming_the_rank_whose_parameters_went_bad(tmp_path: Path) -> None:
    from tests.support.plans import tiny_plan_dict

    raw = tiny_plan_dict()
    plan_path = write_plan(tmp_path, steps=20, interval=2, keep=1)
    one = json.loads(plan_path.read_text())
    raw.update(
        steps=20,
        metricsPort=free_port(),
        logEverySteps=1,
        checkpoint=one["checkpoint"],
        parameterCount=one["parameterCount"],
    )
    plan_path.write_text(json.dumps(raw))  # the 2-rank tiny plan, checkpointing as above
    spawn_two_ranks(_two_ranks_poisoned, (str(plan_path), free_port(), str(tmp_path)))
    assert [(tmp_path / f"rc-{r}").read_text() for r in (0, 1)] == ["3", "3"]
    messages = [(tmp_path / f"termination-{r}").read_text() for r in (0, 1)]
    assert messages[0] == messages[1]  # both ranks say the same, one line
    assert messages[0].startswith(
        "error: step 4: the parameters after the optimizer step are not finite on rank 1 (loss "
    )
    assert messages[0].count("\n") == 1
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step-000002"]


# --- the scan on the steps whose state is written (tuning.parameter_check off, the default)


def _track_steps(monkeypatch: pytest.MonkeyPatch, poison: tuple[int, Any] | None = None) -> list[int]:
    """The steps whose parameters were read, in order (one read a scan); `poison` (step, fn) runs fn on
    the trainer just before that step."""
    import blackwell_trainer.loop.finite_check as finite_check

    taking, scanned = [0], []
    real_largest = finite_check._largest

    def largest(model: Any, *, foreach: bool) -> torch.Tensor:
        scanned.append(taking[0])
        return real_largest(model, foreach=foreach)

    def step(self: Trainer, batches: Any) -> Any:
        taking[0] = self.step_index + 1
        if poison is not None and taking[0] == poison[0]:
            poison[1](self)
        return REAL_STEP(self, batches)

    monkeypatch.setattr(finite_check, "_largest", largest)
    monkeypatch.setattr(Trainer, "step", step)
    return scanned


@pytest.mark.usefixtures("world_of_one")
def test_only_the_steps_whose_state_is_written_are_scanned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    plan = write_plan(tmp_path, steps=7, interval=3)
    scanned = _track_steps(monkeypatch)
    rc, losses = train(plan, monkeypatch, caplog)
    assert rc == 0 and sorted(losses) == list(range(1, 8))
    assert scanned == [3, 6, 7]  # the interval saves and the final step (its checkpoint and any export)

    # The per-step scan, asked for: every step.
    monkeypatch.setenv("BTJ_TRAINER_TUNING", "parameter_check=true")
    shutil.rmtree(tmp_path / "ckpt")
    scanned.clear()
    rc, _ = train(plan, monkeypatch, caplog)
    assert rc == 0 and scanned == list(range(1, 8))


@pytest.mark.usefixtures("world_of_one")
def test_an_update_gone_bad_between_saves_stops_at_the_next_step_and_is_never_saved(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Step 3 is not a save step: its loss and gradients are finite, its update is not, and nothing reads
    # the weights after it. Step 4 (a save step) then computes its loss on them: NaN, stopped there.
    plan = write_plan(tmp_path, steps=20, interval=2, keep=1)
    _track_steps(monkeypatch, (3, poison_second_moments))
    rc, losses = train(plan, monkeypatch, caplog)
    assert rc == EXIT_NON_FINITE and sorted(losses) == [1, 2, 3]
    (line,) = error_lines(capsys.readouterr().err)
    assert line.startswith("error: step 4: the loss is not finite on rank 0")
    assert "a restart resumes from step 2" in line
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step-000002"]

    # With the per-step scan the same fault is named one step earlier; the checkpoints are the same.
    monkeypatch.setenv("BTJ_TRAINER_TUNING", "parameter_check=true")
    shutil.rmtree(tmp_path / "ckpt")
    rc, losses = train(plan, monkeypatch, caplog)
    assert rc == EXIT_NON_FINITE and sorted(losses) == [1, 2]
    (line,) = error_lines(capsys.readouterr().err)
    assert line.startswith("error: step 3: the parameters after the optimizer step are not finite on rank 0")
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step-000002"]


@pytest.mark.usefixtures("world_of_one")
def test_a_bad_update_on_the_final_step_is_neither_saved_nor_reported_as_success(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # No later step would read the weights: the final step is scanned before its checkpoint and export.
    plan = write_plan(tmp_path, steps=5, interval=4)
    _track_steps(monkeypatch, (5, poison_second_moments))
    rc, losses = train(plan, monkeypatch, caplog)
    assert rc == EXIT_NON_FINITE and sorted(losses) == [1, 2, 3, 4]
    (line,) = error_lines(capsys.readouterr().err)
    assert line.startswith("error: step 5: the parameters after the optimizer step are not finite on rank 0")
    assert "a restart resumes from step 4" in line
    assert [c.step for c in list_complete(tmp_path / "ckpt")] == [4]


@pytest.mark.usefixtures("world_of_one")
def test_a_preemption_save_after_an_unscanned_bad_update_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Preempted right after step 5, a step no save was due at: its state is scanned before it is saved.
    plan = write_plan(tmp_path, steps=100, interval=4)
    guard = PreemptionGuard()

    def step_then_sigterm(self: Trainer, batches: Any) -> Any:
        if self.step_index + 1 == 5:
            poison_second_moments(self)
        result = REAL_STEP(self, batches)
        if self.step_index == 5:
            guard._handle(signal.SIGTERM, None)  # what the kubelet's SIGTERM does, without sending one
        return result

    monkeypatch.setattr(Trainer, "step", step_then_sigterm)
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    try:
        assert main(["--plan", str(plan)], guard=guard) == EXIT_NON_FINITE
    finally:
        guard.restore()
    (line,) = error_lines(capsys.readouterr().err)
    assert line.startswith("error: step 5: the parameters after the optimizer step are not finite on rank 0")
    assert "stopped before saving it; a restart resumes from step 4" in line
    assert [c.step for c in list_complete(tmp_path / "ckpt")] == [4]


def _two_ranks_check_parameters(rank: int, port: int, folder: str) -> None:
    """Both ranks check their parameters before a save; rank 1's hold a NaN."""
    import torch.distributed as dist
    from torch import nn

    from blackwell_trainer.errors import NonFiniteStep
    from blackwell_trainer.loop.finite_check import check_parameters

    join_two_rank_world(rank, port, f"{folder}/termination-{rank}")
    dist.init_process_group("gloo")
    try:
        model = nn.Linear(4, 4)
        if rank == 1:
            with torch.no_grad():
                model.weight[0, 0] = math.nan
        try:
            check_parameters(7, 1.5, model, foreach=False)
            said = "no stop"
        except NonFiniteStep as err:
            said = str(err)
        Path(folder, f"said-{rank}").write_text(said)
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
def test_the_check_before_a_save_stops_both_ranks_naming_the_bad_one(tmp_path: Path) -> None:
    spawn_two_ranks(_two_ranks_check_parameters, (free_port(), str(tmp_path)))
    said = [(tmp_path / f"said-{r}").read_text() for r in (0, 1)]
    assert said == ["step 7: the parameters after the optimizer step are not finite on rank 1 (loss 1.5)"] * 2
