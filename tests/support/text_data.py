"""A real, small byte-level BPE tokenizer (trained here with `tokenizers`) and documents to prepare."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

VOCAB = 320  # the model's rows; the tokenizer uses 300 of them

BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
WORDS = [
    "the",
    "a",
    "model",
    "trains",
    "on",
    "text",
    "tokens",
    "shards",
    "weights",
    "data",
    "parallel",
    "resume",
    "manifest",
    "kill",
]


def make_documents(count: int, seed: int = 0) -> list[str]:
    """`count` distinct documents of a few words, some with punctuation, newlines and non-ASCII text."""
    rng = np.random.default_rng(seed)
    docs = []
    for index in range(count):
        words = [WORDS[int(i)] for i in rng.integers(0, len(WORDS), size=int(rng.integers(3, 30)))]
        extra = ["\nsecond line", " café ünïcode", ", with a comma."][index % 3]
        docs.append(f"doc {index}: {' '.join(words)}{extra}")
    return docs


def save_tokenizer(folder: Path, vocab_size: int = 300) -> Path:
    """Train a byte-level BPE on the test documents and save it as a checkpoint folder holds it.

    tokenizer.json adds BOS in front of every sequence (as Llama 3's does); tokenizer_config.json names
    the EOS token. Returns the folder.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(make_documents(200, seed=99), trainer=trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, tokenizer.token_to_id(BOS))]
    )
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": BOS, "eos_token": EOS, "tokenizer_class": "PreTrainedTokenizerFast"})
    )
    return folder


def read_documents(folder: Path, tokenizer_folder: Path, dtype: str) -> list[str]:
    """Decode every shard of a prepared folder back into documents, in shard-name order."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(tokenizer_folder / "tokenizer.json"))
    eos, bos = tokenizer.token_to_id(EOS), tokenizer.token_to_id(BOS)
    docs: list[str] = []
    for shard in sorted(folder.glob("*.bin")):
        ids = np.fromfile(shard, dtype=dtype).tolist()
        assert ids and ids[-1] == eos, f"{shard.name} does not end with EOS"
        current: list[int] = []
        for token in ids:
            if token == eos:
                assert current and current[0] == bos, "each document starts with BOS"
                docs.append(tokenizer.decode(current[1:]))
                current = []
            else:
                current.append(token)
    return docs
