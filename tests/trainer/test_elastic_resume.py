"""Resumes from one uninterrupted 2-rank run under torchrun (gloo, CPU), its checkpoints and sample ledger
shared by every test here: a truncated newest checkpoint is skipped and the run goes on with the very
losses of the first time; a resize to 1 rank and one from 1 rank (the global batch kept by micro-batch
and accumulation) train exactly the uninterrupted run's samples (by id, from every rank's sample ledger),
with its losses within float tolerance.

One reference run instead of one per test: each torchrun launch costs about three torch imports before
its first step. The 1-rank runs are main() in this process (a gloo world of one, as torchrun's single
worker would set it up)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from blackwell_trainer.loop.sample_ledger import LEDGER_ENV
from tests.ports import free_port

from .test_checkpoint_resume import error_lines, train
from .test_checkpoint_resume import write_plan as one_process_plan
from .test_train_e2e import complete_steps, edit_plan, run_to_end, write_plan

STEPS, CHECKPOINT_AT = 6, 3
# (ranks, micro-batch, accumulation) of one global batch of 8 sequences.
TWO_RANKS = (2, 2, 2)
ONE_RANK = (1, 4, 2)


def layout_plan(folder: Path, ranks: int, mbs: int, accumulation: int, *, steps: int = STEPS) -> Path:
    """The tiny plan on `ranks` processes of one node, checkpointing every CHECKPOINT_AT steps."""
    plan = write_plan(
        folder,
        steps=steps,
        checkpoint=folder / "ckpt",
        interval=CHECKPOINT_AT,
        microBatchSize=mbs,
        gradientAccumulationSteps=accumulation,
        shardDegree=ranks,
    )
    change: Callable[[dict[str, Any]], object] = lambda p: p.update(gpusPerNode=ranks)  # noqa: E731
    return edit_plan(plan, change)


def ledger(folder: Path) -> dict[int, list[tuple[int, int]]]:
    """Step -> the (epoch, sample) pairs all ranks of one run trained in it, sorted (a step twice on one
    rank would show as repeated samples)."""
    steps: dict[int, list[tuple[int, int]]] = {}
    for path in sorted(folder.glob("rank-*.jsonl")):
        for line in path.read_text().splitlines():
            entry = json.loads(line)
            steps.setdefault(entry["step"], []).extend((e, i) for e, i in entry["samples"])
    return {step: sorted(samples) for step, samples in sorted(steps.items())}


def two_ranks(plan: Path, ledger_dir: Path) -> tuple[dict[int, str], str]:
    """The plan under torchrun on 2 ranks: step -> loss (as logged, 4 decimals) and its output."""
    trainer = run_to_end(plan, env={LEDGER_ENV: str(ledger_dir)}, nproc=2)
    return trainer.losses(), trainer.output


def one_rank(
    plan: Path, ledger_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> tuple[dict[int, str], str]:
    """The plan as main() on 1 rank in this process: step -> loss and its log."""
    monkeypatch.setenv(LEDGER_ENV, str(ledger_dir))
    rc, losses = train(plan, monkeypatch, caplog)
    assert rc == 0, caplog.text[-4000:]
    return losses, "\n".join(caplog.messages)


@dataclass
class Reference:
    """The uninterrupted run on TWO_RANKS: its folder (plan, checkpoints), losses and sample ledger."""

    folder: Path
    losses: dict[int, str]
    ledger: dict[int, list[tuple[int, int]]]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    folder = tmp_path_factory.mktemp("uninterrupted")
    losses, _ = two_ranks(layout_plan(folder, *TWO_RANKS), folder / "ledger")
    assert sorted(losses) == list(range(1, STEPS + 1))
    assert complete_steps(folder / "ckpt") == [CHECKPOINT_AT, STEPS]
    trained = ledger(folder / "ledger")
    assert sorted(trained) == list(range(1, STEPS + 1))
    # Each step trained one global batch of 8 distinct samples, consecutive in the global order.
    assert all(samples == [(0, i) for i in range(8 * (s - 1), 8 * s)] for s, samples in trained.items())
    return Reference(folder, losses, trained)


def resume_folder(reference: Reference, folder: Path, ranks: int, mbs: int, accumulation: int) -> Path:
    """A job re-planned on another layout, its checkpoint folder holding the reference's step 3."""
    plan = layout_plan(folder, ranks, mbs, accumulation)
    step = f"step-{CHECKPOINT_AT:06d}"
    shutil.copytree(reference.folder / "ckpt" / step, folder / "ckpt" / step)
    return plan


def as_floats(losses: dict[int, str], steps: range) -> dict[int, float]:
    return {s: float(losses[s]) for s in steps}


AFTER = range(CHECKPOINT_AT + 1, STEPS + 1)


@pytest.mark.distributed
def test_resume_skips_a_truncated_checkpoint_and_reproduces_the_losses(
    reference: Reference, tmp_path: Path
) -> None:
    # A missing marker is the other way a checkpoint is incomplete; test_checkpoint.py covers it.
    shutil.copytree(reference.folder, tmp_path, dirs_exist_ok=True)
    newest = tmp_path / "ckpt" / f"step-{STEPS:06d}"
    shard = next(newest.glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])

    def here(p: dict[str, Any]) -> None:
        p["checkpoint"]["path"] = str(tmp_path / "ckpt")
        p["metricsPort"] = free_port()

    plan = edit_plan(tmp_path / "plan.json", here)

    losses, output = two_ranks(plan, tmp_path / "ledger-resumed")
    assert f"resumed at step {CHECKPOINT_AT}" in output
    # The steps after it again, in fresh processes: the same losses as the first time, to the digit.
    assert losses == {s: reference.losses[s] for s in AFTER}
    assert complete_steps(tmp_path / "ckpt") == [CHECKPOINT_AT, STEPS]


@pytest.mark.distributed
def test_a_resize_to_one_rank_reshards_and_trains_each_sample_once_with_the_uninterrupted_losses(
    reference: Reference,
    tmp_path: Path,
    world_of_one: None,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The same job re-planned on 1 rank resumes from the step-3 checkpoint of 2: the job's training is
    # the first run's steps up to it and the resumed run's after it.
    plan = resume_folder(reference, tmp_path, *ONE_RANK)
    losses, output = one_rank(plan, tmp_path / "ledger-resized", monkeypatch, caplog)
    assert f"step-{CHECKPOINT_AT:06d} was written by 2 ranks and resumes on 1" in output
    assert (
        f"resumed at step {CHECKPOINT_AT}: data position epoch 0 sample 24 and global batch 8 sequences "
        "agree with the plan (saved by 2 ranks x micro-batch 2, resumed on 1 x 4 x accumulation 2)"
    ) in output
    resumed = ledger(tmp_path / "ledger-resized")
    assert sorted(resumed) == list(AFTER)
    trained = {s: v for s, v in reference.ledger.items() if s <= CHECKPOINT_AT} | resumed
    assert trained == reference.ledger  # no sample skipped or repeated, by id
    assert sorted(losses) == list(AFTER)
    # The same samples in the same global batch: equal up to the reduction order (gloo vs local, and the
    # micro-batches summed in another grouping), so within float tolerance.
    assert as_floats(losses, AFTER) == pytest.approx(as_floats(reference.losses, AFTER), abs=2e-3)


@pytest.mark.distributed
def test_a_resize_from_one_rank_trains_each_sample_once_with_the_uninterrupted_losses(
    reference: Reference,
    tmp_path: Path,
    world_of_one: None,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The uninterrupted run on 1 rank (in this process: cheap), its checkpoint at step 3 the resize's.
    # Its initial weights are not the 2-rank run's (random init of a sharded model), so it is the
    # reference for the losses; the samples of each step are the same on every layout.
    start = layout_plan(tmp_path / "start", *ONE_RANK)
    uninterrupted, _ = one_rank(start, tmp_path / "ledger-start", monkeypatch, caplog)
    assert sorted(uninterrupted) == list(range(1, STEPS + 1))
    assert ledger(tmp_path / "ledger-start") == reference.ledger

    # The job re-planned onto 2 ranks resumes from that checkpoint of 1.
    resized = layout_plan(tmp_path / "resized", *TWO_RANKS)
    step = f"step-{CHECKPOINT_AT:06d}"
    shutil.copytree(tmp_path / "start" / "ckpt" / step, tmp_path / "resized" / "ckpt" / step)
    losses, output = two_ranks(resized, tmp_path / "ledger-resized")
    assert (
        f"resumed at step {CHECKPOINT_AT}: data position epoch 0 sample 24 and global batch 8 sequences "
        "agree with the plan (saved by 1 ranks x micro-batch 4, resumed on 2 x 2 x accumulation 2)"
    ) in output
    resumed = ledger(tmp_path / "ledger-resized")
    assert sorted(resumed) == list(AFTER)
    trained = {s: v for s, v in reference.ledger.items() if s <= CHECKPOINT_AT} | resumed
    assert trained == reference.ledger  # no sample skipped or repeated, by id
    assert as_floats(losses, AFTER) == pytest.approx(as_floats(uninterrupted, AFTER), abs=2e-3)


@pytest.mark.usefixtures("world_of_one")
def test_a_resume_whose_plan_changed_the_global_batch_is_refused_in_one_line(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    plan = one_process_plan(tmp_path, steps=2, interval=2)
    assert train(plan, monkeypatch, caplog)[0] == 0
    capsys.readouterr()
    # Re-planned with twice the global batch: every later step would train other samples.
    plan.write_text(json.dumps({**json.loads(plan.read_text()), "steps": 4, "globalBatchTokens": 16 * 32}))
    edit_plan(plan, lambda p: p["chosen"].update(microBatchSize=16))
    rc, losses = train(plan, monkeypatch, caplog)
    assert rc == 2 and losses == {}
    (line,) = error_lines(capsys.readouterr().err)
    assert line == (
        "error: checkpoint data position was written with a global batch of 8 sequences but the plan's is "
        "16: every later step would train other samples. Fix: keep spec.training.globalBatchTokens, or start "
        "a new checkpoint.path"
    )
