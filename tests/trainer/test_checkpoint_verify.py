"""Checkpoint checksums: every kind of damage is caught at resume and the newest good checkpoint is used."""

from __future__ import annotations

import json
import logging
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from blackwell_trainer.checkpoint.store import MARKER, Checkpointer, NoUsableCheckpoint, list_complete
from blackwell_trainer.plan.config import CheckpointConfig

from .conftest import spawn_two_ranks
from .test_checkpoint import make, params, train_step

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


def checkpointer(root: Path, keep: int = 5) -> Checkpointer:
    return Checkpointer(CheckpointConfig(path=str(root), interval_steps=1, keep_latest=keep), rank=0)


def save_two(root: Path, steps: tuple[int, ...] = (1, 2)) -> list[list[torch.Tensor]]:
    """Checkpoints of steps 1 and 2 of one model, which trains between them; the parameters of each."""
    model, optimizer = make(0)
    ckpt = checkpointer(root)
    saved = []
    for step in steps:
        train_step(model, optimizer)
        ckpt.save(step, model, optimizer, {"step": step})
        saved.append(params(model))
    return saved


def shard(folder: Path) -> Path:
    return next(folder.glob("__0_*.distcp"))


def flip(path: Path) -> None:
    """Bytes changed in the middle, size unchanged: what only a checksum sees."""
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 8] = bytes(b ^ 0xFF for b in data[middle : middle + 8])
    path.write_bytes(bytes(data))


def zero(path: Path) -> None:
    path.write_bytes(bytes(path.stat().st_size))  # a zeroed block device extent, same size


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


CORRUPTIONS: dict[str, tuple[Callable[[Path], Path], Callable[[Path], None], str]] = {
    # kind: (which file, what happens to it, what the skip line must say)
    "flipped-same-size": (shard, flip, "fails its checksum"),
    "zeroed-shard": (shard, zero, "fails its checksum"),
    "truncated-shard": (shard, truncate, "truncated"),
    "metadata": (lambda f: f / ".metadata", flip, "fails its checksum"),
    "extra-state": (lambda f: f / "extra" / "rank-00000.pt", flip, "fails its checksum"),
}


@pytest.mark.parametrize("kind", list(CORRUPTIONS))
def test_a_damaged_newest_checkpoint_is_skipped_for_the_older_one(
    tmp_path: Path, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    which, damage, said = CORRUPTIONS[kind]
    saved = save_two(tmp_path)
    damaged = which(tmp_path / "step-000002")
    damage(damaged)

    skipped: list[tuple[Path, str]] = []
    model, optimizer = make(7)
    with caplog.at_level(logging.INFO):
        extra = checkpointer(tmp_path).load(model, optimizer, on_skip=lambda p, r: skipped.append((p, r)))
    assert extra is not None and extra["step"] == 1
    for a, b in zip(saved[0], params(model), strict=True):
        assert torch.equal(a, b)  # exactly the step-1 state, nothing of the damaged one
    ((path, reason),) = skipped
    assert path == tmp_path / "step-000002"
    name = str(damaged.relative_to(path))
    assert reason.startswith(name) and said in reason
    (line,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert line == f"skipping checkpoint {path}: {reason}; trying the next older one"


def test_the_marker_holds_each_files_size_and_crc32(tmp_path: Path) -> None:
    save_two(tmp_path)
    folder = tmp_path / "step-000002"
    marker = json.loads((folder / MARKER).read_text())
    assert marker["version"] == 2 and marker["checksum"] == "crc32"
    on_disk = {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and p.name != MARKER}
    assert set(marker["files"]) == on_disk
    for name, entry in marker["files"].items():
        data = (folder / name).read_bytes()
        assert entry == {"size": len(data), "crc32": f"{zlib.crc32(data):08x}", "rank": 0}


def test_when_every_checkpoint_is_damaged_one_error_names_each(tmp_path: Path) -> None:
    save_two(tmp_path)
    zero(shard(tmp_path / "step-000002"))
    flip(tmp_path / "step-000001" / ".metadata")
    skipped: list[Path] = []
    with pytest.raises(NoUsableCheckpoint) as refused:
        checkpointer(tmp_path).load(*make(7), on_skip=lambda p, r: skipped.append(p))
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(f"no checkpoint under spec.training.checkpoint.path {tmp_path} can be resumed")
    assert "step-000002: __0_0.distcp fails its checksum" in message
    assert "step-000001: .metadata fails its checksum" in message
    assert skipped == [tmp_path / "step-000002", tmp_path / "step-000001"]
    assert [c.step for c in list_complete(tmp_path)] == [1, 2]  # nothing removed: the evidence stays


def rewrite_marker(folder: Path, change: Callable[[dict[str, object]], object]) -> None:
    marker = json.loads((folder / MARKER).read_text())
    change(marker)
    (folder / MARKER).write_text(json.dumps(marker))


def test_a_checkpoint_that_verifies_but_does_not_load_is_skipped(tmp_path: Path) -> None:
    saved = save_two(tmp_path)
    folder = tmp_path / "step-000002"
    # Unreadable .metadata whose checksum matches (e.g. written by a broken writer): only loading finds out.
    (folder / ".metadata").write_bytes(b"\x00" * (folder / ".metadata").stat().st_size)
    crc = f"{zlib.crc32((folder / '.metadata').read_bytes()):08x}"
    rewrite_marker(folder, lambda m: m["files"][".metadata"].update(crc32=crc))  # type: ignore[index]

    reasons: list[str] = []
    model, optimizer = make(7)
    extra = checkpointer(tmp_path).load(model, optimizer, on_skip=lambda p, r: reasons.append(r))
    assert extra is not None and extra["step"] == 1
    for a, b in zip(saved[0], params(model), strict=True):
        assert torch.equal(a, b)
    (reason,) = reasons
    assert reason.startswith("cannot be loaded: ") and "\n" not in reason


def test_an_unreadable_marker_is_skipped(tmp_path: Path) -> None:
    save_two(tmp_path)
    flip(tmp_path / "step-000002" / MARKER)
    reasons: list[str] = []
    extra = checkpointer(tmp_path).load(*make(7), on_skip=lambda p, r: reasons.append(r))
    assert extra is not None and extra["step"] == 1
    assert len(reasons) == 1 and MARKER in reasons[0]


def test_a_checkpoint_from_before_checksums_resumes_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    saved = save_two(tmp_path)
    for step in (1, 2):  # the version-1 marker: sizes only
        rewrite_marker(
            tmp_path / f"step-00000{step}",
            lambda m: m.update(version=1, files={n: e["size"] for n, e in m["files"].items()}),  # type: ignore[attr-defined]
        )
    model, optimizer = make(7)
    with caplog.at_level(logging.WARNING):
        extra = checkpointer(tmp_path).load(model, optimizer)
    assert extra is not None and extra["step"] == 2
    for a, b in zip(saved[1], params(model), strict=True):
        assert torch.equal(a, b)
    assert any("has no checksums" in m and "step-000002" in m for m in caplog.messages)
    # Unverified but still size-checked: a truncated old checkpoint is skipped as before.
    truncate(shard(tmp_path / "step-000002"))
    extra = checkpointer(tmp_path).load(*make(7))
    assert extra is not None and extra["step"] == 1


def nan_fill(folder: Path, tensor: torch.Tensor) -> None:
    """The bytes of one saved tensor overwritten with 0xFF (NaN as float32) where they lie in the
    shard, size unchanged: damage inside the data, which a size check cannot see."""
    path = shard(folder)
    data = bytearray(path.read_bytes())
    raw = tensor.detach().contiguous().numpy().tobytes()
    at = data.find(raw)
    assert at >= 0, "the tensor's bytes are stored as they are"
    data[at : at + len(raw)] = b"\xff" * len(raw)
    path.write_bytes(bytes(data))


def test_a_damaged_checkpoint_from_before_checksums_is_skipped_not_resumed_into_nan(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Before, it loaded (sizes match), the first step was non-finite, and every restart resumed it again.
    saved = save_two(tmp_path)
    for step in (1, 2):
        rewrite_marker(
            tmp_path / f"step-00000{step}",
            lambda m: m.update(version=1, files={n: e["size"] for n, e in m["files"].items()}),  # type: ignore[attr-defined]
        )
    nan_fill(tmp_path / "step-000002", saved[1][0])
    reasons: list[str] = []
    model, optimizer = make(7)
    with caplog.at_level(logging.WARNING):
        extra = checkpointer(tmp_path).load(model, optimizer, on_skip=lambda p, r: reasons.append(r))
    assert extra is not None and extra["step"] == 1
    for a, b in zip(saved[0], params(model), strict=True):
        assert torch.equal(a, b)  # the older checkpoint whole, nothing of the damaged one
    (reason,) = reasons
    assert "has no checksums and its model." in reason and "holds NaN or Inf" in reason
    assert "\n" not in reason


def test_non_finite_tensor_names_the_first_nan_or_inf_in_a_nested_state() -> None:
    from blackwell_trainer.checkpoint.store import non_finite_tensor

    fine = {"model": {"w": torch.ones(3)}, "optimizer": {"state": {0: {"step": torch.tensor(3)}}}}
    assert non_finite_tensor(fine) is None
    bad = {
        "model": {"w": torch.ones(3)},
        "optimizer": {"state": {0: {"exp_avg": torch.tensor([float("inf")])}}},
    }
    assert non_finite_tensor(bad) == "optimizer.state.0.exp_avg"
    assert non_finite_tensor({"groups": [{"lr": 0.1}, torch.tensor([float("nan")])]}) == "groups.1"


def test_pruning_keeps_the_newest_checkpoint_known_good_until_a_finite_step_follows(tmp_path: Path) -> None:
    model, optimizer = make(0)
    ckpt = checkpointer(tmp_path, keep=1)

    def steps_on_disk() -> list[int]:
        return [c.step for c in list_complete(tmp_path)]

    ckpt.confirm_finite(2)
    ckpt.save(2, model, optimizer, {"step": 2})
    ckpt.confirm_finite(3)
    ckpt.confirm_finite(4)
    ckpt.save(4, model, optimizer, {"step": 4})
    # Step 4's weights have not produced a loss yet: step 2 is the newest known to be good, and stays.
    assert steps_on_disk() == [2, 4]
    ckpt.confirm_finite(5)  # step 5 was finite on step 4's weights
    assert steps_on_disk() == [4]


def test_pruning_after_a_fallback_ignores_the_skipped_newer_checkpoint(tmp_path: Path) -> None:
    save_two(tmp_path, steps=(1, 2, 3))
    zero(shard(tmp_path / "step-000003"))
    model, optimizer = make(7)
    ckpt = checkpointer(tmp_path, keep=2)
    assert ckpt.load(model, optimizer) == {"step": 2}
    ckpt.confirm_finite(3)  # prunes what resuming from step 2 left: the newest 2 up to step 2 stay
    # The damaged step 3 does not count as one of the newest two (it would have pushed out step 1),
    # and is left for this run to replace when it saves step 3 again.
    assert [c.step for c in list_complete(tmp_path)] == [1, 2, 3]
    ckpt.save(3, model, optimizer, {"step": 3})
    assert [c.step for c in list_complete(tmp_path)] == [2, 3]
    assert checkpointer(tmp_path).load(*make(8)) == {"step": 3}


def test_no_checkpoint_at_all_is_a_fresh_start(tmp_path: Path) -> None:
    (tmp_path / ".tmp-step-000003").mkdir()  # a save that never finished is not a damaged checkpoint
    assert checkpointer(tmp_path).load(*make(0)) is None


# --- two ranks (gloo, FSDP2): each rank checks its share of the files and every rank takes the same one


def _two_rank_resume(rank: int, init: str, root: str) -> None:
    """Save steps 1 and 2 sharded over 2 ranks; damage rank 1's shard of step 2, then everything."""
    from datetime import timedelta

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2, timeout=timedelta(seconds=60))
    try:
        mesh = init_device_mesh("cpu", (2,))

        def sharded(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
            model, _ = make(seed)
            for layer in model:
                if isinstance(layer, torch.nn.Linear):
                    fully_shard(layer, mesh=mesh)
            fully_shard(model, mesh=mesh)
            return model, torch.optim.AdamW(model.parameters(), lr=1e-2)

        def local(model: torch.nn.Module) -> list[torch.Tensor]:
            return [p.detach().to_local().clone() for p in model.parameters()]  # type: ignore[operator]

        model, optimizer = sharded(0)
        ckpt = Checkpointer(CheckpointConfig(path=root, interval_steps=1, keep_latest=5), rank=rank)
        saved = []
        for step in (1, 2):
            train_step(model, optimizer)
            ckpt.save(step, model, optimizer, {"step": step, "rank": rank})
            saved.append(local(model))
        if rank == 0:
            zero(Path(root, "step-000002", "__1_0.distcp"))  # only rank 1 checks it
        dist.barrier()
        outcome: dict[str, object] = {}
        reasons: list[str] = []
        fresh, fresh_optimizer = sharded(5)
        loaded = Checkpointer(ckpt.config, rank=rank).load(
            fresh, fresh_optimizer, on_skip=lambda p, r: reasons.append(f"{p.name}: {r}")
        )
        outcome["loaded"] = loaded
        same = all(torch.equal(a, b) for a, b in zip(saved[0], local(fresh), strict=True))
        outcome["same_as_step_1"] = same
        outcome["skipped"] = reasons
        if rank == 0:
            flip(Path(root, "step-000001", "extra", "rank-00001.pt"))  # rank 1's own state of step 1
        dist.barrier()
        try:
            Checkpointer(ckpt.config, rank=rank).load(*sharded(6))
            outcome["none_left"] = "loaded"
        except NoUsableCheckpoint as err:
            outcome["none_left"] = str(err)
        Path(root, f"outcome-{rank}.json").write_text(json.dumps(outcome))
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
def test_two_ranks_agree_to_skip_a_checkpoint_only_one_rank_found_damaged(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    root.mkdir()
    spawn_two_ranks(_two_rank_resume, (f"file://{tmp_path / 'rendezvous'}", str(root)))
    outcomes = [json.loads((root / f"outcome-{rank}.json").read_text()) for rank in (0, 1)]
    assert [o["loaded"] for o in outcomes] == [{"step": 1, "rank": 0}, {"step": 1, "rank": 1}]
    assert [o["same_as_step_1"] for o in outcomes] == [True, True]
    assert outcomes[0]["skipped"] == outcomes[1]["skipped"]
    (reason,) = outcomes[0]["skipped"]
    assert reason.startswith("step-000002: rank 1: __1_0.distcp fails its checksum")
    assert outcomes[0]["none_left"] == outcomes[1]["none_left"]
    assert "step-000001: rank 1: extra/rank-00001.pt fails its checksum" in outcomes[0]["none_left"]
