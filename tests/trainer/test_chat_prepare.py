"""Chat data: the checkpoint's template rendered as transformers renders it, a mask of exactly the assistant's
tokens, refusals (never an all-ones mask) where a template does not let the spans be located."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from blackwell_trainer.data.chat import ChatFormat, assistant_mask, conversation
from blackwell_trainer.data.chat_template import ChatTemplateError, Message, load_chat_template
from blackwell_trainer.data.text_inputs import InputError
from blackwell_trainer.plan.shard_manifest import (
    DOCS_SUFFIX,
    MANIFEST_NAME,
    MASK_SUFFIX,
    ManifestMismatch,
    check_manifest,
    companion,
)
from blackwell_trainer.prepare import Options, PrepareError, prepare
from tests.support.chat_data import CONVERSATIONS, save_chat_checkpoint, write_conversations

STYLES = ["llama3", "qwen25", "mistral"]
END_OF_TURN = {"llama3": "<|eot_id|>", "qwen25": "<|im_end|>", "mistral": "</s>"}


def conversations_for(style: str) -> list[list[dict[str, str]]]:
    # Mistral-style templates refuse a system turn (roles must alternate from the user's).
    return [c for c in CONVERSATIONS if style != "mistral" or c[0]["role"] != "system"]


@pytest.fixture(scope="module", params=STYLES)
def checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    style = str(request.param)
    return style, save_chat_checkpoint(tmp_path_factory.mktemp(style), style)


def messages(turns: list[dict[str, str]]) -> list[Message]:
    return [Message(t["role"], t["content"]) for t in turns]


def test_the_template_renders_and_tokenizes_as_transformers_does(checkpoint: tuple[str, Path]) -> None:
    from transformers import PreTrainedTokenizerFast

    style, folder = checkpoint
    template = load_chat_template(folder)
    reference = PreTrainedTokenizerFast.from_pretrained(str(folder))
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    for turns in conversations_for(style):
        for prompt in (False, True):
            shown = turns[:-1] if prompt else turns
            expected = reference.apply_chat_template(shown, tokenize=False, add_generation_prompt=prompt)
            assert template.render(messages(shown), add_generation_prompt=prompt) == expected
        ids, _ = assistant_mask(tokenizer, template.locate(messages(turns)))
        expected_ids = reference.apply_chat_template(turns, tokenize=True, return_dict=True)["input_ids"]
        assert ids.tolist() == list(expected_ids)


def test_the_mask_covers_exactly_the_assistants_replies_and_end_of_turn(checkpoint: tuple[str, Path]) -> None:
    style, folder = checkpoint
    template = load_chat_template(folder)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    for turns in conversations_for(style):
        rendered = template.locate(messages(turns))
        ids, mask = assistant_mask(tokenizer, rendered)
        replies = [t["content"] for t in turns if t["role"] == "assistant"]
        assert len(rendered.spans) == len(replies)
        for (start, end), reply in zip(rendered.spans, replies, strict=True):
            span = rendered.text[start:end]
            # The reply (after at most the separating space the model writes) and the end-of-turn marker.
            assert span.lstrip() == reply + END_OF_TURN[style]
        encoding = tokenizer.encode(rendered.text, add_special_tokens=False)
        trained = {
            i
            for i, (a, b) in enumerate(encoding.offsets)
            if any(s <= a and b <= e for s, e in rendered.spans)
        }
        assert set(np.flatnonzero(mask).tolist()) == trained
        decoded = tokenizer.decode([int(i) for i in ids[mask == 1]], skip_special_tokens=False)
        assert decoded.replace(" ", "") == "".join(r + END_OF_TURN[style] for r in replies).replace(" ", "")
        untrained = tokenizer.decode([int(i) for i in ids[mask == 0]], skip_special_tokens=False)
        for turn in turns:
            if turn["role"] != "assistant":
                assert turn["content"] in untrained  # user and system text is never trained on
        assert 0 < mask.mean() < 1


@pytest.mark.parametrize(
    ("template", "turns", "reason"),
    [
        ("drops_reasoning", CONVERSATIONS[1], r"turn 3: the template is not prefix-stable"),
        ("no_generation_prompt", CONVERSATIONS[0], r"generation prompt does not end where the assistant"),
        ("no_end_of_turn", CONVERSATIONS[0], r"no end-of-turn marker"),
        ("alpaca_space", CONVERSATIONS[0], r"spans the edge of the assistant's text"),
        (
            "mistral",
            CONVERSATIONS[1],
            r"template refused the conversation: Conversation roles must alternate",
        ),
    ],
)
def test_a_template_whose_spans_cannot_be_located_is_refused(
    tmp_path: Path, template: str, turns: list[dict[str, str]], reason: str
) -> None:
    style = "mistral" if template == "mistral" else "qwen25"
    folder = save_chat_checkpoint(tmp_path / "ckpt", style, template=template)
    if template == "drops_reasoning":
        turns = [dict(t) for t in turns]
        turns[2]["content"] = "<think>recall FSDP</think>Recompute activations in the backward pass."
    chat = load_chat_template(folder)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    with pytest.raises(ChatTemplateError, match=reason):
        assistant_mask(tokenizer, chat.locate(messages(turns)))
    # The preparation stops on the same reason, naming the line, and writes no manifest.
    source = write_conversations(tmp_path / "chat.jsonl", [CONVERSATIONS[0], turns])
    with pytest.raises(InputError, match=r"chat.jsonl: line \d+: .*" + reason.split(": ", 1)[-1]):
        prepare(Options(inputs=[str(source)], output=tmp_path / "out", tokenizer=folder, chat="auto"))
    assert not (tmp_path / "out" / MANIFEST_NAME).exists()


def test_conversation_records_and_their_errors() -> None:
    record = {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}
    assert conversation(record, ChatFormat.SHAREGPT) == [Message("user", "hi"), Message("assistant", "hello")]
    with pytest.raises(ChatTemplateError, match=r"messages\[1\].role is 'bot'; use one of system, user"):
        conversation(
            {"messages": [{"role": "user", "content": "a"}, {"role": "bot", "content": "b"}]},
            ChatFormat.MESSAGES,
        )
    with pytest.raises(ChatTemplateError, match=r"messages\[0\].content is int, not text"):
        conversation({"messages": [{"role": "user", "content": 5}]}, ChatFormat.MESSAGES)
    with pytest.raises(ChatTemplateError, match=r"'messages' is not a non-empty list"):
        conversation({"messages": []}, ChatFormat.MESSAGES)


def test_prepare_chat_writes_shards_masks_and_conversation_starts(tmp_path: Path) -> None:
    folder = save_chat_checkpoint(tmp_path / "ckpt", "llama3")
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    template = load_chat_template(folder)
    source = write_conversations(tmp_path / "chat.jsonl", CONVERSATIONS * 5)
    manifest = prepare(
        Options(inputs=[str(source)], output=tmp_path / "out", tokenizer=folder, chat="auto", chunk_bytes=600)
    )

    assert manifest.kind == "chat" and manifest.documents == 15 and len(manifest.shards) > 1
    assert manifest.chat_template_sha256 == template.sha256
    expected_ids, expected_mask = [], []
    for turns in CONVERSATIONS * 5:
        ids, mask = assistant_mask(tokenizer, template.locate(messages(turns)))
        expected_ids.append(ids)
        expected_mask.append(mask)
    ids_read, mask_read, starts_read = [], [], []
    offset = 0
    for shard in manifest.shards:
        tokens = np.fromfile(tmp_path / "out" / shard.name, dtype=manifest.token_dtype)
        mask = np.fromfile(tmp_path / "out" / companion(shard.name, MASK_SUFFIX), dtype=np.uint8)
        starts = np.fromfile(tmp_path / "out" / companion(shard.name, DOCS_SUFFIX), dtype=np.uint64)
        assert tokens.size == mask.size == shard.tokens and starts.size == shard.documents
        assert shard.trained_tokens == int(mask.sum())
        ids_read.append(tokens.astype(np.int64))
        mask_read.append(mask)
        starts_read.extend(int(s) + offset for s in starts)
        offset += tokens.size
    assert np.array_equal(np.concatenate(ids_read), np.concatenate(expected_ids))
    assert np.array_equal(np.concatenate(mask_read), np.concatenate(expected_mask))
    assert starts_read == np.cumsum([0, *(i.size for i in expected_ids[:-1])]).tolist()
    trained = int(np.concatenate(expected_mask).sum())
    assert manifest.trained_tokens == trained
    assert manifest.loss_mask_coverage == pytest.approx(trained / manifest.tokens, abs=1e-6)
    on_disk = json.loads((tmp_path / "out" / MANIFEST_NAME).read_text())
    assert on_disk["kind"] == "chat" and on_disk["lossMaskCoverage"] == manifest.loss_mask_coverage


def test_sharegpt_and_messages_give_the_same_shards(tmp_path: Path) -> None:
    folder = save_chat_checkpoint(tmp_path / "ckpt", "qwen25")
    outputs = []
    for sharegpt in (False, True):
        source = write_conversations(tmp_path / f"chat-{sharegpt}.jsonl", CONVERSATIONS, sharegpt=sharegpt)
        out = tmp_path / f"out-{sharegpt}"
        prepare(Options(inputs=[str(source)], output=out, tokenizer=folder, chat="auto"))
        outputs.append({p.name: p.read_bytes() for p in out.iterdir() if p.name != MANIFEST_NAME})
    assert outputs[0] == outputs[1]


def test_a_checkpoint_without_a_chat_template_is_refused(tmp_path: Path) -> None:
    folder = save_chat_checkpoint(tmp_path / "ckpt", "llama3")
    config = json.loads((folder / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    source = write_conversations(tmp_path / "chat.jsonl", CONVERSATIONS)
    with pytest.raises(PrepareError, match=r"no chat template .* use its instruct variant's"):
        prepare(Options(inputs=[str(source)], output=tmp_path / "out", tokenizer=folder, chat="auto"))


def test_chat_shards_read_as_plain_shards_are_refused_rather_than_train_on_every_token(
    tmp_path: Path,
) -> None:
    folder = save_chat_checkpoint(tmp_path / "ckpt", "llama3")
    source = write_conversations(tmp_path / "chat.jsonl", CONVERSATIONS)
    manifest = prepare(Options(inputs=[str(source)], output=tmp_path / "out", tokenizer=folder, chat="auto"))
    files = {p.name: p.stat().st_size for p in (tmp_path / "out").glob("*.bin")}
    with pytest.raises(
        ManifestMismatch, match=r"holds chat data .* would train on every token; set .*kind: chat"
    ):
        check_manifest(manifest, files, uri="/data", token_dtype=manifest.token_dtype, vocab_size=128256)
