"""A checkpoint belongs to one job: another job's is refused (permanently, naming the field), startFrom is
the explicit way to begin from its weights at step 0, and no run succeeds without training its steps."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from blackwell_trainer.checkpoint.owner import Owner, judge
from blackwell_trainer.checkpoint.store import MARKER, Checkpointer, ForeignCheckpoint, list_complete
from blackwell_trainer.plan.config import JOB_FILE, PERMANENT_ERROR_PREFIX, CheckpointConfig, JobIdentity

from .test_checkpoint import make, params, train_step
from .test_checkpoint_resume import error_lines, train, write_plan

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")

A = JobIdentity(namespace="team", name="job-a", uid="uid-a1")
B = JobIdentity(namespace="team", name="job-b", uid="uid-b1")


def owner(job: JobIdentity, model: str = "m1") -> Owner:
    return Owner(job=job, model=model, data="synthetic, seed 1234", global_batch_tokens=256)


def job_plan(folder: Path, job: JobIdentity, *, steps: int, interval: int, **checkpoint: Any) -> Path:
    """write_plan's one-process plan with `job` in job.json beside it, as the plan ConfigMap carries it."""
    folder.mkdir(parents=True, exist_ok=True)
    plan = write_plan(folder, steps=steps, interval=interval)
    raw = json.loads(plan.read_text())
    raw["checkpoint"].update(checkpoint)
    plan.write_text(json.dumps(raw))
    (folder / JOB_FILE).write_text(job.model_dump_json(by_alias=True))
    return plan


# ----- the rule (pure) -----


def test_the_same_job_is_the_same_namespace_and_name_whatever_the_uid() -> None:
    mine = owner(A)
    assert judge(owner(A), mine, "s").own and judge(owner(A), mine, "s").note is None
    recreated = judge(owner(A.model_copy(update={"uid": "uid-a0"})), mine, "s")
    assert recreated.own and recreated.refusal is None
    assert recreated.note is not None and "uid-a0" in recreated.note and "uid-a1" in recreated.note
    other = judge(owner(B), mine, "ckpt/step-000002")
    assert not other.own and other.refusal is not None
    assert other.refusal.startswith(
        "spec.training.checkpoint.path: checkpoint ckpt/step-000002 belongs to job "
    )
    assert (
        "team/job-b (uid uid-b1)" in other.refusal and "spec.training.checkpoint.startFrom" in other.refusal
    )
    elsewhere = judge(owner(A.model_copy(update={"namespace": "other"})), mine, "s")
    assert elsewhere.refusal is not None and "other/job-a" in elsewhere.refusal
    another_model = judge(owner(A, model="m2"), mine, "s")
    assert another_model.refusal is not None and "another model" in another_model.refusal
    legacy = judge(None, mine, "s")
    assert legacy.refusal is None and not legacy.own and legacy.note is not None


def test_the_marker_records_the_owner_and_a_resume_refuses_another_jobs(tmp_path: Path) -> None:
    config = CheckpointConfig(path=str(tmp_path), interval_steps=1, keep_latest=5)
    model, optimizer = make(0)
    train_step(model, optimizer)
    Checkpointer(config, rank=0, owner=owner(A)).save(2, model, optimizer, {"step": 2})
    marker = json.loads((tmp_path / "step-000002" / MARKER).read_text())
    assert marker["owner"] == {
        "namespace": "team",
        "name": "job-a",
        "uid": "uid-a1",
        "model": "m1",
        "data": "synthetic, seed 1234",
        "globalBatchTokens": 256,
    }
    fresh, fresh_optimizer = make(7)
    before = params(fresh)
    with pytest.raises(ForeignCheckpoint, match="belongs to job team/job-a"):
        Checkpointer(config, rank=0, owner=owner(B)).load(fresh, fresh_optimizer)
    for a, b in zip(before, params(fresh), strict=True):
        assert torch.equal(a, b)  # refused before anything was loaded


def test_start_from_loads_the_weights_alone_and_records_nothing_of_the_other_job(tmp_path: Path) -> None:
    theirs = tmp_path / "a"
    config_a = CheckpointConfig(path=str(theirs), interval_steps=1, keep_latest=5)
    model, optimizer = make(0)
    train_step(model, optimizer)
    Checkpointer(config_a, rank=0, owner=owner(A)).save(1, model, optimizer, {"step": 1})
    train_step(model, optimizer)
    Checkpointer(config_a, rank=0, owner=owner(A)).save(2, model, optimizer, {"step": 2})
    saved = params(model)

    config_b = CheckpointConfig(path=str(tmp_path / "b"), start_from=str(theirs), interval_steps=1)
    fresh, fresh_optimizer = make(7)
    ours = Checkpointer(config_b, rank=0, owner=owner(B))
    assert ours.load(fresh, fresh_optimizer) is None  # no checkpoint of its own: a new run
    assert ours.load_weights(fresh) == theirs / "step-000002"
    for a, b in zip(saved, params(fresh), strict=True):
        assert torch.equal(a, b)  # the newest checkpoint's weights, exactly
    assert fresh_optimizer.state == {}  # the optimizer starts fresh
    assert ours.last_saved_step is None and ours.resumed is None


def test_start_from_a_folder_without_checkpoints_is_refused(tmp_path: Path) -> None:
    config = CheckpointConfig(path=str(tmp_path / "b"), start_from=str(tmp_path / "empty"))
    with pytest.raises(Exception, match=r"spec.training.checkpoint.startFrom .*empty holds no complete"):
        Checkpointer(config, rank=0, owner=owner(B)).load_weights(make(0)[0])


def test_start_from_may_not_be_the_jobs_own_path() -> None:
    with pytest.raises(ValueError, match=r"checkpoint\.startFrom /fsx/a is also checkpoint\.path"):
        CheckpointConfig(path="/fsx/a/", start_from="/fsx/a")


# ----- the trainer's entry point -----


@pytest.mark.usefixtures("world_of_one")
def test_another_jobs_checkpoint_of_the_same_shape_is_refused_and_start_from_trains_from_step_1(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    plan_a = job_plan(tmp_path / "a", A, steps=4, interval=2)
    rc, first = train(plan_a, monkeypatch, caplog)
    assert rc == 0 and sorted(first) == [1, 2, 3, 4]
    theirs = tmp_path / "a" / "ckpt"
    markers = {p.name: (p / MARKER).read_bytes() for p in theirs.iterdir()}
    capsys.readouterr()

    # Job B, the same shape, pointed at A's finished folder (before: B exited 0 having trained 0 steps).
    termination = tmp_path / "termination-log"
    monkeypatch.setenv("BTJ_TERMINATION_LOG", str(termination))
    plan_b = job_plan(tmp_path / "b", B, steps=4, interval=2, path=str(theirs))
    rc, losses = train(plan_b, monkeypatch, caplog)
    assert rc == 2 and losses == {}
    (line,) = error_lines(capsys.readouterr().err)
    assert line.startswith(
        f"error: spec.training.checkpoint.path: checkpoint {theirs / 'step-000004'} belongs "
    )
    assert "to job team/job-a (uid uid-a1), not to this job team/job-b (uid uid-b1)" in line
    assert termination.read_text() == PERMANENT_ERROR_PREFIX + line.removeprefix("error: ") + "\n"
    assert {p.name: (p / MARKER).read_bytes() for p in theirs.iterdir()} == markers  # A's untouched

    # The explicit way: its own path, starting from A's weights. A new run: steps 1-4 from the weights
    # A ended with, so its first loss is well below a run from random weights (A's own first loss).
    plan_b = job_plan(tmp_path / "b", B, steps=4, interval=2, path=str(tmp_path / "b" / "ckpt"))
    raw = json.loads(plan_b.read_text())
    raw["checkpoint"]["startFrom"] = str(theirs)
    plan_b.write_text(json.dumps(raw))
    rc, started = train(plan_b, monkeypatch, caplog)
    assert rc == 0 and sorted(started) == [1, 2, 3, 4]
    assert any("starting a new run at step 0 from the weights of" in m for m in caplog.messages)
    assert float(started[1]) < float(first[1]) - 0.1
    assert [c.step for c in list_complete(tmp_path / "b" / "ckpt")] == [2, 4]
    recorded = json.loads((tmp_path / "b" / "ckpt" / "step-000004" / MARKER).read_text())["owner"]
    assert recorded["name"] == "job-b"
    assert {p.name: (p / MARKER).read_bytes() for p in theirs.iterdir()} == markers  # read, never written
    assert error_lines(capsys.readouterr().err) == []


@pytest.mark.usefixtures("world_of_one")
def test_a_run_never_succeeds_without_training_its_steps_unless_its_own_run_finished(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    plan = job_plan(tmp_path, A, steps=2, interval=2)
    assert train(plan, monkeypatch, caplog)[0] == 0
    capsys.readouterr()
    root = tmp_path / "ckpt"

    # Its own finished run, restarted (the pod again, or re-created under its name): done, nothing trained.
    (tmp_path / JOB_FILE).write_text(A.model_copy(update={"uid": "uid-a2"}).model_dump_json(by_alias=True))
    with caplog.at_level(logging.INFO):
        rc, losses = train(plan, monkeypatch, caplog)
    assert rc == 0 and losses == {}
    assert any("this job's own finished run (step 2 of 2)" in m for m in caplog.messages)
    assert any("uid-a1" in m and "continues its training" in m for m in caplog.messages)

    # Fewer steps than the checkpoint holds: no success with weights trained past what the job asks.
    plan.write_text(json.dumps({**json.loads(plan.read_text()), "steps": 1}))
    rc, losses = train(plan, monkeypatch, caplog)
    assert rc == 2 and losses == {}
    (line,) = error_lines(capsys.readouterr().err)
    assert "step-000002 is at step 2, past spec.training.steps 1" in line

    # A finished checkpoint from before ownership records cannot be told from another job's: refused.
    plan.write_text(json.dumps({**json.loads(plan.read_text()), "steps": 2}))
    marker = root / "step-000002" / MARKER
    raw = json.loads(marker.read_text())
    del raw["owner"]
    marker.write_text(json.dumps(raw))
    rc, losses = train(plan, monkeypatch, caplog)
    assert rc == 2 and losses == {}
    (line,) = error_lines(capsys.readouterr().err)
    assert "is at the last step (2) but records no owner" in line
    # ...while such a checkpoint short of the end is resumed as this job's, as before.
    plan.write_text(json.dumps({**json.loads(plan.read_text()), "steps": 3}))
    rc, losses = train(plan, monkeypatch, caplog)
    assert rc == 0 and sorted(losses) == [3]
