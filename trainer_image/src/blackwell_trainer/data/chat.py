"""Chat records (OpenAI `messages`, ShareGPT `conversations`) as token ids and the mask to train on.

The mask holds 1 for exactly the tokens of the assistant's turns (their text and end-of-turn marker, as the
chat template renders them) and 0 elsewhere: system and user text, role headers, the generation prompt. A
token whose characters straddle the edge of an assistant span would make the edge inexact, so such a
conversation is refused with the reason rather than rounded either way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Any, Protocol

import numpy as np

from blackwell_trainer.data.chat_template import ROLES, ChatTemplateError, Message, RenderedConversation

SHAREGPT_ROLES = {
    "system": "system",
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
}


class ChatFormat(StrEnum):
    """How a JSONL record holds its conversation."""

    MESSAGES = "messages"  # {"messages": [{"role": "user", "content": "..."}, ...]} (OpenAI, HF TRL)
    SHAREGPT = "sharegpt"  # {"conversations": [{"from": "human", "value": "..."}, ...]}


class Encoding(Protocol):
    """What the tokenizers library returns for one text."""

    ids: list[int]
    offsets: list[tuple[int, int]]


class Encoder(Protocol):
    """The part of a tokenizers.Tokenizer this module uses."""

    def encode(self, sequence: str, add_special_tokens: bool = ...) -> Any: ...


def detect_format(record: Mapping[str, object]) -> ChatFormat:
    """The record's format from its keys; ChatTemplateError naming both forms when it is neither."""
    if "messages" in record:
        return ChatFormat.MESSAGES
    if "conversations" in record:
        return ChatFormat.SHAREGPT
    raise ChatTemplateError(
        "no 'messages' (role/content) or 'conversations' (ShareGPT from/value) list in the record"
    )


def conversation(record: Mapping[str, object], fmt: ChatFormat) -> list[Message]:
    """The record's turns as Messages; ChatTemplateError naming the turn and the key when malformed."""
    key, role_key, text_key = (
        ("messages", "role", "content") if fmt is ChatFormat.MESSAGES else ("conversations", "from", "value")
    )
    turns = record.get(key)
    if not isinstance(turns, list) or not turns:
        raise ChatTemplateError(f"{key!r} is not a non-empty list of turns")
    messages: list[Message] = []
    for number, turn in enumerate(turns):
        if not isinstance(turn, Mapping):
            raise ChatTemplateError(f"{key}[{number}] is not an object with {role_key!r} and {text_key!r}")
        role, text = turn.get(role_key), turn.get(text_key)
        if fmt is ChatFormat.SHAREGPT and isinstance(role, str):
            role = SHAREGPT_ROLES.get(role, role)
        if role not in ROLES:
            raise ChatTemplateError(
                f"{key}[{number}].{role_key} is {role!r}; use one of {', '.join(ROLES)}"
                + (" (ShareGPT: human, gpt, system)" if fmt is ChatFormat.SHAREGPT else "")
            )
        if not isinstance(text, str):
            raise ChatTemplateError(f"{key}[{number}].{text_key} is {type(text).__name__}, not text")
        messages.append(Message(str(role), text))
    return messages


def assistant_mask(
    encoder: Encoder, rendered: RenderedConversation
) -> tuple[np.ndarray[Any, np.dtype[np.int64]], np.ndarray[Any, np.dtype[np.uint8]]]:
    """Token ids of the rendered text and, per token, 1 when it lies inside an assistant span."""
    # The template writes the special tokens itself (BOS, headers), as transformers tokenizes a chat.
    encoding: Encoding = encoder.encode(rendered.text, add_special_tokens=False)
    ids = np.asarray(encoding.ids, dtype=np.int64)
    mask = np.zeros(ids.size, dtype=np.uint8)
    for start, end in rendered.spans:
        covered = _tokens_in_span(encoding.offsets, start, end, rendered.text)
        mask[covered] = 1
    return ids, mask


def _tokens_in_span(offsets: Sequence[tuple[int, int]], start: int, end: int, text: str) -> list[int]:
    """Indices of the tokens covering [start, end) exactly; ChatTemplateError if an edge splits a token."""
    inside: list[int] = []
    for index, (first, last) in enumerate(offsets):
        if last <= start or first >= end:
            continue
        if first < start or last > end:
            raise ChatTemplateError(
                f"token {index} ({text[first:last]!r}) spans the edge of the assistant's text at character "
                f"{start if first < start else end}: the tokenizer merges template and reply characters, so "
                "the mask cannot follow the reply exactly"
            )
        inside.append(index)
    if not inside or offsets[inside[0]][0] != start or offsets[inside[-1]][1] != end:
        raise ChatTemplateError(
            f"the tokens do not cover the assistant's text [{start}, {end}) exactly (the tokenizer's offsets "
            "do not map to the rendered text)"
        )
    return inside
