"""Chat checkpoints for the tests: a real tokenizer trained here, a chat template file, and conversations.

The templates in chat_templates/ are written for these tests in the styles of Llama 3, Qwen 2.5 and
Mistral Instruct (plus templates that break the rules on purpose); the tokenizers are trained with the
`tokenizers` library: byte-level BPE for the first two, a SentencePiece-like Metaspace BPE for Mistral.
"""

from __future__ import annotations

import json
from pathlib import Path

TEMPLATES = Path(__file__).resolve().parents[1] / "trainer" / "chat_templates"
SPECIAL = {
    "llama3": [
        "<|begin_of_text|>",
        "<|end_of_text|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|eot_id|>",
    ],
    "qwen25": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
    "mistral": ["<s>", "</s>", "[INST]", "[/INST]"],
}
BOS_EOS = {
    "llama3": ("<|begin_of_text|>", "<|eot_id|>"),
    "qwen25": ("", "<|im_end|>"),
    "mistral": ("<s>", "</s>"),
}
CORPUS = [
    "What is FSDP? It shards parameters, gradients and optimizer states across ranks.",
    "Explain activation checkpointing in one sentence, please.",
    "Café au lait costs 3 € here; ünïcode stays as written.",
    "The planner picks a micro-batch that fits in memory and runs fast.",
    "Thanks! Could you say it again, more briefly?",
    "Sure: recompute activations in the backward pass instead of storing them.",
]

CONVERSATIONS: list[list[dict[str, str]]] = [
    [
        {"role": "user", "content": "What is FSDP?"},
        {"role": "assistant", "content": "It shards parameters, gradients and optimizer states."},
    ],
    [
        {"role": "system", "content": "You answer briefly."},
        {"role": "user", "content": "Explain activation checkpointing."},
        {"role": "assistant", "content": "Recompute activations in the backward pass."},
        {"role": "user", "content": "Thanks! Again, more briefly?"},
        {"role": "assistant", "content": "Recompute, don't store."},
    ],
    [
        {"role": "user", "content": "Café au lait?"},
        {"role": "assistant", "content": "3 € here; ünïcode stays as written."},
    ],
]


def save_chat_checkpoint(folder: Path, style: str, template: str | None = None) -> Path:
    """A checkpoint folder with tokenizer.json, tokenizer_config.json (its chat template) for `style`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE())
    if style == "mistral":
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
        tokenizer.decoder = decoders.Metaspace()
        alphabet: list[str] = []
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=SPECIAL[style], initial_alphabet=alphabet, show_progress=False
    )
    tokenizer.train_from_iterator(CORPUS * 4, trainer=trainer)
    tokenizer.save(str(folder / "tokenizer.json"))
    bos, eos = BOS_EOS[style]
    config = {
        "bos_token": bos or None,
        "eos_token": eos,
        "chat_template": (TEMPLATES / f"{template or style}.jinja").read_text(),
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False))
    return folder


def write_conversations(
    path: Path, conversations: list[list[dict[str, str]]], sharegpt: bool = False
) -> Path:
    """A JSONL file of the conversations, in the OpenAI messages form or the ShareGPT form."""
    names = {"user": "human", "assistant": "gpt", "system": "system"}
    lines = []
    for index, turns in enumerate(conversations):
        if sharegpt:
            record = {
                "id": index,
                "conversations": [{"from": names[t["role"]], "value": t["content"]} for t in turns],
            }
        else:
            record = {"id": index, "messages": turns}
        lines.append(json.dumps(record, ensure_ascii=False))
    path.write_text("\n".join(lines) + "\n")
    return path
