"""Checkpointer: round trip, only complete checkpoints resumed, pruning (SIGTERM: test_preemption.py)."""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException

from blackwell_trainer.checkpoint.store import (
    MARKER,
    Checkpointer,
    CheckpointError,
    SaveFailed,
    list_complete,
)
from blackwell_trainer.plan.config import CheckpointConfig

# Single-process on purpose: DCP then warns that torch.distributed is uninitialised.
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


def make(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    loss = model(torch.ones(2, 8)).square().mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def params(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def checkpointer(root: Path, keep: int = 5) -> Checkpointer:
    return Checkpointer(CheckpointConfig(path=str(root), interval_steps=1, keep_latest=keep), rank=0)


def test_round_trip_restores_model_optimizer_and_extra(tmp_path: Path) -> None:
    model, optimizer = make(0)
    train_step(model, optimizer)
    extra: dict[str, Any] = {"step": 3, "data": {"consumed": 24}, "rng": torch.get_rng_state()}
    checkpointer(tmp_path).save(3, model, optimizer, extra)

    fresh, fresh_optimizer = make(1)
    loaded = checkpointer(tmp_path).load(fresh, fresh_optimizer)
    assert loaded is not None and loaded["step"] == 3 and loaded["data"] == extra["data"]
    assert torch.equal(loaded["rng"], extra["rng"])
    for a, b in zip(params(model), params(fresh), strict=True):
        assert torch.equal(a, b)
    # The optimizer moments came back too: one more identical step keeps the two models identical.
    train_step(model, optimizer)
    train_step(fresh, fresh_optimizer)
    for a, b in zip(params(model), params(fresh), strict=True):
        assert torch.equal(a, b)


def test_no_checkpoint_and_disabled_checkpointing_load_nothing(tmp_path: Path) -> None:
    model, optimizer = make(0)
    assert checkpointer(tmp_path / "empty").load(model, optimizer) is None
    off = Checkpointer(CheckpointConfig(path=None), rank=0)
    off.save(1, model, optimizer, {"step": 1})
    assert off.load(model, optimizer) is None


def save_steps(root: Path, steps: list[int], keep: int = 5) -> nn.Module:
    model, optimizer = make(0)
    ckpt = checkpointer(root, keep)
    for step in steps:
        train_step(model, optimizer)
        ckpt.save(step, model, optimizer, {"step": step})
    return model


def test_layout_is_step_folders_with_a_marker(tmp_path: Path) -> None:
    save_steps(tmp_path, [100])
    folder = tmp_path / "step-000100"
    marker = json.loads((folder / MARKER).read_text())
    assert marker["step"] == 100 and marker["world_size"] == 1
    assert ".metadata" in marker["files"] and "extra/rank-00000.pt" in marker["files"]
    assert [p.name for p in tmp_path.iterdir()] == ["step-000100"]  # no temporary left behind


def test_a_checkpoint_without_its_marker_is_ignored(tmp_path: Path) -> None:
    save_steps(tmp_path, [1, 2])
    (tmp_path / "step-000002" / MARKER).unlink()  # the crash came before the marker
    model, optimizer = make(5)
    loaded = checkpointer(tmp_path).load(model, optimizer)
    assert loaded is not None and loaded["step"] == 1


def test_a_truncated_shard_is_ignored(tmp_path: Path) -> None:
    save_steps(tmp_path, [1, 2])
    shard = next((tmp_path / "step-000002").glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:10])  # e.g. ENOSPC on one storage target, or a partial copy
    model, optimizer = make(5)
    loaded = checkpointer(tmp_path).load(model, optimizer)
    assert loaded is not None and loaded["step"] == 1


def test_an_unfinished_temporary_folder_is_ignored(tmp_path: Path) -> None:
    save_steps(tmp_path, [1])
    (tmp_path / ".tmp-step-000002").mkdir()
    (tmp_path / ".tmp-step-000002" / "__0_0.distcp").write_bytes(b"partial")
    assert [c.step for c in list_complete(tmp_path)] == [1]


def test_a_failed_save_leaves_the_previous_checkpoint_in_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, optimizer = make(0)
    ckpt = checkpointer(tmp_path)
    ckpt.save(1, model, optimizer, {"step": 1})

    def disk_full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", disk_full)  # the storage fills up half-way through step 2
    # DCP's own writes hit it first and wrap it (CheckpointException, collective over the ranks);
    # the Checkpointer turns that into one SaveFailed per rank, with the cause on one line.
    with pytest.raises(SaveFailed, match=r"step 2 .* rank 0: \[Errno 28\] No space left on device") as failed:
        ckpt.save(2, model, optimizer, {"step": 2})
    assert isinstance(failed.value.__cause__, CheckpointException) and "\n" not in str(failed.value)
    monkeypatch.undo()
    assert [c.step for c in list_complete(tmp_path)] == [1]
    assert [p.name for p in tmp_path.iterdir()] == ["step-000001"]  # the failed temporary is gone
    loaded = checkpointer(tmp_path).load(*make(3))
    assert loaded is not None and loaded["step"] == 1
    ckpt.save(3, model, optimizer, {"step": 3})  # the next save clears the failed temporary
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000001", "step-000003"]


def test_keep_latest_prunes_older_checkpoints(tmp_path: Path) -> None:
    save_steps(tmp_path, [1, 2, 3, 4], keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000003", "step-000004"]


def test_saving_the_same_step_twice_writes_once(tmp_path: Path) -> None:
    model, optimizer = make(0)
    ckpt = checkpointer(tmp_path)
    ckpt.save(7, model, optimizer, {"step": 7})
    stamp = (tmp_path / "step-000007" / MARKER).stat().st_mtime_ns
    ckpt.save(7, model, optimizer, {"step": 7})  # SIGTERM right after an interval save
    assert (tmp_path / "step-000007" / MARKER).stat().st_mtime_ns == stamp


def test_object_storage_paths_are_refused() -> None:
    with pytest.raises(CheckpointError, match=r"checkpoint\.path"):
        Checkpointer(CheckpointConfig(path="s3://bucket/ckpt"), rank=0)
