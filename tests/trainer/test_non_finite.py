"""A step whose loss, gradient norm or parameters are not finite stops the run before it saves: no NaN
checkpoint is written, none known to be good is pruned, and the exit code and one line say which step,
which value and which rank."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from blackwell_trainer.checkpoint.store import list_complete
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
