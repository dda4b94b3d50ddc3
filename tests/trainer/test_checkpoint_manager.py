"""CheckpointManager: it holds what it saves, saves on the interval and at the end, and resumes into it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from blackwell_trainer.checkpoint.manager import CheckpointManager
from blackwell_trainer.checkpoint.owner import Owner
from blackwell_trainer.checkpoint.store import list_complete
from blackwell_trainer.plan.config import CheckpointConfig, JobIdentity
from tests.trainer.test_checkpoint import make, params, train_step

# Single-process on purpose: DCP then warns that torch.distributed is uninitialised.
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


class Counter:
    """The loop's state as the manager sees it: a step and a data position."""

    def __init__(self) -> None:
        self.step, self.consumed = 0, 0

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "data": {"consumed": self.consumed}}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.step, self.consumed = int(state_dict["step"]), int(state_dict["data"]["consumed"])


class Recorded:
    """What the manager reports (the trainer's metrics implement the same three calls)."""

    def __init__(self) -> None:
        self.saved: list[float] = []
        self.failures = self.skipped = 0

    def record_checkpoint(self, timestamp: float) -> None:
        self.saved.append(timestamp)

    def record_checkpoint_failure(self) -> None:
        self.failures += 1

    def record_checkpoint_skipped(self) -> None:
        self.skipped += 1


OWNER = Owner(JobIdentity(namespace="team", name="job", uid="u1"), "model", "data", 4096)


def manager(root: Path, seed: int, recorder: Recorded) -> tuple[CheckpointManager, nn.Module, Counter]:
    model, optimizer = make(seed)
    state = Counter()
    config = CheckpointConfig(path=str(root), interval_steps=2, keep_latest=5)
    built = CheckpointManager(
        config, rank=0, model=model, optimizer=optimizer, state=state, steps=5, recorder=recorder, owner=OWNER
    )
    return built, model, state


def test_it_saves_what_it_holds_on_the_interval_and_at_the_end_and_resumes_into_it(tmp_path: Path) -> None:
    recorder = Recorded()
    checkpoints, model, state = manager(tmp_path, 0, recorder)
    assert not checkpoints.resume()  # nothing there: a fresh start, the state untouched
    assert state.step == 0 and checkpoints.optimizer is not None
    for step in range(1, 6):
        train_step(model, checkpoints.optimizer)
        state.step, state.consumed = step, 8 * step
        checkpoints.confirm_finite(step)
        checkpoints.after_step(step)  # the step only: the model, optimizer and state are its own
    assert [c.step for c in list_complete(tmp_path)] == [2, 4, 5]
    assert len(recorder.saved) == 3 and checkpoints.last_saved_step == 5

    fresh, fresh_model, fresh_state = manager(tmp_path, 1, Recorded())
    assert fresh.resume()
    assert (fresh_state.step, fresh_state.consumed) == (5, 40)
    for a, b in zip(params(model), params(fresh_model), strict=True):
        assert torch.equal(a, b)


def test_a_preemption_before_any_new_step_saves_nothing(tmp_path: Path) -> None:
    recorder = Recorded()
    checkpoints, _, state = manager(tmp_path, 0, recorder)
    checkpoints.at_preemption(state.step, started_at=state.step)
    assert list_complete(tmp_path) == [] and recorder.saved == []
    state.step = 3  # three steps since the start: the preemption save writes them
    checkpoints.at_preemption(3, started_at=0)
    assert [c.step for c in list_complete(tmp_path)] == [3] and len(recorder.saved) == 1
