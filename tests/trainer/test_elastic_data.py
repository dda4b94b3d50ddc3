"""The data position of an elastic job: every layout of one global batch trains the same samples per step,
epoch ends included, and a resume checks the position and the global batch against the plan."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from blackwell_trainer.data.tokens import DataError, DataLayout, TokenSource, build_token_source, check_resume
from blackwell_trainer.loop.sample_ledger import SampleLedger
from blackwell_trainer.plan.config import DatasetConfig, DatasetKind

SEQ = 8
VOCAB = 1000
# (data-parallel ranks, micro-batch, accumulation): four layouts of one global batch of 8 sequences.
LAYOUTS = [(1, 8, 1), (2, 2, 2), (4, 1, 2), (8, 1, 1)]


def sources(world: int, mbs: int, accumulation: int, dataset: DatasetConfig) -> list[TokenSource]:
    """One token source per data-parallel rank of a layout."""
    return [
        build_token_source(
            dataset,
            DataLayout(
                micro_batch_size=mbs,
                sequence_length=SEQ,
                vocab_size=VOCAB,
                rank=rank,
                world_size=world,
                accumulation=accumulation,
            ),
        )
        for rank in range(world)
    ]


def step_samples(ranks: list[TokenSource], accumulation: int, steps: int) -> list[set[tuple[int, int]]]:
    """Per optimizer step, the (epoch, sample) pairs all ranks took, checking no rank took one twice."""
    out = []
    for _ in range(steps):
        taken: list[tuple[int, int]] = []
        for _ in range(accumulation):
            for source in ranks:
                source.next_batch()
                epoch, indices = source.position.last
                taken += [(epoch, i) for i in indices]
        assert len(taken) == len(set(taken)), "a sample trained twice in one step"
        out.append(set(taken))
    return out


@pytest.fixture
def shard_dir(tmp_path: Path) -> Path:
    """Three shards holding 5 + 3 + 4 = 12 windows: an epoch of one whole global batch of 8 and a tail."""
    folder = tmp_path / "shards"
    folder.mkdir()
    for name, length in (("a.bin", 41), ("b.bin", 25), ("c.bin", 33)):
        np.arange(length, dtype=np.uint16).tofile(folder / name)
    return folder


@pytest.mark.parametrize("kind", ["synthetic", "shards"])
def test_every_layout_of_one_global_batch_trains_the_same_samples_each_step(
    kind: str, shard_dir: Path
) -> None:
    dataset = (
        DatasetConfig(seed=3)
        if kind == "synthetic"
        else DatasetConfig(kind=DatasetKind.SHARDS, uri=str(shard_dir), token_dtype="uint16", seed=3)
    )
    per_layout = [step_samples(sources(w, m, a, dataset), a, steps=5) for w, m, a in LAYOUTS]
    assert all(steps == per_layout[0] for steps in per_layout[1:])
    if kind == "shards":
        # 12 windows hold one global batch of 8: the 4-window tail is dropped on every layout alike, and
        # each step is one epoch's first 8 windows.
        assert [{e for e, _ in step} for step in per_layout[0]] == [{0}, {1}, {2}, {3}, {4}]
        assert all({i for _, i in step} == set(range(8)) for step in per_layout[0])


def test_a_resume_on_another_layout_continues_with_the_next_step_and_says_so(shard_dir: Path) -> None:
    dataset = DatasetConfig(kind=DatasetKind.SHARDS, uri=str(shard_dir), token_dtype="uint16", seed=3)
    reference = step_samples(sources(2, 2, 2, dataset), 2, steps=4)
    two = sources(2, 2, 2, dataset)
    step_samples(two, 2, steps=1)  # the checkpoint is taken at the end of step 1 (an epoch's end)
    state = two[0].state_dict()
    one = sources(1, 8, 1, dataset)[0]
    one.load_state_dict(state)
    line = check_resume(state, 1, one)
    assert line == (
        "resumed at step 1: data position epoch 1 sample 0 and global batch 8 sequences agree with the plan "
        "(saved by 2 ranks x micro-batch 2, resumed on 1 x 8 x accumulation 1)"
    )
    assert step_samples([one], 1, steps=3) == reference[1:]


def test_a_resume_with_another_global_batch_is_refused_naming_both() -> None:
    dataset = DatasetConfig(seed=3)
    two = sources(2, 2, 2, dataset)
    step_samples(two, 2, steps=3)
    state = two[0].state_dict()
    other = sources(2, 2, 1, dataset)[0]  # 4 sequences a step instead of 8
    with pytest.raises(DataError, match="global batch of 8 sequences but the plan's is 4"):
        other.load_state_dict(state)


def test_a_position_that_another_global_batch_wrote_is_refused_by_the_step_check() -> None:
    # A state without samples_per_step (an older checkpoint): its position must still be where the
    # plan's global batch puts that step, else the resume would shift every later step.
    dataset = DatasetConfig(seed=3)
    writer = sources(1, 4, 1, dataset)
    step_samples(writer, 1, steps=3)  # 12 samples consumed
    state = {k: v for k, v in writer[0].state_dict().items() if k != "samples_per_step"}
    reader = sources(1, 8, 1, dataset)[0]
    reader.load_state_dict(state)
    with pytest.raises(DataError, match="step 3 with the plan's global batch of 8 sequences ends at"):
        check_resume(state, 3, reader)
    same = sources(1, 4, 1, dataset)[0]  # the global batch it was written with: accepted
    same.load_state_dict(state)
    assert check_resume(state, 3, same).startswith("resumed at step 3: data position epoch 0 sample 12")


def test_the_ledger_records_each_finished_step_and_drops_an_unfinished_one(tmp_path: Path) -> None:
    ledger = SampleLedger(str(tmp_path / "ledger"), rank=1)
    ledger.took(0, [4, 5])
    ledger.took(0, [6, 7])
    ledger.trained(1)
    ledger.took(0, [8, 9])
    ledger.discard()
    ledger.took(0, [8, 9])
    ledger.trained(2)
    lines = [json.loads(line) for line in (tmp_path / "ledger" / "rank-1.jsonl").read_text().splitlines()]
    assert lines == [
        {"step": 1, "rank": 1, "samples": [[0, 4], [0, 5], [0, 6], [0, 7]]},
        {"step": 2, "rank": 1, "samples": [[0, 8], [0, 9]]},
    ]
    SampleLedger(None, rank=0).trained(1)  # unset: records nothing, writes nowhere
