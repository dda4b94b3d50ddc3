"""The training loop's checkpoints: what they hold (model, optimizer, the loop's state), when they are saved,
what a save the storage refuses means, and the resume at start."""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable
from typing import Protocol

import torch
from torch import nn
from torch.distributed.checkpoint.stateful import Stateful

from blackwell_trainer.checkpoint.owner import CHECKPOINT_FIELD, Owner
from blackwell_trainer.checkpoint.store import Checkpointer, CheckpointError, SaveFailed, StorageFailed
from blackwell_trainer.plan.config import CheckpointConfig

# The manager's lines are the training loop's: they keep its logger name, which log queries match.
log = logging.getLogger("blackwell_trainer")

# A failed interval save (full or failing checkpoint storage) is logged and counted and training goes
# on: the storage may recover (another job frees space, a Lustre OST drains below its threshold) and
# the next interval tries again. Three in a row means it is not recovering: stop (exit 2) rather than
# train on for hours or days whose work a crash or preemption would lose, and say why.
MAX_FAILED_SAVES_IN_A_ROW = 3


class NothingToTrain(CheckpointError):
    """The checkpoint to resume leaves no step to train, and it is not this job's own finished run."""


class CheckpointRecorder(Protocol):
    """Where the manager reports saves and skipped checkpoints (the trainer's metrics)."""

    def record_checkpoint(self, timestamp: float) -> None: ...

    def record_checkpoint_failure(self) -> None: ...

    def record_checkpoint_skipped(self) -> None: ...


class CheckpointManager:
    """The loop's checkpoints: it holds what they save and decides when (every rank calls it alike).

    A checkpoint holds the model, the optimizer and `state` (the loop's own, through its
    `state_dict()`: the step and the data position, stored as the Checkpointer's `extra`). Every
    `interval_steps` an interval save: one that fails is logged, counted and tried again at the next
    interval, and MAX_FAILED_SAVES_IN_A_ROW in a row stop the run (StorageFailed). The final save (at
    `steps`) and the preemption save have no next one: their failure stops the run at once. The saves
    and the resume are collective.

    Args:
        config: the plan's checkpoint section (CheckpointError if its path is not a file system path).
        rank: this process's global rank.
        model, optimizer: what is trained (the optimizer None: the model alone).
        state: the rest of what a resume needs, saved beside them and handed back by `resume()`.
        steps: the plan's last step.
        recorder: told of each checkpoint written, each interval save that failed, each one skipped.
        owner: this job, recorded in each checkpoint; a resume refuses another job's (checkpoint_owner).
    """

    def __init__(
        self,
        config: CheckpointConfig,
        *,
        rank: int,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None,
        state: Stateful,
        steps: int,
        recorder: CheckpointRecorder,
        owner: Owner,
        before_save: Callable[[], None] | None = None,
    ) -> None:
        self.checkpointer = Checkpointer(config, rank=rank, owner=owner)
        # Run before every save (collective): the trainer's check that no non-finite state is written.
        self.before_save = before_save
        self.model, self.optimizer, self.state = model, optimizer, state
        self.steps = steps
        self.interval = config.interval_steps
        self.recorder = recorder
        self.failed_in_a_row = 0

    @property
    def last_saved_step(self) -> int | None:
        """The step of the newest checkpoint this process wrote or resumed from (None: none yet)."""
        return self.checkpointer.last_saved_step

    def resume(self) -> bool:
        """Load the newest checkpoint that verifies and loads into what it holds (collective).

        False on a fresh start (no complete checkpoint); NoUsableCheckpoint when none can be resumed,
        ForeignCheckpoint when it is another job's, NothingToTrain when it leaves nothing to train and is
        not this job's own finished run.
        """
        extra = self.checkpointer.load(
            self.model, self.optimizer, on_skip=lambda path, reason: self.recorder.record_checkpoint_skipped()
        )
        if extra is None:
            return False
        self.state.load_state_dict(extra)
        self._check_steps_left()
        return True

    def _check_steps_left(self) -> None:
        """A run never ends in success without training the steps the plan asks for: resuming at the last
        step is done only when the checkpoint records this job (its own finished run, restarted to redo the
        export, say); past it, or at it without that record, NothingToTrain."""
        resumed = self.checkpointer.resumed
        if resumed is None or resumed.step < self.steps:
            return
        where = f"{CHECKPOINT_FIELD} {self.checkpointer.config.path}: {resumed.path.name}"
        if resumed.step > self.steps:
            raise NothingToTrain(
                f"{where} is at step {resumed.step}, past spec.training.steps {self.steps}: this job would "
                f"end having trained none of its {self.steps} steps, with weights trained further than it "
                f"asks. Fix: set spec.training.steps to more than {resumed.step} to train on, or give the "
                "job a new checkpoint.path to train from the start"
            )
        if not resumed.own:
            raise NothingToTrain(
                f"{where} is at the last step ({self.steps}) but records no owner (written before "
                "ownership records), so it cannot be told from another job's finished run, and this job "
                "would report success having trained nothing. Fix: if it is this job's finished run, its "
                "weights are there and nothing is left to do; to train, give the job a new checkpoint.path "
                "(with checkpoint.startFrom to start from these weights)"
            )
        log.info(
            "checkpoint %s is this job's own finished run (step %d of %d): nothing is left to train",
            resumed.path,
            resumed.step,
            self.steps,
        )

    def start_from(self) -> None:
        """Load the model weights of checkpoint.startFrom's newest good checkpoint (collective): step 0."""
        path = self.checkpointer.load_weights(
            self.model, on_skip=lambda path, reason: self.recorder.record_checkpoint_skipped()
        )
        log.info("starting a new run at step 0 from the weights of %s (checkpoint.startFrom)", path)

    def mark_suspect(self, step: int) -> str | None:
        """After a non-finite `step`: what a restart resumes from, when the resumed checkpoint is now
        skipped (Checkpointer.mark_suspect); None when it is not."""
        return self.checkpointer.mark_suspect(step)

    def confirm_finite(self, step: int) -> None:
        """`step` ended finite: the checkpoint before it is known good, so pruning may go on."""
        self.checkpointer.confirm_finite(step)

    def keeps_state_at(self, step: int) -> bool:
        """Whether `step`'s state is written after it: the final step (its checkpoint, an export) or an
        interval save."""
        return step == self.steps or (self.checkpointer.enabled and step % self.interval == 0)

    def after_step(self, step: int) -> None:
        """Save if `step` is the final one or on the interval (collective)."""
        if step == self.steps:
            try:
                self._save(step)
            except SaveFailed as err:
                raise StorageFailed(
                    f"final {self.describe(err)}: free space there and rerun "
                    "(it resumes from the newest complete checkpoint and redoes the steps since)"
                ) from None
        elif step % self.interval == 0:
            try:
                self._save(step)
                self.failed_in_a_row = 0
            except SaveFailed as err:  # raised on every rank alike: all take this branch
                self._interval_failed(step, err)

    def at_preemption(self, step: int, started_at: int) -> None:
        """The agreed stop (collective): save the steps taken since the last checkpoint, if any."""
        if step == started_at:
            # Nothing trained in this process: the state is the resumed checkpoint's (or the initial one).
            log.info(
                "preempted before the first step (at step %d): nothing new to checkpoint, exiting 0", step
            )
            return
        if not self.checkpointer.enabled:
            log.info("preempted at step %d: checkpointing is off, exiting 0", step)
            return
        try:
            self._save(step)  # a no-op if the interval save wrote it
        except SaveFailed as err:
            raise StorageFailed(
                f"preempted at step {step}: {self.describe(err)}: the next start resumes from the newest "
                "complete checkpoint; free space there"
            ) from None
        log.info("preempted: checkpoint at step %d written, exiting 0", step)

    def describe(self, err: SaveFailed) -> str:
        """One line: which step, spec.training.checkpoint.path and its free space, the error, what is kept."""
        kept = self.checkpointer.last_saved_step
        newest = f"the newest complete checkpoint is step {kept}" if kept is not None else "no checkpoint yet"
        path = self.checkpointer.config.path
        return (
            f"checkpoint of step {err.step} not written to spec.training.checkpoint.path {path} "
            f"({free_space(str(path))}): rank {err.failed_rank}: {err.detail}; {newest}"
        )

    def _save(self, step: int) -> None:
        if self.before_save is not None:
            self.before_save()
        # The state is read when a save happens, not at every step (the data position is small, but
        # a step that does not save should not pay for it).
        if self.checkpointer.save(step, self.model, self.optimizer, self.state.state_dict()):
            self.recorder.record_checkpoint(time.time())

    def _interval_failed(self, step: int, err: SaveFailed) -> None:
        self.failed_in_a_row += 1
        self.recorder.record_checkpoint_failure()
        line = self.describe(err)
        if self.failed_in_a_row >= MAX_FAILED_SAVES_IN_A_ROW:
            raise StorageFailed(
                f"{self.failed_in_a_row} interval checkpoints in a row not written, the last {line}; "
                "stopping rather than training on without checkpoints: free space there or fix the "
                "storage, then rerun"
            ) from None
        if self.checkpointer.rank == 0:
            log.error(
                "%s; training goes on and tries again at step %d (the run stops after %d failed saves in a "
                "row, this is %d)",
                line,
                min(step + self.interval, self.steps),
                MAX_FAILED_SAVES_IN_A_ROW,
                self.failed_in_a_row,
            )


def free_space(path: str) -> str:
    """'X free of Y' for the file system holding `path` (or its nearest existing parent), or 'unknown'."""
    where = os.path.abspath(path)
    while not os.path.exists(where) and os.path.dirname(where) != where:
        where = os.path.dirname(where)
    try:
        usage = shutil.disk_usage(where)
    except OSError:
        return "free space unknown"
    return f"{_bytes(usage.free)} free of {_bytes(usage.total)}"


def _bytes(n: int) -> str:
    size, unit = float(n), "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            break
        size /= 1024
    return f"{size:.0f} B" if unit == "B" else f"{size:.1f} {unit}"
