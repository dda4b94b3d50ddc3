"""Chat data as packed rows: whole conversations, labels on the assistant's next tokens only, never across a
conversation; the same global rows on any number of ranks, and an exact resume."""

from __future__ import annotations

import itertools
import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from blackwell_trainer.data.packed import ChatTokenSource, build_chat_source, pack_rows
from blackwell_trainer.data.tokens import DataError, DataLayout
from blackwell_trainer.model.loss import IGNORE_INDEX
from blackwell_trainer.plan.config import DatasetConfig, DatasetKind
from blackwell_trainer.plan.shard_manifest import MASK_SUFFIX, ShardManifest, companion
from blackwell_trainer.prepare import Options, prepare
from tests.support.chat_data import CONVERSATIONS, save_chat_checkpoint, write_conversations

SEQ = 256  # longer than every test conversation: none is cut


@given(st.lists(st.integers(1, 150), min_size=1, max_size=40), st.integers(8, 128))
def test_rows_hold_each_conversation_once_in_order(lengths: list[int], row: int) -> None:
    starts = np.cumsum([0, *lengths[:-1]]).tolist()
    rows, cut = pack_rows(starts, sum(lengths), row)
    assert [i for first, last in rows for i in range(first, last + 1)] == list(range(len(lengths)))
    for first, last in rows:
        used = sum(min(n, row) for n in lengths[first : last + 1])
        assert used <= row
        assert first == last or all(n <= row for n in lengths[first : last + 1])
    assert cut == sum(n > row for n in lengths)
    # Greedy: the next conversation would not have fitted in the row before it.
    for (first, last), (nxt, _) in itertools.pairwise(rows):
        assert sum(min(n, row) for n in lengths[first : last + 1]) + min(lengths[nxt], row) > row


@pytest.fixture(scope="module")
def chat_data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ShardManifest]:
    root = tmp_path_factory.mktemp("chat")
    folder = save_chat_checkpoint(root / "ckpt", "llama3")
    conversations = [
        [dict(t, content=f"{t['content']} ({i})") for t in turns] for i, turns in enumerate(CONVERSATIONS * 8)
    ]
    source = write_conversations(root / "chat.jsonl", conversations)
    manifest = prepare(
        Options(inputs=[str(source)], output=root / "data", tokenizer=folder, chat="auto", chunk_bytes=2000)
    )
    return root / "data", manifest


def source_of(
    data: Path, manifest: ShardManifest, rank: int = 0, world: int = 1, mbs: int = 2
) -> ChatTokenSource:
    dataset = DatasetConfig(kind=DatasetKind.CHAT, uri=str(data), token_dtype=manifest.token_dtype, seed=5)
    return build_chat_source(
        dataset, DataLayout(mbs, SEQ, vocab_size=manifest.vocab_size, rank=rank, world_size=world)
    )


def test_labels_are_the_assistants_next_tokens_within_one_conversation(
    chat_data: tuple[Path, ShardManifest],
) -> None:
    data, manifest = chat_data
    source = source_of(data, manifest)
    trained = 0
    for index in range(source.samples_per_epoch):
        tokens, labels, docs = source.row(0, index)
        assert tokens.size == labels.size == docs.size == SEQ
        assert np.all(np.diff(docs) >= 0)
        valid = labels != IGNORE_INDEX
        # A label is the next token of the same conversation: never at a conversation's last token.
        assert np.all(docs[:-1][valid[:-1]] == docs[1:][valid[:-1]])
        assert not valid[-1]  # the row's last token has no next token in the row
        assert np.array_equal(labels[:-1][valid[:-1]], tokens[1:][valid[:-1]])
        trained += int(valid.sum())
    # Every token the mask trains on is a label once per epoch, except each conversation's first token
    # (nothing predicts it), which the mask never marks: a conversation starts with the template's text.
    mask_total = sum(
        int(np.fromfile(data / companion(s.name, MASK_SUFFIX), dtype=np.uint8).sum()) for s in manifest.shards
    )
    assert trained == mask_total == manifest.trained_tokens


def test_the_global_rows_are_the_same_on_one_rank_and_two(chat_data: tuple[Path, ShardManifest]) -> None:
    data, manifest = chat_data
    one = source_of(data, manifest, mbs=2)
    two = [source_of(data, manifest, rank=r, world=2, mbs=1) for r in (0, 1)]
    for _ in range(4):
        batch = one.next_batch()
        halves = [s.next_batch() for s in two]
        assert np.array_equal(batch.inputs.numpy(), np.concatenate([h.inputs.numpy() for h in halves]))
        assert np.array_equal(batch.labels.numpy(), np.concatenate([h.labels.numpy() for h in halves]))
        assert np.array_equal(batch.documents.numpy(), np.concatenate([h.documents.numpy() for h in halves]))


def test_a_resume_continues_after_the_last_row(chat_data: tuple[Path, ShardManifest]) -> None:
    data, manifest = chat_data
    straight = source_of(data, manifest)
    expected = [straight.next_batch().inputs.numpy() for _ in range(5)]
    first = source_of(data, manifest)
    got = [first.next_batch().inputs.numpy() for _ in range(2)]
    state = json.loads(json.dumps(first.state_dict()))
    resumed = [source_of(data, manifest, rank=r, world=2, mbs=1) for r in (0, 1)]  # resharded
    for part in resumed:
        part.load_state_dict(state)
    for _ in range(3):
        got.append(np.concatenate([part.next_batch().inputs.numpy() for part in resumed]))
    for ours, theirs in zip(got, expected, strict=True):
        assert np.array_equal(ours, theirs)


def test_chat_data_without_its_mask_or_as_plain_shards_is_refused(
    chat_data: tuple[Path, ShardManifest], tmp_path: Path
) -> None:
    data, manifest = chat_data
    copy = tmp_path / "copy"
    copy.mkdir()
    for path in data.iterdir():
        if not path.name.endswith(MASK_SUFFIX) or path.name != companion(
            manifest.shards[0].name, MASK_SUFFIX
        ):
            (copy / path.name).write_bytes(path.read_bytes())
    with pytest.raises(DataError, match=r"\.mask is missing; copy the whole folder"):
        source_of(copy, manifest)
    from blackwell_trainer.data.tokens import build_token_source

    plain = DatasetConfig(kind=DatasetKind.SHARDS, uri=str(data), token_dtype=manifest.token_dtype)
    with pytest.raises(DataError, match=r"holds chat data .*set spec.training.dataset.kind: chat"):
        build_token_source(plain, DataLayout(2, SEQ, vocab_size=manifest.vocab_size))


def test_too_few_rows_for_one_step_names_the_micro_batch_that_fits(
    chat_data: tuple[Path, ShardManifest],
) -> None:
    # Issue 26: the advice names the field that works, counted in packed rows, never a shorter sequence
    # (packing anew changes the rows).
    rows = source_of(*chat_data, mbs=1).samples_per_epoch
    with pytest.raises(DataError) as caught:
        source_of(*chat_data, mbs=rows + 1)
    text = str(caught.value)
    assert f"{rows:,} packed rows" in text and f"spec.tuning.microBatchSize: {rows} or smaller" in text, text
    assert "sequenceLength" not in text
    assert source_of(*chat_data, mbs=rows).samples_per_epoch == rows


def test_a_mask_that_is_not_the_one_prepared_is_refused_naming_the_file_and_the_fix(
    chat_data: tuple[Path, ShardManifest], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    data, manifest = chat_data
    assert all(shard.mask_crc32 for shard in manifest.shards)  # prepare records each mask's checksum
    source_of(data, manifest)  # the folder as prepared passes
    copy = tmp_path / "copy"
    shutil.copytree(data, copy)
    first = manifest.shards[0]
    mask = copy / companion(first.name, MASK_SUFFIX)
    prepared = mask.read_bytes()

    # All ones, the right size: it would train on the user's turns and the template's text too.
    mask.write_bytes(b"\x01" * len(prepared))
    assert first.trained_tokens is not None and first.trained_tokens < first.tokens
    with pytest.raises(DataError) as refused:
        source_of(copy, manifest)
    assert str(refused.value) == (
        f"dataset.uri {copy}: {mask.name} trains on {first.tokens} of {first.tokens} tokens (100.0%) but "
        f"manifest.json says {first.trained_tokens} ({first.trained_tokens / first.tokens:.1%}): it is not "
        "the mask prepare wrote. Fix: prepare the data again (python -m blackwell_trainer.prepare --chat) "
        "and copy the whole folder"
    )
    # The same coverage on other tokens: only the checksum sees it.
    mask.write_bytes(prepared[::-1])
    with pytest.raises(DataError, match=rf"{mask.name} fails its checksum \(crc32 [0-9a-f]{{8}}, manifest"):
        source_of(copy, manifest)

    # A manifest from before mask checksums: the coverage is still checked, with a warning about the rest.
    older = json.loads((copy / "manifest.json").read_text())
    for shard in older["shards"]:
        shard.pop("maskCrc32")
    (copy / "manifest.json").write_text(json.dumps(older))
    with caplog.at_level(logging.WARNING):
        source_of(copy, ShardManifest.model_validate(older))  # reversed: same coverage, not caught
    assert any("has no mask checksums (prepared before them)" in m for m in caplog.messages)
    mask.write_bytes(b"\x01" * len(prepared))
    with pytest.raises(DataError, match=r"trains on \d+ of \d+ tokens \(100\.0%\)"):
        source_of(copy, ShardManifest.model_validate(older))
