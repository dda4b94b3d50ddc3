"""The trainer's entry point over damaged checkpoints: it resumes from the newest good one with the same
losses as from an undamaged copy, counts each skipped one in /metrics, and when none is left it stops with
one permanent-error line."""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from blackwell_trainer.checkpoint.store import MARKER, list_complete
from blackwell_trainer.plan.config import PERMANENT_ERROR_PREFIX, Plan
from blackwell_trainer.train import main
from tests.ports import free_port
from tests.support.plans import tiny_plan_dict

from .test_checkpoint_verify import flip, zero

STEP_LINE = re.compile(r"^step (\d+)/\d+ loss (\d+\.\d+)")


def write_plan(folder: Path, *, steps: int, interval: int, keep: int = 2) -> Path:
    """The tiny plan on one process, logging every step's loss, checkpointing to folder/ckpt."""
    plan = tiny_plan_dict(microBatchSize=8, shardDegree=1)
    plan.update(gpusPerNode=1, steps=steps, metricsPort=free_port(), logEverySteps=1)
    plan["parameterCount"] = Plan.model_validate(plan).architecture.parameter_count()
    plan["checkpoint"] = {"path": str(folder / "ckpt"), "intervalSteps": interval, "keepLatest": keep}
    path = folder / "plan.json"
    path.write_text(json.dumps(plan))
    return path


def train(plan: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> tuple[int, Any]:
    """main() in this process (a fresh gloo world of one each time): its exit code and step -> loss."""
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    caplog.clear()
    with caplog.at_level(logging.INFO):
        rc = main(["--plan", str(plan)])
    losses = {int(m[1]): m[2] for m in map(STEP_LINE.match, caplog.messages) if m}
    return rc, losses


def error_lines(stderr: str) -> list[str]:
    assert "Traceback" not in stderr, stderr
    return [line for line in stderr.splitlines() if line.startswith("error: ")]


@pytest.mark.usefixtures("world_of_one")
def test_resume_skips_a_zeroed_newest_checkpoint_with_the_losses_of_an_undamaged_resume(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    scraped: dict[str, float],
    capsys: pytest.CaptureFixture[str],
) -> None:
    plan = write_plan(tmp_path, steps=6, interval=3)
    rc, _ = train(plan, monkeypatch, caplog)
    assert rc == 0
    root = tmp_path / "ckpt"
    assert [c.step for c in list_complete(root)] == [3, 6]
    # The reference: step 6 removed, so the resume starts from an undamaged step 3.
    reference = tmp_path / "reference"
    shutil.copytree(root, reference / "ckpt")
    shutil.rmtree(reference / "ckpt" / "step-000006")
    plan.write_text(json.dumps({**json.loads(plan.read_text()), "steps": 8}))
    shutil.copy(plan, reference / "plan.json")
    edit = json.loads((reference / "plan.json").read_text())
    edit["checkpoint"]["path"] = str(reference / "ckpt")
    (reference / "plan.json").write_text(json.dumps(edit))
    rc, expected = train(reference / "plan.json", monkeypatch, caplog)
    assert rc == 0 and sorted(expected) == [4, 5, 6, 7, 8]
    assert scraped["btj_trainer_checkpoints_skipped_total"] == 0

    # Same-size damage the old size check let through: every byte of the shard zeroed.
    shard = next((root / "step-000006").glob("*.distcp"))
    zero(shard)
    rc, resumed = train(plan, monkeypatch, caplog)
    assert rc == 0
    assert any(m.startswith("resumed at step 3:") for m in caplog.messages)
    assert resumed == expected  # steps 4-8 from step 3: the losses of the undamaged resume
    (skip,) = [m for m in caplog.messages if m.startswith("skipping checkpoint")]
    assert f"{root / 'step-000006'}: {shard.name} fails its checksum" in skip
    assert scraped["btj_trainer_checkpoints_skipped_total"] == 1  # over HTTP, as Prometheus reads it
    assert error_lines(capsys.readouterr().err) == []
    # The run saved step 6 again over the damaged one, and step 8: both verify now.
    assert [c.step for c in list_complete(root)] == [6, 8]
    rc, _ = train(plan, monkeypatch, caplog)
    assert rc == 0 and any(m.startswith("resumed at step 8:") for m in caplog.messages)


@pytest.mark.usefixtures("world_of_one")
def test_when_no_checkpoint_verifies_one_permanent_error_line_and_exit_2(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    plan = write_plan(tmp_path, steps=4, interval=2)
    assert train(plan, monkeypatch, caplog)[0] == 0
    root = tmp_path / "ckpt"
    flip(next((root / "step-000004").glob("*.distcp")))
    flip(root / "step-000002" / "extra" / "rank-00000.pt")
    capsys.readouterr()

    termination = tmp_path / "termination-log"
    monkeypatch.setenv("BTJ_TERMINATION_LOG", str(termination))
    plan.write_text(json.dumps({**json.loads(plan.read_text()), "steps": 6}))
    rc, losses = train(plan, monkeypatch, caplog)
    assert rc == 2 and losses == {}  # not one step from scratch: that would throw the run away
    (line,) = error_lines(capsys.readouterr().err)
    where = f"spec.training.checkpoint.path {root}"
    assert line.startswith(f"error: no checkpoint under {where} can be resumed: ")
    assert "step-000004: __0_0.distcp fails its checksum" in line
    assert "step-000002: extra/rank-00000.pt fails its checksum" in line
    # Exactly one line, and it tells the operator no restart can help.
    assert termination.read_text() == PERMANENT_ERROR_PREFIX + line.removeprefix("error: ") + "\n"
    assert [c.step for c in list_complete(root)] == [2, 4]  # both kept for whoever restores them


def as_version_1(folder: Path) -> None:
    """Rewrite a step folder's marker as a trainer before checksums (and owner records) wrote it."""
    marker = folder / MARKER
    raw = json.loads(marker.read_text())
    raw.pop("owner", None)
    raw.update(version=1, files={name: entry["size"] for name, entry in raw["files"].items()})
    marker.write_text(json.dumps(raw))


def blow_up(folder: Path, name: str) -> None:
    """Overwrite one model tensor's bytes in the shard with 3e38: finite, so no load-time scan sees it, and
    the same size, so no size check does; the first step's logits overflow."""
    import numpy as np
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    whole = folder.parent / f"{folder.name}.pt"
    dcp_to_torch_save(folder, whole)
    tensor = torch.load(whole, weights_only=True)["model"][name]
    whole.unlink()
    shard = next(folder.glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    raw = tensor.contiguous().numpy().tobytes()
    assert data.count(raw) == 1, "the tensor's bytes are stored once, as they are"
    at = data.find(raw)
    data[at : at + len(raw)] = np.full(tensor.numel(), 3e38, dtype=np.float32).tobytes()
    shard.write_bytes(bytes(data))


@pytest.mark.usefixtures("world_of_one")
def test_a_damaged_checkpoint_from_before_checksums_falls_back_to_the_one_before_it(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Before: the damaged checkpoint loaded (sizes match, every value finite), its first step was not
    # finite (exit 3), and every restart resumed it again into the same failure.
    plan = write_plan(tmp_path, steps=4, interval=2)
    assert train(plan, monkeypatch, caplog)[0] == 0
    root = tmp_path / "ckpt"
    for step in (2, 4):
        as_version_1(root / f"step-00000{step}")
    plan.write_text(json.dumps({**json.loads(plan.read_text()), "steps": 6}))
    # The reference: the same resume from an undamaged step 2.
    reference = tmp_path / "reference"
    shutil.copytree(root, reference / "ckpt")
    shutil.rmtree(reference / "ckpt" / "step-000004")
    edit = json.loads(plan.read_text())
    edit["checkpoint"]["path"] = str(reference / "ckpt")
    (reference / "plan.json").write_text(json.dumps(edit))
    rc, expected = train(reference / "plan.json", monkeypatch, caplog)
    assert rc == 0 and sorted(expected) == [3, 4, 5, 6]
    capsys.readouterr()

    blow_up(root / "step-000004", "output.weight")
    rc, losses = train(plan, monkeypatch, caplog)
    assert rc == 3 and losses == {}
    (line,) = error_lines(capsys.readouterr().err)
    assert line.startswith("error: step 5: the loss is not finite")
    assert "checkpoint step-000004 is marked so that the next start skips it for the one before it" in line
    rc, resumed = train(plan, monkeypatch, caplog)
    assert rc == 0
    (skip,) = [m for m in caplog.messages if m.startswith("skipping checkpoint")]
    assert "step 5, the first after resuming it, was not finite, and it has no checksums" in skip
    assert resumed == expected  # steps 3-6 from step 2: the losses of the undamaged resume
    assert error_lines(capsys.readouterr().err) == []
    assert [c.step for c in list_complete(root)] == [4, 6]  # step 4 saved again over the damaged one
