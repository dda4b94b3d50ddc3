"""A resize under torchrun (gloo, CPU): trained on 2 ranks and resumed on 1 from the DCP checkpoint, and
1 -> 2, with the global batch kept by micro-batch and accumulation. The samples trained (by id, from every
rank's sample ledger) are exactly an uninterrupted run's, and the losses after the resize match it."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from blackwell_trainer.sample_ledger import LEDGER_ENV

from .test_checkpoint_resume import error_lines, train
from .test_checkpoint_resume import write_plan as one_process_plan
from .test_train_e2e import edit_plan, run_to_end, write_plan

STEPS, CHECKPOINT_AT = 6, 3
# (ranks, micro-batch, accumulation) of one global batch of 8 sequences.
TWO_RANKS = (2, 2, 2)
ONE_RANK = (1, 4, 2)


def layout_plan(folder: Path, ranks: int, mbs: int, accumulation: int) -> Path:
    """The tiny plan on `ranks` processes of one node, checkpointing every CHECKPOINT_AT steps."""
    plan = write_plan(
        folder,
        steps=STEPS,
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


def run(plan: Path, ranks: int, ledger_dir: Path) -> tuple[dict[int, float], str]:
    """The run's step -> loss and its output."""
    trainer = run_to_end(plan, env={LEDGER_ENV: str(ledger_dir)}, nproc=ranks)
    return {step: float(loss) for step, loss in trainer.losses().items()}, trainer.output


@pytest.mark.distributed
@pytest.mark.parametrize(
    ("before", "after"), [(TWO_RANKS, ONE_RANK), (ONE_RANK, TWO_RANKS)], ids=["2to1", "1to2"]
)
def test_a_resize_trains_each_sample_once_with_the_losses_of_an_uninterrupted_run(
    tmp_path: Path, before: tuple[int, int, int], after: tuple[int, int, int]
) -> None:
    # The uninterrupted run, on the layout the job starts on: its checkpoint at step 3 is the resize's.
    start = layout_plan(tmp_path / "start", *before)
    reference, _ = run(start, before[0], tmp_path / "ledger-start")
    assert sorted(reference) == list(range(1, STEPS + 1))
    uninterrupted = ledger(tmp_path / "ledger-start")
    assert sorted(uninterrupted) == list(range(1, STEPS + 1))
    # Each step trained one global batch of 8 distinct samples, consecutive in the global order.
    assert all(samples == [(0, i) for i in range(8 * (s - 1), 8 * s)] for s, samples in uninterrupted.items())

    # The resize: the same job re-planned on the other layout resumes from the step-3 checkpoint; the
    # job's training is the first run's steps up to it and the resumed run's after it.
    resized = layout_plan(tmp_path / "resized", *after)
    shutil.copytree(
        tmp_path / "start" / "ckpt" / "step-000003", tmp_path / "resized" / "ckpt" / "step-000003"
    )
    losses, output = run(resized, after[0], tmp_path / "ledger-resized")
    assert (
        "resumed at step 3: data position epoch 0 sample 24 and global batch 8 sequences agree with the "
        f"plan (saved by {before[0]} ranks x micro-batch {before[1]}, resumed on {after[0]} x {after[1]} x "
        f"accumulation {after[2]})"
    ) in output
    resumed = ledger(tmp_path / "ledger-resized")
    assert sorted(resumed) == [4, 5, 6]
    trained = {s: v for s, v in uninterrupted.items() if s <= CHECKPOINT_AT} | resumed
    assert trained == uninterrupted  # no sample skipped or repeated, by id
    assert sorted(losses) == [4, 5, 6]
    # The same samples in the same global batch: equal up to the reduction order (gloo vs local, and the
    # micro-batches summed in another grouping), so within float tolerance.
    assert losses == pytest.approx({s: reference[s] for s in (4, 5, 6)}, abs=2e-3)


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
