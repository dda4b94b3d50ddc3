"""Distributed checkpoints that are complete, verified or skipped (saved when checkpoint_manager says)."""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

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
from torch.distributed.tensor import DTensor

from blackwell_trainer.checkpoint.manifest import MARKER as MARKER  # re-exported: the layout's name
from blackwell_trainer.checkpoint.manifest import (
    MARKER_VERSION,
    FileEntry,
    Manifest,
    ManifestError,
    check_share,
    entries,
    written_by,
)
from blackwell_trainer.checkpoint.owner import CHECKPOINT_FIELD, START_FROM_FIELD, Owner, judge
from blackwell_trainer.plan.config import CheckpointConfig

log = logging.getLogger(__name__)

EXTRA_DIR = "extra"
STEP_DIR = re.compile(r"^step-(\d+)$")
TMP_PREFIX = ".tmp-"
# Written into a step folder without checksums whose resume was followed by a non-finite first step: its
# damage may be of the kind only checksums see, so later starts skip it for the one before it.
SUSPECT = "NON_FINITE_AFTER_RESUME.json"


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written or resumed; the message says why and what to do."""


class StorageFailed(CheckpointError):
    """Saves the checkpoint storage did not take (full, I/O errors): it may recover, so restarts may help."""


class NoUsableCheckpoint(CheckpointError):
    """Complete checkpoints exist but none verifies and loads: a restart would read the same files."""


class ForeignCheckpoint(CheckpointError):
    """The checkpoint to resume records another job, or this job with another model, data or global batch."""


@dataclass(frozen=True)
class Resumed:
    """The checkpoint a load resumed: its step, whether it records this job, whether it had checksums."""

    path: Path
    step: int
    own: bool
    verifiable: bool


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
    (a small all-gather as a final save's last collective made the gloo abort at exit that
    process_exit.py explains likelier: 3 of about 60 CPU e2e launches). `key` is
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
    """The checkpoint at `path` if it is complete, else None (no marker, or a file missing or truncated).

    Sizes only: the checksums are read at resume (`Checkpointer.load`), once, spread over the ranks.
    """
    match = STEP_DIR.match(path.name)
    if not match or not path.is_dir():
        return None
    try:
        manifest = Manifest.read(path)
        for name, entry in manifest.files.items():
            if (path / name).stat().st_size != entry.size:
                log.warning("ignoring checkpoint %s: %s is truncated", path, name)
                return None
        return CompleteCheckpoint(
            step=manifest.step, path=path, world_size=manifest.world_size, timestamp=manifest.timestamp
        )
    except (OSError, ManifestError):
        # No marker (a save that never finished) or a file gone: not a checkpoint to resume from.
        return None


@dataclass(frozen=True)
class Candidate:
    """A step folder with a completion record, as rank 0 found it: its manifest, or why it has none."""

    path: Path
    manifest: Manifest | None
    error: str | None


def find_candidates(root: Path) -> list[Candidate]:
    """Step folders under `root` that hold a completion record, newest first (OSError if unreadable)."""
    if not root.is_dir():
        return []
    found: list[tuple[int, Candidate]] = []
    for path in root.iterdir():
        match = STEP_DIR.match(path.name)
        if not match or not (path / MARKER).exists():
            continue  # a temporary, or a save that never finished: never a checkpoint
        if (path / SUSPECT).exists():
            found.append((int(match[1]), Candidate(path, None, _suspect_reason(path))))
            continue
        try:
            found.append((int(match[1]), Candidate(path, Manifest.read(path), None)))
        except (OSError, ManifestError) as err:
            found.append((int(match[1]), Candidate(path, None, str(err))))
    return [c for _, c in sorted(found, key=lambda pair: -pair[0])]


def _suspect_reason(path: Path) -> str:
    try:
        return str(json.loads((path / SUSPECT).read_text())["reason"])
    except (OSError, ValueError, KeyError, TypeError):
        return f"{SUSPECT} says the first step after resuming it was not finite"


class SkipCallback(Protocol):
    def __call__(self, path: Path, reason: str) -> None: ...


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
    `COMPLETE.json` with the step, world size and every file's size, CRC32 and writing rank (each rank
    checksums the files it wrote; rank 0 adds `.metadata`). A save goes to
    `<path>/.tmp-step-000100/` and rank 0 renames it into place after all ranks finished writing, so
    a crash at any point leaves either the previous checkpoints alone or a folder that loading skips.
    A save that fails on any rank (a full file system, an I/O error) raises SaveFailed on every rank
    and removes its temporary folder; the previous checkpoints stay in use. `path` must be a file
    system every rank sees (FSx for Lustre, EFS, a shared volume).

    Resuming with a different world size: DCP reshards the model and optimizer (FSDP2 DTensors) to
    the new layout; the data position in `extra` is global (see blackwell_trainer.data.tokens), so it
    carries over exactly. `extra` is not resharded: every rank then takes rank 0's, and a warning
    says so (the trainer's step and data position are the same on every rank, so nothing is lost).

    Resuming verifies before it trusts: newest first, every file's size and checksum (each file
    checked by one rank), then the load itself; a checkpoint that fails either is skipped with one
    line and the next older one is tried, the same on every rank. None left: NoUsableCheckpoint.

    Pruning keeps the newest `keep_latest` checkpoints and, beside them, the newest one that was
    followed by a finite step (`confirm_finite`): a checkpoint is only known to be good once the
    step after it produced a finite loss, so it never replaces the last one known to be good.

    Args:
        config: the plan's checkpoint section; `path` None disables saving and loading.
        rank: this process's global rank.
    """

    def __init__(self, config: CheckpointConfig, *, rank: int, owner: Owner | None = None) -> None:
        self.config = config
        self.rank = rank
        self.owner = owner  # recorded in every checkpoint; a resume refuses another's (checkpoint_owner)
        self.resumed: Resumed | None = None
        self.root: Path | None = None
        if config.path:
            if "://" in str(config.path):
                raise CheckpointError(
                    f"checkpoint.path {config.path} is not a file system path; mount shared storage "
                    "(FSx for Lustre, EFS, a PVC) and give its path"
                )
            self.root = Path(config.path)
        self.last_saved_step: int | None = None
        # Every step up to this one ended with a finite loss, gradient norm and parameters.
        self.finite_through: int | None = None
        self._prune_after: int | None = None  # the newest save, until a finite step follows it
        # Number the agreements' store keys. The store lives as long as the process group (torchrun's
        # agent store is scoped per restart of the workers by torch itself): a counter is unique.
        self._phases = 0
        self._saves = 0

    @property
    def enabled(self) -> bool:
        return self.root is not None

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

        self._saves += 1
        files_key = f"btj-checkpoint-files/{self._saves}"  # the same count on every rank, as _phases
        mine: dict[str, FileEntry] = {}
        try:
            dcp_save(self._state(model, optimizer), checkpoint_id=str(tmp))
            extra_name = f"{EXTRA_DIR}/rank-{rank:05d}.pt"
            _write_extra(tmp / extra_name, extra)
            # Each rank checksums what it wrote (in parallel, from its page cache) for rank 0's marker.
            mine = entries(tmp, [*written_by(tmp, rank), extra_name], rank)
            _publish(files_key, rank, mine)
        except SAVE_ERRORS as err:
            error = err
        self._agree_or_clean(step, tmp, error)  # every rank's files are written before the marker

        try:
            if rank == 0:
                marker = Manifest(
                    version=MARKER_VERSION,
                    step=step,
                    world_size=world_size,
                    timestamp=time.time(),
                    files=_all_entries(tmp, files_key, world_size, mine),
                    owner=None if self.owner is None else self.owner.to_json(),
                )
                with open(tmp / MARKER, "w") as f:
                    json.dump(marker.to_json(), f, indent=1)
                    f.flush()
                    os.fsync(f.fileno())
                if final.exists():
                    shutil.rmtree(final)  # an incomplete folder of the same step (a loaded one is skipped)
                os.rename(tmp, final)
                _fsync_dir(root)
                self._prune(step)  # its own errors are only logged: the checkpoint is in place
        except SAVE_ERRORS as err:
            error = err
        self._agree_or_clean(step, tmp, error)  # nobody moves on (or exits) before it is in place
        self.last_saved_step = step
        self._prune_after = step
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

    def load(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None,
        on_skip: SkipCallback | None = None,
    ) -> dict[str, Any] | None:
        """Resume from the newest checkpoint that verifies and loads (collective); its `extra`, or None.

        None when there is no complete checkpoint (a fresh start). Each one that fails is skipped with
        one line (rank 0) and `on_skip(path, reason)` (every rank); NoUsableCheckpoint when all fail.
        ForeignCheckpoint when the newest complete one records another job (checkpoint_owner.judge).
        """
        if self.root is None:
            return None
        found = self._newest(self.root, CHECKPOINT_FIELD, model, optimizer, on_skip)
        if found is None:
            return None
        candidate, extra, own = found
        assert candidate.manifest is not None
        self.resumed = Resumed(candidate.path, candidate.manifest.step, own, candidate.manifest.verifiable)
        self.last_saved_step = candidate.manifest.step
        self._prune_after = candidate.manifest.step
        return extra

    def load_weights(self, model: nn.Module, on_skip: SkipCallback | None = None) -> Path:
        """Load the model weights of the newest good checkpoint under checkpoint.startFrom (collective).

        Another job's checkpoints, read only: whose they are is not asked (the spec named them), nothing
        is pruned or recorded as this job's. CheckpointError when the folder holds none that loads.
        """
        root = Path(str(self.config.start_from))
        found = self._newest(root, START_FROM_FIELD, model, None, on_skip)
        if found is None:
            raise CheckpointError(
                f"{START_FROM_FIELD} {root} holds no complete checkpoint; point it at the "
                "checkpoint.path folder of the job whose weights this one starts from"
            )
        return found[0].path

    def _newest(
        self,
        root: Path,
        field: str,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None,
        on_skip: SkipCallback | None,
    ) -> tuple[Candidate, dict[str, Any], bool] | None:
        """The newest candidate under `root` that verifies and loads into model (and optimizer), with its
        extra and whether it records this job (checkpoint.path: ForeignCheckpoint when it records another);
        None when `root` holds no candidate."""
        candidates = self._candidates(root, field)
        failed: list[str] = []
        for index, candidate in enumerate(candidates):
            own = self._judge(candidate) if field == CHECKPOINT_FIELD else False
            reason = self._verify(candidate)
            extra = None
            if reason is None:
                extra, reason = self._try_load(candidate, model, optimizer)
            if reason is None and extra is not None:
                if failed and self.rank == 0:
                    log.warning("resuming from %s, older than the %d skipped", candidate.path, len(failed))
                return candidate, extra, own
            failed.append(f"{candidate.path.name}: {reason}")
            if self.rank == 0:
                then = "trying the next older one" if index + 1 < len(candidates) else "none older is left"
                log.error("skipping checkpoint %s: %s; %s", candidate.path, reason, then)
            if on_skip is not None:
                on_skip(candidate.path, str(reason))
        if failed:
            raise NoUsableCheckpoint(
                f"no checkpoint under {field} {root} can be resumed: "
                f"{'; '.join(failed)}. Restore a good copy, or move these step folders aside to start "
                "from step 0"
            )
        return None

    def _judge(self, candidate: Candidate) -> bool:
        """Whether `candidate` records this job; ForeignCheckpoint when it is another's (every rank has rank
        0's candidate, so every rank raises alike). A candidate without a readable record is left to
        `_verify`, which skips it."""
        if self.owner is None or candidate.manifest is None:
            return False
        recorded = None
        if candidate.manifest.owner is not None:
            try:
                recorded = Owner.from_json(candidate.manifest.owner)
            except (KeyError, TypeError, ValueError) as err:
                raise ForeignCheckpoint(
                    f"{CHECKPOINT_FIELD}: checkpoint {candidate.path} has an unreadable owner record "
                    f"({type(err).__name__}: {err}); give this job a checkpoint.path of its own"
                ) from None
        verdict = judge(recorded, self.owner, str(candidate.path))
        if verdict.refusal is not None:
            raise ForeignCheckpoint(verdict.refusal)
        if verdict.note is not None and self.rank == 0:
            log.warning("%s", verdict.note)
        return verdict.own

    def _candidates(self, root: Path, field: str) -> list[Candidate]:
        """Rank 0's list of step folders with a completion record (ranks must try the same ones)."""
        payload: list[Any] = [None]
        if self.rank == 0:
            try:
                payload = [find_candidates(root)]
            except OSError as err:
                payload = [f"cannot list {field} {root}: {err}"]
        if dist.is_available() and dist.is_initialized():
            # Shared-file-system caches can lag between nodes: rank 0's view decides for all.
            dist.broadcast_object_list(payload, src=0)
        if isinstance(payload[0], str):
            raise StorageFailed(payload[0])  # the storage may come back: not a permanent error
        found: list[Candidate] = payload[0]
        return found

    def _verify(self, candidate: Candidate) -> str | None:
        """Why `candidate` cannot be trusted (size or checksum, on any rank), or None (collective)."""
        if candidate.manifest is None:
            return candidate.error  # every rank has rank 0's candidate: the same verdict, no collective
        rank, world_size = _world()
        started = time.monotonic()
        reason = _first_problem(check_share(candidate.path, candidate.manifest, rank, world_size))
        if reason is None and rank == 0:
            if not candidate.manifest.verifiable:
                log.warning(
                    "checkpoint %s has no checksums (written by a trainer before them): only its file "
                    "sizes are checked",
                    candidate.path,
                )
            log.info("verified checkpoint %s in %.1f s", candidate.path, time.monotonic() - started)
        return reason

    def _try_load(
        self, candidate: Candidate, model: nn.Module, optimizer: torch.optim.Optimizer | None
    ) -> tuple[dict[str, Any] | None, str | None]:
        """Load `candidate` into model and optimizer (collective): (extra, None) or (None, why not).

        A failure part-way leaves the model half loaded; the next candidate's load writes every tensor
        again, and a run that finds none stops.
        """
        assert candidate.manifest is not None
        rank, world_size = _world()
        written_by_ranks = candidate.manifest.world_size
        extra: dict[str, Any] | None = None
        reason: str | None = None
        try:
            state = self._state(model, optimizer)
            dcp_load(state, checkpoint_id=str(candidate.path))
            # Without checksums, damage of the same size loads silently; what becomes NaN or Inf would
            # only show as a non-finite first step, and each restart would resume it again.
            bad = None if candidate.manifest.verifiable else non_finite_tensor(state)
            if bad is not None:
                raise ValueError(
                    f"has no checksums and its {bad} holds NaN or Inf: damaged (a trainer writes only "
                    "finite state)"
                )
            if optimizer is None:
                set_model_state_dict(model, state["model"])
            else:
                set_state_dict(
                    model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"]
                )
            # Same layout: each rank its own extra. Another layout: rank 0's (its data position is global).
            source_rank = rank if written_by_ranks == world_size else 0
            extra = torch.load(candidate.path / EXTRA_DIR / f"rank-{source_rank:05d}.pt", weights_only=True)
            if not isinstance(extra, dict):
                raise TypeError(f"{EXTRA_DIR}/rank-{source_rank:05d}.pt holds a {type(extra).__name__}")
        except (torch.OutOfMemoryError, dist.DistError):
            raise  # not the checkpoint's fault: a restart may well succeed
        except (Exception, CheckpointException) as err:  # what an unreadable file raises in DCP or torch
            reason = f"cannot be loaded: {_one_line(err)}"
        reason = _first_problem([] if reason is None else [reason])
        if reason is not None:
            return None, reason
        if written_by_ranks != world_size and rank == 0 and optimizer is not None:
            log.warning(
                "checkpoint %s was written by %d ranks and resumes on %d: model and optimizer are "
                "resharded by DCP, and every rank takes rank 0's step and data position (global, so "
                "exact)",
                candidate.path,
                written_by_ranks,
                world_size,
            )
        if rank == 0:
            log.info(
                "%s checkpoint %s",
                "resumed from" if optimizer is not None else "loaded the weights of",
                candidate.path,
            )
        return extra, None

    def mark_suspect(self, step: int) -> str | None:
        """After a non-finite `step`: if it was the first after resuming a checkpoint without checksums,
        mark that checkpoint so that later starts skip it for the one before it (rank 0 writes; every rank
        returns the same line for the error). None when it does not apply.

        Damage of the right size loads silently from such a checkpoint; when what it turns into is finite
        (a huge weight, a negative second moment) only the first step shows it, and every restart would
        resume the same checkpoint into the same failure. A checkpoint with checksums is known undamaged:
        its non-finite first step is the run's own (data, learning rate), and a restart retries it.
        """
        resumed = self.resumed
        if resumed is None or resumed.verifiable or step != resumed.step + 1:
            return None
        reason = (
            f"step {step}, the first after resuming it, was not finite, and it has no checksums to tell "
            "damage from a loss spike"
        )
        if self.rank == 0:
            try:
                with open(resumed.path / SUSPECT, "w") as f:
                    json.dump({"step": step, "reason": reason}, f)
                    f.flush()
                    os.fsync(f.fileno())
            except OSError as err:
                log.error("could not mark checkpoint %s as suspect: %s", resumed.path, err)
        return (
            f"checkpoint {resumed.path.name} is marked so that the next start skips it for the one before it"
        )

    def confirm_finite(self, step: int) -> None:
        """Record that `step` ended finite; the checkpoint before it is now known good, so prune."""
        self.finite_through = step
        if self._prune_after is not None and step > self._prune_after:
            if self.rank == 0 and self.root is not None:
                self._prune(self._prune_after)
            self._prune_after = None

    @staticmethod
    def _state(model: nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
        # get_state_dict gives DTensor shards under FSDP2 (DCP reshards them on load) and creates
        # the optimizer's state when it has taken no step yet, so a fresh optimizer can be loaded.
        if optimizer is None:
            return {"model": get_model_state_dict(model)}
        model_state, optim_state = get_state_dict(model, optimizer)
        return {"model": model_state, "optimizer": optim_state}

    def _prune(self, newest: int) -> None:
        """Keep the newest `keep_latest` checkpoints up to step `newest` and the newest known good one.

        Known good: followed by a finite step (`finite_through`). Checkpoints after `newest` are left
        alone: they are from before a resume that skipped them, and this run overwrites each when it
        reaches its step.
        """
        assert self.root is not None
        try:
            found = [c for c in list_complete(self.root) if c.step <= newest]
            keep = {c.step for c in found[-self.config.keep_latest :]}
            good = [c.step for c in found if self.finite_through is not None and c.step < self.finite_through]
            if good:
                keep.add(good[-1])
            for old in found:
                if old.step not in keep:
                    shutil.rmtree(old.path, ignore_errors=True)
            self._remove_temporaries()
        except OSError as err:  # the new checkpoint is in place: the old ones go at the next save
            log.warning("could not prune checkpoints under %s: %s", self.root, err)

    def _remove_temporaries(self) -> None:
        """Remove every temporary step folder (only one save runs at a time, on rank 0's say)."""
        assert self.root is not None
        for stale in self.root.glob(f"{TMP_PREFIX}step-*"):
            shutil.rmtree(stale, ignore_errors=True)


def _publish(key: str, rank: int, files: dict[str, FileEntry]) -> None:
    """Hand this rank's file entries to rank 0 through the job's c10d store (no process-group collective)."""
    if _world()[1] > 1:
        store = dist.distributed_c10d._get_default_store()
        store.set(f"{key}/rank-{rank}", json.dumps({n: e.to_json() for n, e in files.items()}))


def _all_entries(folder: Path, key: str, world_size: int, mine: dict[str, FileEntry]) -> dict[str, FileEntry]:
    """Rank 0: every rank's entries, plus its own checksum of each file no rank claimed (`.metadata`)."""
    claimed = dict(mine)
    if world_size > 1:
        store = dist.distributed_c10d._get_default_store()
        for r in range(1, world_size):
            raw = json.loads(store.get(f"{key}/rank-{r}"))
            claimed.update({name: FileEntry.from_json(value) for name, value in raw.items()})
        for r in range(world_size):
            store.delete_key(f"{key}/rank-{r}")  # the store lives as long as the job: keep it small
    sizes = _file_sizes(folder)
    for name, entry in claimed.items():
        if sizes.get(name) != entry.size:
            # A shared file system that shows rank 0 another size than its writer saw: not complete.
            raise OSError(errno.EIO, f"{name} is {sizes.get(name)} bytes here, {entry.size} as written")
    claimed.update(entries(folder, [n for n in sizes if n not in claimed], rank=0))
    return claimed


def non_finite_tensor(state: Any, name: str = "") -> str | None:
    """The dotted name of the first floating-point tensor in a (nested) state dict holding a NaN or an
    Inf, this rank's shard of a DTensor; None when every one is finite."""
    if isinstance(state, dict):
        for key, value in state.items():
            found = non_finite_tensor(value, f"{name}.{key}" if name else str(key))
            if found is not None:
                return found
    elif isinstance(state, list | tuple):
        for index, value in enumerate(state):
            found = non_finite_tensor(value, f"{name}.{index}")
            if found is not None:
                return found
    elif isinstance(state, torch.Tensor) and state.is_floating_point():
        local = state.to_local() if isinstance(state, DTensor) else state
        if not bool(torch.isfinite(local).all()):
            return name
    return None


def _first_problem(mine: list[str]) -> str | None:
    """The lowest rank's first problem, with how many more there are (collective: every rank agrees)."""
    everyone: list[Any] = [mine]
    world_size = _world()[1]
    if world_size > 1:
        everyone = [None] * world_size
        dist.all_gather_object(everyone, mine)
    problems = [(r, p) for r, found in enumerate(everyone) for p in found]
    if not problems:
        return None
    first_rank, first = problems[0]
    where = f"rank {first_rank}: " if world_size > 1 else ""
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return f"{where}{first}{more}"
