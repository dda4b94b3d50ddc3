"""A checkpoint's own chat template: render a conversation, and find exactly the assistant's characters.

Supervised fine-tuning trains only on what the assistant says (its text and the end-of-turn marker after
it). The template is the checkpoint's Jinja `chat_template` (tokenizer_config.json or chat_template.jinja),
rendered as Hugging Face transformers renders it: a sandboxed Jinja environment with trim_blocks and
lstrip_blocks, `raise_exception`, `strftime_now` and a `tojson` that keeps non-ASCII text.

Few templates mark the assistant's text (`{% generation %}`), so the spans are found by rendering the
conversation one turn at a time: the characters that appear when assistant turn i is added to the
conversation up to turn i (rendered with the generation prompt, as inference would prompt) are that turn,
up to its end-of-turn marker (trailing whitespace after it is never generated, so it is not trained on).
This holds only when the template is prefix-stable (adding a turn never rewrites what was already rendered)
and its generation prompt ends where the assistant's text starts; both are checked on every conversation,
and a template that breaks them is refused with the reason. There is no fallback to training on every token.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

CONFIG_NAME = "tokenizer_config.json"
TEMPLATE_FILE = "chat_template.jinja"  # where newer checkpoints keep the template instead
ROLES = ("system", "user", "assistant", "tool")


class ChatTemplateError(ValueError):
    """A template or conversation whose assistant spans cannot be located exactly; names the reason."""


@dataclass(frozen=True)
class Message:
    """One turn of a conversation."""

    role: str
    content: str


@dataclass(frozen=True)
class RenderedConversation:
    """A conversation as the template renders it, and the [start, end) character spans to train on."""

    text: str
    spans: tuple[tuple[int, int], ...]


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(f"the chat template refused the conversation: {message}")


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(value: Any, indent: int | None = None) -> str:
    # Jinja's own tojson escapes HTML characters; transformers' keeps text as written.
    return json.dumps(value, ensure_ascii=False, indent=indent)


@dataclass(frozen=True)
class ChatTemplate:
    """A compiled chat template with the special tokens its text refers to."""

    source: str
    bos_token: str
    eos_token: str

    @property
    def sha256(self) -> str:
        """SHA-256 of the template's text: the manifest records it, so a changed template is visible."""
        return hashlib.sha256(self.source.encode()).hexdigest()

    def render(self, messages: Sequence[Message], *, add_generation_prompt: bool) -> str:
        """The template's text for `messages`."""
        return _compiled(self.source)(
            messages=[{"role": m.role, "content": m.content} for m in messages],
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token,
            eos_token=self.eos_token,
        )

    def locate(self, messages: Sequence[Message]) -> RenderedConversation:
        """Render `messages` and find each assistant turn's text and end-of-turn marker exactly."""
        full = self.render(messages, add_generation_prompt=False)
        spans: list[tuple[int, int]] = []
        for index, message in enumerate(messages):
            if message.role == "assistant":
                spans.append(self._assistant_span(messages, index, full))
        if not spans:
            raise ChatTemplateError("the conversation has no assistant turn: nothing to train on")
        return RenderedConversation(full, tuple(spans))

    def _assistant_span(self, messages: Sequence[Message], index: int, full: str) -> tuple[int, int]:
        before = self.render(messages[:index], add_generation_prompt=True)
        upto = self.render(messages[: index + 1], add_generation_prompt=False)
        turn = index + 1
        if not upto.startswith(before) or not full.startswith(upto):
            raise ChatTemplateError(
                f"turn {turn}: the template is not prefix-stable (adding a turn rewrites text rendered "
                "before it, e.g. it drops earlier reasoning or moves the system prompt), so the assistant's "
                "tokens cannot be located exactly"
            )
        added = upto[len(before) :]
        content = messages[index].content.strip()
        at = added.find(content) if content else 0
        if at < 0:
            raise ChatTemplateError(
                f"turn {turn}: the assistant's text does not appear in what the template renders for it"
            )
        if added[:at].strip():
            raise ChatTemplateError(
                f"turn {turn}: the template's generation prompt does not end where the assistant's text "
                f"starts ({added[:at]!r} comes between them; the template may ignore add_generation_prompt)"
            )
        end = len(added.rstrip())
        if end <= at + len(content):
            raise ChatTemplateError(
                f"turn {turn}: the template writes no end-of-turn marker after the assistant's text, so the "
                "model would never learn to stop"
            )
        # From the end of the generation prompt: what inference prompts with stops there, so everything
        # after it (a separating space included) is what the model must learn to write.
        return len(before), len(before) + end


_CACHE: dict[str, Callable[..., str]] = {}


def _compiled(source: str) -> Callable[..., str]:
    """The template compiled once per process (compiling costs far more than rendering)."""
    found = _CACHE.get(source)
    if found is None:
        from jinja2 import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        try:
            template = env.from_string(source)
        except TemplateError as err:
            raise ChatTemplateError(f"the chat template is not valid Jinja ({err})") from err

        def render(**context: Any) -> str:
            try:
                return template.render(**context)
            except TemplateError as err:
                raise ChatTemplateError(f"the chat template failed to render ({err})") from err

        found = _CACHE[source] = render
    return found


def _token_text(raw: object) -> str:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken mapping."""
    if isinstance(raw, Mapping):
        return str(raw.get("content", ""))
    return raw if isinstance(raw, str) else ""


def load_chat_template(folder: Path, name: str = "default") -> ChatTemplate:
    """The chat template of a checkpoint folder (chat_template.jinja, else tokenizer_config.json)."""
    config_path = folder / CONFIG_NAME
    config: dict[str, Any] = json.loads(config_path.read_text()) if config_path.is_file() else {}
    source: object = None
    if (folder / TEMPLATE_FILE).is_file():
        source = (folder / TEMPLATE_FILE).read_text()
    else:
        source = config.get("chat_template")
    if isinstance(source, list):  # several named templates, as some checkpoints ship
        named = {str(t.get("name")): t.get("template") for t in source if isinstance(t, Mapping)}
        if name not in named:
            raise ChatTemplateError(
                f"{config_path}: no chat template named {name!r} (it has {', '.join(sorted(named))})"
            )
        source = named[name]
    if not isinstance(source, str) or not source.strip():
        raise ChatTemplateError(
            f"{folder}: no chat template ({TEMPLATE_FILE} or chat_template in {CONFIG_NAME}); chat data "
            "needs the checkpoint's own template (a base model's folder has none: use its instruct variant's)"
        )
    return ChatTemplate(
        source=source,
        bos_token=_token_text(config.get("bos_token")),
        eos_token=_token_text(config.get("eos_token")),
    )
