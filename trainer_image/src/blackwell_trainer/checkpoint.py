"""Distributed checkpoints that are complete or ignored (SIGTERM handling is in preemption.py)."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from blackwell_trainer.config import CheckpointConfig

log = logging.getLogger(__name__)

MARKER = "COMPLETE.json"
MARKER_VERSION = 1
EXTRA_DIR = "extra"
STEP_DIR = re.compile(r"^step-(\d+)$")
TMP_PREFIX = ".tmp-"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written or resumed; the message says why and what to do."""


class StorageFailed(CheckpointError):
    """Saves the checkpoint storage did not take (full, I/O errors): it may recover, so restarts may help."""


class SaveFailed(CheckpointError):
    """A save that failed on at least one rank; every rank raises it, so all take the same branch.

    The previous complete checkpoints are untouched and the failed temporary folder is removed.
    """

    def __init__(self, step: int, root: Path, rank: int, detail: str) -> None:
        self.step, self.root, self.failed_rank, self.detail = step, root, rank, detail
        super().__init__(f"checkpoint of step {step} under {root} not written: rank {rank}: {detail}")


def _one_line(error: BaseException) -> str:
    """The root cause on one line (DCP's CheckpointException prints a traceback per failed rank)."""
    if isinstance(error, CheckpointException) and error.failures:
        inner, _ = error.failures[min(error.failures)]
        return f"{_one_line(inner)} (in torch.distributed.checkpoint)"
    text = " ".join(str(error).split()) or type(error).__name__
    return f"{type(error).__name__}: {text}" if not isinstance(error, OSError) else text


def _origin(error: BaseException, rank: int) -> int:
    """The rank where the error happened: DCP raises one rank's error on every rank."""
    if isinstance(error, CheckpointException) and error.failures:
        return min(error.failures)
    return rank


@dataclass(frozen=True)
class CompleteCheckpoint:
    """A step folder whose completion marker is present and whose files match it."""

    step: int
    path: Path
    world_size: int
    timestamp: float


def _world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


# What a save can meet on the way to storage: a full or failing file system (OSError: ENOSPC, EIO,
# ESTALE on NFS...) or DCP's collective wrapper of such an error on any rank. Anything else is a bug.
SAVE_ERRORS: tuple[type[BaseException], ...] = (OSError, CheckpointException)


def _agree(step: int, root: Path, error: BaseException | None, key: str) -> None:
    """Raise SaveFailed on every rank if the save failed on any (naming the lowest such rank).

    A rank that raised alone would leave the others waiting in the next barrier until a timeout. The
    verdict goes through the job's c10d store and the phase ends with the same barrier as before this
    agreement existed: on the success path the process group sees exactly the collectives it saw then
    (a small all-gather as a final save's last collective let one gloo rank abort at exit,
    "terminate called without an active exception", in 3 of about 60 CPU e2e launches). `key` is
    unique to this save attempt and phase.
    """
    rank, world_size = _world()
    mine = None if error is None else (_origin(error, rank), _one_line(error))
    if world_size == 1:
        _barrier()
        if mine is not None:
            raise SaveFailed(step, root, mine[0], mine[1]) from error
        return
    store = dist.distributed_c10d._get_default_store()
    if mine is not None:
        store.set(f"{key}/rank-{rank}", json.dumps(mine))
        store.add(f"{key}/failed", 1)
    _barrier()  # every rank's verdict is in the store
    if store.add(f"{key}/failed", 0) == 0:
        return
    found = [
        json.loads(store.get(f"{key}/rank-{r}"))
        for r in range(world_size)
        if store.check([f"{key}/rank-{r}"])
    ]
    failed_rank, detail = min(found)
    raise SaveFailed(step, root, int(failed_rank), str(detail)) from error


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def _write_extra(path: Path, extra: dict[str, Any]) -> None:
    """This rank's `extra`, durable before rank 0's marker says so (DCP fsyncs its own files)."""
    with open(path, "wb") as f:
        torch.save(extra, f)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _file_sizes(folder: Path) -> dict[str, int]:
    return {
        str(f.relative_to(folder)): f.stat().st_size
        for f in sorted(folder.rglob("*"))
        if f.is_file() and f.name != MARKER
    }


def read_complete(path: Path) -> CompleteCheckpoint | None:
    """The checkpoint at `path` if it is complete, else None (no marker, or a file missing or truncated)."""
    match = STEP_DIR.match(path.name)
    if not match or not path.is_dir():
        return None
    try:
        marker = json.loads((path / MARKER).read_text())
        files: dict[str, int] = marker["files"]
        if ".metadata" not in files:
            return None
        for name, size in files.items():
            if (path / name).stat().st_size != size:
                log.warning("ignoring checkpoint %s: %s is truncated", path, name)
                return None
        return CompleteCheckpoint(
            step=int(marker["step"]),
            path=path,
            world_size=int(marker["world_size"]),
            timestamp=float(marker["timestamp"]),
        )
    except (OSError, ValueError, KeyError, TypeError):
        # No marker (a save that never finished) or a file gone: not a checkpoint to resume from.
        return None


def list_complete(root: Path) -> list[CompleteCheckpoint]:
    """Complete checkpoints under `root`, oldest first."""
    if not root.is_dir():
        return []
    found = (read_complete(p) for p in root.iterdir())
    return sorted((c for c in found if c is not None), key=lambda c: c.step)


class Checkpointer:
    """Saves and resumes model, optimizer and an `extra` dict with torch.distributed.checkpoint.

    Layout: `<path>/step-000100/` holds the DCP files (one shard per rank plus `.metadata`),
    `extra/rank-00000.pt` per rank (the caller's dict; the trainer stores the step and the data
    position only: its model has no dropout, so there is no RNG state to carry) and, written last,
    `COMPLETE.json` with the step, world size and every file's size. A save goes to
    `<path>/.tmp-step-000100/` and rank 0 renames it into place after all ranks finished writing, so
    a crash at any point leaves either the previous checkpoints alone or a folder that loading skips.
    A save that fails on any rank (a full file system, an I/O error) raises SaveFailed on every rank
    and removes its temporary folder; the previous checkpoints stay in use. `path` must be a file
    system every rank sees (FSx for Lustre, EFS, a shared volume).

    Resuming with a different world size: DCP reshards the model and optimizer (FSDP2 DTensors) to
    the new layout; the data position in `extra` is global (see blackwell_trainer.data), so it
    carries over exactly. `extra` is not resharded: every rank then takes rank 0's, and a warning
    says so (the trainer's step and data position are the same on every rank, so nothing is lost).

    Args:
        config: the plan's checkpoint section; `path` None disables saving and loading.
        rank: this process's global rank.
    """

    def __init__(self, config: CheckpointConfig, *, rank: int) -> None:
        self.config = config
        self.rank = rank
        self.root: Path | None = None
        if config.path:
            if "://" in str(config.path):
                raise CheckpointError(
                    f"checkpoint.path {config.path} is not a file system path; mount shared storage "
                    "(FSx for Lustre, EFS, a PVC) and give its path"
                )
            self.root = Path(config.path)
        self.last_saved_step: int | None = None
        # Numbers the agreements' store keys. The store lives as long as the process group (torchrun's
        # agent store is scoped per restart of the workers by torch itself): a counter is unique.
        self._phases = 0

    @property
    def enabled(self) -> bool:
        return self.root is not None

    def latest(self) -> CompleteCheckpoint | None:
        """The newest complete checkpoint, as rank 0 sees it (every rank gets rank 0's choice)."""
        if self.root is None:
            return None
        found = list_complete(self.root)
        choice: list[Any] = [str(found[-1].path) if found else None]
        if dist.is_available() and dist.is_initialized():
            # Ranks must load the same step; shared-file-system caches can lag, so rank 0 decides.
            dist.broadcast_object_list(choice, src=0)
        return read_complete(Path(choice[0])) if choice[0] else None

    def save(
        self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer | None, extra: dict[str, Any]
    ) -> bool:
        """Write a complete checkpoint of `step` (collective: every rank calls it), then prune.

        False when nothing was written: checkpointing is off, or this step is on disk already.
        SaveFailed (on every rank) when a rank could not write: the previous checkpoints stay in use.
        """
        if self.root is None or step == self.last_saved_step:
            return False  # e.g. SIGTERM right after an interval save: that step is already on disk
        started = time.monotonic()
        rank, world_size = _world()
        root = self.root
        name = f"step-{step:06d}"
        final, tmp = root / name, root / f"{TMP_PREFIX}{name}"
        # Each phase ends in an agreement (the c10d store, then the phase's barrier): an error on one
        # rank (ENOSPC on its shard, its extra file, rank 0's marker) makes every rank raise SaveFailed.
        error: BaseException | None = None
        try:
            if rank == 0:
                root.mkdir(parents=True, exist_ok=True)
                self._remove_temporaries()  # left by a crash or a failed save: frees their space first
                (tmp / EXTRA_DIR).mkdir(parents=True)
        except SAVE_ERRORS as err:
            error = err
        self._agree_or_clean(step, tmp, error)

        try:
            dcp_save(self._state(model, optimizer), checkpoint_id=str(tmp))
            _write_extra(tmp / EXTRA_DIR / f"rank-{rank:05d}.pt", extra)
        except SAVE_ERRORS as err:
            error = err
        self._agree_or_clean(step, tmp, error)  # every rank's files are written before the marker

        try:
            if rank == 0:
                marker = {
                    "version": MARKER_VERSION,
                    "step": step,
                    "world_size": world_size,
                    "timestamp": time.time(),
                    "files": _file_sizes(tmp),
                }
                with open(tmp / MARKER, "w") as f:
                    json.dump(marker, f, indent=1)
                    f.flush()
                    os.fsync(f.fileno())
                if final.exists():
                    shutil.rmtree(final)  # an incomplete folder of the same step (a loaded one is skipped)
                os.rename(tmp, final)
                _fsync_dir(root)
                self._prune()  # its own errors are only logged: the checkpoint is in place
        except SAVE_ERRORS as err:
            error = err
        self._agree_or_clean(step, tmp, error)  # nobody moves on (or exits) before it is in place
        self.last_saved_step = step
        if rank == 0:
            log.info("saved checkpoint %s in %.1f s", final, time.monotonic() - started)
        return True

    def _agree_or_clean(self, step: int, tmp: Path, error: BaseException | None) -> None:
        """Agree (collective); on a failure anywhere rank 0 removes the temporary, then all raise."""
        assert self.root is not None
        self._phases += 1  # every rank saves and agrees in the same order: the same count everywhere
        try:
            _agree(step, self.root, error, key=f"btj-checkpoint/{self._phases}")
        except SaveFailed:
            if _world()[0] == 0:
                # Every rank has stopped writing (they all reached the agreement): give the space back.
                shutil.rmtree(tmp, ignore_errors=True)
            _barrier()  # every rank raises SaveFailed here; the space is back before any reports it
            raise

    def load(self, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, Any] | None:
        """Resume from the newest complete checkpoint (collective); returns its `extra`, or None if none."""
        found = self.latest()
        if found is None:
            return None
        rank, world_size = _world()
        state = self._state(model, optimizer)
        dcp_load(state, checkpoint_id=str(found.path))
        if optimizer is None:
            set_model_state_dict(model, state["model"])
        else:
            set_state_dict(
                model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"]
            )
        # Same layout: each rank its own extra. Another layout: rank 0's (its data position is global).
        source_rank = rank if found.world_size == world_size else 0
        if found.world_size != world_size and rank == 0:
            log.warning(
                "checkpoint %s was written by %d ranks and resumes on %d: model and optimizer are "
                "resharded by DCP, and every rank takes rank 0's step and data position (global, so "
                "exact)",
                found.path,
                found.world_size,
                world_size,
            )
        extra: dict[str, Any] = torch.load(
            found.path / EXTRA_DIR / f"rank-{source_rank:05d}.pt", weights_only=True
        )
        self.last_saved_step = found.step
        if rank == 0:
            log.info("resumed from checkpoint %s", found.path)
        return extra

    @staticmethod
    def _state(model: nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
        # get_state_dict gives DTensor shards under FSDP2 (DCP reshards them on load) and creates
        # the optimizer's state when it has taken no step yet, so a fresh optimizer can be loaded.
        if optimizer is None:
            return {"model": get_model_state_dict(model)}
        model_state, optim_state = get_state_dict(model, optimizer)
        return {"model": model_state, "optimizer": optim_state}

    def _prune(self) -> None:
        """Keep the newest `keep_latest` complete checkpoints; drop older ones and stale temporaries."""
        assert self.root is not None
        try:
            for old in list_complete(self.root)[: -self.config.keep_latest]:
                shutil.rmtree(old.path, ignore_errors=True)
            self._remove_temporaries()
        except OSError as err:  # the new checkpoint is in place: the old ones go at the next save
            log.warning("could not prune checkpoints under %s: %s", self.root, err)

    def _remove_temporaries(self) -> None:
        """Remove every temporary step folder (only one save runs at a time, on rank 0's say)."""
        assert self.root is not None
        for stale in self.root.glob(f"{TMP_PREFIX}step-*"):
            shutil.rmtree(stale, ignore_errors=True)
