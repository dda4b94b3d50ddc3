"""The manifest.json beside prepared token shards, and the checks of it against the plan and the weights.

Pure (pydantic and the standard library): the trainer checks a data set with it before the first step, and
`btj plan` checks a folder it can read with the same code, so both refuse with the same line.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

from pydantic import Field

from blackwell_trainer.plan.config import WireModel

MANIFEST_NAME = "manifest.json"
MANIFEST_FORMAT: Literal["btj-token-shards"] = "btj-token-shards"
MANIFEST_VERSION: Literal[1] = 1
TOKEN_DTYPES = ("uint16", "uint32")
ITEMSIZE = {"uint16": 2, "uint32": 4}
TOKENIZER_FILE = "tokenizer.json"
# Beside a chat data set's part-*.bin: one uint8 per token (1: trained on) and each conversation's first
# token (uint64). Neither ends in .bin, which the trainer reads as token shards.
MASK_SUFFIX = ".mask"
DOCS_SUFFIX = ".docs"
COMPANION_SUFFIXES = (MASK_SUFFIX, DOCS_SUFFIX)


def companion(shard: str, suffix: str) -> str:
    """The name of a shard's mask or document-start file: part-00000-00000.bin -> part-00000-00000.mask."""
    return shard.removesuffix(".bin") + suffix


class ManifestMismatch(ValueError):
    """Prepared shards that do not match the plan; the message names the field and the fix."""


class ShardEntry(WireModel):
    """One shard file of the data set."""

    name: str = Field(min_length=1, description="File name, e.g. part-00000-00000.bin.")
    tokens: int = Field(ge=1, description="Tokens in the file (file size / dtype size).")
    documents: int = Field(
        ge=1, description="Documents in the file, each ending with the EOS token (chat: conversations)."
    )
    trained_tokens: int | None = Field(
        default=None, ge=0, description="Chat data: tokens the loss mask trains on (the assistant's)."
    )
    mask_crc32: str | None = Field(
        default=None,
        pattern="^[0-9a-f]{8}$",
        description="Chat data: CRC32 of the shard's .mask file (8 hex digits); none in manifests before it.",
    )
    source: str = Field(description="The input file and the part of it the shard holds.")


class ShardManifest(WireModel):
    """What `python -m blackwell_trainer.prepare` wrote: how to read the shards and where they came from."""

    format: Literal["btj-token-shards"] = Field(
        default=MANIFEST_FORMAT, description="Always btj-token-shards."
    )
    version: Literal[1] = Field(default=MANIFEST_VERSION, description="Manifest schema version.")
    token_dtype: Literal["uint16", "uint32"] = Field(description="Element type of every shard file.")
    vocab_size: int = Field(ge=1, description="The tokenizer's vocabulary, added tokens included.")
    max_token_id: int = Field(ge=0, description="Largest token id in any shard.")
    eos_token_id: int = Field(ge=0, description="The token that ends every document.")
    add_special_tokens: bool = Field(
        description="Whether the tokenizer's own BOS/template tokens were added."
    )
    tokenizer_sha256: str = Field(min_length=64, max_length=64, description="SHA-256 of tokenizer.json.")
    documents: int = Field(ge=0, description="Documents in all shards.")
    tokens: int = Field(ge=0, description="Tokens in all shards.")
    skipped: int = Field(default=0, ge=0, description="Inputs that held no text (empty or null), not kept.")
    kind: Literal["text", "chat"] = Field(
        default="text",
        description="text: every token is trained on; chat: a loss mask beside each shard marks the "
        "assistant's tokens, the only ones trained on.",
    )
    trained_tokens: int | None = Field(default=None, ge=0, description="Chat: tokens the mask trains on.")
    loss_mask_coverage: float | None = Field(
        default=None, ge=0, le=1, description="Chat: the share of all tokens the loss mask trains on."
    )
    chat_template_sha256: str | None = Field(
        default=None, min_length=64, max_length=64, description="Chat: SHA-256 of the chat template."
    )
    shards: list[ShardEntry] = Field(description="Every shard, by name.")
    settings: dict[str, str] = Field(
        default_factory=dict, description="The inputs and options of the run, to refuse a mismatched resume."
    )


def parse_manifest(text: str, uri: str) -> ShardManifest:
    """The manifest.json of the data set at `uri`; ManifestMismatch when it is not one."""
    try:
        return ShardManifest.model_validate_json(text)
    except ValueError as err:
        raise ManifestMismatch(
            f"dataset.uri {uri}: {MANIFEST_NAME} is not a shard manifest ({str(err).splitlines()[0]}); "
            "copy the one `python -m blackwell_trainer.prepare` wrote"
        ) from None


def check_manifest(
    manifest: ShardManifest,
    files: Mapping[str, int],
    *,
    uri: str,
    token_dtype: str,
    vocab_size: int,
    kind: str = "shards",
) -> None:
    """Raise ManifestMismatch when the shards at `uri` (name -> size in bytes; for chat data also each
    shard's .mask and .docs) are not the data set the manifest describes, or the data set does not fit the
    plan (dataset kind and dtype, the model's vocabulary)."""
    where = f"dataset.uri {uri}"
    if manifest.kind == "chat" and kind != "chat":
        # Reading it as plain shards would train on every token, the silent failure the mask exists for.
        raise ManifestMismatch(
            f"{where} holds chat data (a loss mask over the assistant's tokens, prepare --chat) but "
            f"dataset.kind is {kind}, which would train on every token; set spec.training.dataset.kind: chat"
        )
    if kind == "chat" and manifest.kind != "chat":
        raise ManifestMismatch(
            f"{where} holds plain token shards, with no loss mask; dataset.kind chat needs conversations "
            "prepared with `python -m blackwell_trainer.prepare --chat`, or set dataset.kind: shards"
        )
    if manifest.token_dtype != token_dtype:
        raise ManifestMismatch(
            f"{where} was prepared as {manifest.token_dtype} ({MANIFEST_NAME}) but dataset.tokenDtype is "
            f"{token_dtype}; set spec.training.dataset.tokenDtype: {manifest.token_dtype}"
        )
    if manifest.vocab_size > vocab_size:
        raise ManifestMismatch(
            f"{where} was tokenized with a vocabulary of {manifest.vocab_size} ({MANIFEST_NAME}), larger "
            f"than the model's vocabSize {vocab_size}; prepare the data with this model's own tokenizer"
        )
    itemsize = ITEMSIZE[manifest.token_dtype]
    listed = {shard.name for shard in manifest.shards}
    for shard in manifest.shards:
        size = files.get(shard.name)
        if size is None:
            raise ManifestMismatch(
                f"{where} lacks {shard.name}, which {MANIFEST_NAME} lists; copy every shard of the prepared "
                "folder (or prepare the data again)"
            )
        if size != shard.tokens * itemsize:
            raise ManifestMismatch(
                f"{where}: {shard.name} has {size} bytes but {MANIFEST_NAME} says {shard.tokens} "
                f"{manifest.token_dtype} tokens ({shard.tokens * itemsize} bytes); the copy is incomplete "
                "or another file: copy it again"
            )
    if manifest.kind == "chat":
        listed |= _check_companions(manifest, files, where)
    strays = sorted(set(files) - listed)
    if strays:
        raise ManifestMismatch(
            f"{where} holds {strays[0]}, which {MANIFEST_NAME} does not list ({len(strays)} such file(s)); "
            "remove files of other data sets from the folder or prepare them together"
        )


def _check_companions(manifest: ShardManifest, files: Mapping[str, int], where: str) -> set[str]:
    """Each chat shard's mask (a byte per token) and conversation starts (8 bytes each), by size."""
    names: set[str] = set()
    for shard in manifest.shards:
        for suffix, size in ((MASK_SUFFIX, shard.tokens), (DOCS_SUFFIX, 8 * shard.documents)):
            name = companion(shard.name, suffix)
            names.add(name)
            if files.get(name) != size:
                found = "is missing" if name not in files else f"has {files[name]} bytes, not {size}"
                raise ManifestMismatch(
                    f"{where}: {name} {found}; copy the whole folder `prepare --chat` wrote (or prepare "
                    "the data again)"
                )
    return names


def check_mask(entry: ShardEntry, name: str, crc32: str, trained: int, *, uri: str) -> str | None:
    """Whether the .mask `name`, read as `crc32` with `trained` tokens not 0, is the one `prepare --chat`
    wrote for `entry`: its trained tokens (the loss mask's coverage), then its CRC32; None when it is, else
    one line naming the file and the fix.

    A mask of the right size but other content (all ones trains on every token, the user's turns and the
    template's text included) passes the size check; this one catches it. A manifest from before mask
    checksums still has each shard's trained tokens, which the coverage check compares.
    """
    fix = "Fix: prepare the data again (python -m blackwell_trainer.prepare --chat) and copy the whole folder"
    if entry.trained_tokens is not None and trained != entry.trained_tokens:
        share, listed = trained / max(entry.tokens, 1), entry.trained_tokens / max(entry.tokens, 1)
        return (
            f"dataset.uri {uri}: {name} trains on {trained} of {entry.tokens} tokens ({share:.1%}) but "
            f"{MANIFEST_NAME} says {entry.trained_tokens} ({listed:.1%}): it is not the mask prepare wrote. "
            f"{fix}"
        )
    if entry.mask_crc32 is not None and crc32 != entry.mask_crc32:
        return (
            f"dataset.uri {uri}: {name} fails its checksum (crc32 {crc32}, {MANIFEST_NAME} says "
            f"{entry.mask_crc32}): it is not the mask prepare wrote. {fix}"
        )
    return None


def tokenizer_sha256(path: Path) -> str:
    """SHA-256 of a tokenizer.json's bytes: what the manifest records and the weights' copy is compared by."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def check_tokenizer(manifest: ShardManifest, weights_sha256: str, *, uri: str, weights_uri: str) -> None:
    """Raise ManifestMismatch when the shards at `uri` were tokenized with another tokenizer.json than the
    one of the initial weights at `weights_uri` (their ids would mean other tokens to the model)."""
    if manifest.tokenizer_sha256 != weights_sha256:
        # prepare reads a local tokenizer: for S3 weights, a downloaded copy of the folder.
        folder = "<a local copy of it>" if weights_uri.startswith("s3://") else weights_uri
        raise ManifestMismatch(
            f"dataset.uri {uri} was tokenized with another tokenizer than weights.uri {weights_uri}: "
            f"{MANIFEST_NAME} tokenizerSha256 {manifest.tokenizer_sha256}, the checkpoint's {TOKENIZER_FILE} "
            f"{weights_sha256}; prepare the data again with the checkpoint's tokenizer "
            f"(python -m blackwell_trainer.prepare ... --tokenizer {folder})"
        )


MIN_SEQUENCE_LENGTH = 128  # the CRD's least spec.training.sequenceLength


def windows(shard_tokens: Sequence[int], sequence_length: int) -> int:
    """Training samples the shards hold: non-overlapping (sequence_length + 1)-token windows per shard."""
    return sum(max(0, (tokens - 1) // sequence_length) for tokens in shard_tokens)


def too_little_data(
    shard_tokens: Sequence[int],
    *,
    uri: str,
    sequence_length: int,
    data_parallel: int,
    micro_batch_size: int,
    accumulation: int = 1,
) -> str | None:
    """Why token shards cannot feed one optimizer step (data_parallel x micro_batch_size x accumulation
    windows), with the fields that would; None when they can."""
    need = data_parallel * micro_batch_size * accumulation
    shorter = sequence_length // 2
    while shorter >= MIN_SEQUENCE_LENGTH and windows(shard_tokens, shorter) < need:
        shorter //= 2
    return step_shortfall(
        windows(shard_tokens, sequence_length),
        uri=uri,
        tokens=sum(shard_tokens),
        sequence_length=sequence_length,
        data_parallel=data_parallel,
        micro_batch_size=micro_batch_size,
        accumulation=accumulation,
        shorter=shorter if shorter >= MIN_SEQUENCE_LENGTH else None,
    )


def step_shortfall(
    have: int,
    *,
    uri: str,
    tokens: int,
    sequence_length: int,
    data_parallel: int,
    micro_batch_size: int,
    accumulation: int,
    shorter: int | None,
    samples: str = "samples",
) -> str | None:
    """Why `have` samples (windows, or packed rows) cannot feed one optimizer step, with the fields that
    would; None when they can.

    The advice is only what works: the tokens to add; the micro-batch (and the global batch) the samples
    there are feed; fewer data-parallel ranks where a micro-batch each is more than there is; `shorter`,
    a sequence length (the CRD allows) at which the data gives enough samples, where there is one.
    """
    per_micro_step = data_parallel * micro_batch_size
    need = per_micro_step * accumulation
    if have >= need:
        return None
    fixes = [f"add about {(need - have) * sequence_length:,} tokens to {uri}"]
    if have >= per_micro_step:
        fixes.append(f"a smaller spec.training.globalBatchTokens (at most {have * sequence_length:,})")
    elif have >= data_parallel:
        fixes.append(f"spec.tuning.microBatchSize: {have // data_parallel} or smaller")
    if have < per_micro_step and data_parallel > 1 and have >= micro_batch_size:
        fixes.append(
            f"fewer GPUs: at most {have // micro_batch_size} data-parallel ranks (spec.cluster.nodes)"
        )
    if shorter is not None:
        fixes.append(f"spec.training.sequenceLength: {shorter}")
    # A window holds one token more than the sequence (its last label); a packed row holds the sequence.
    size = sequence_length + 1 if samples == "samples" else sequence_length
    step = f"{data_parallel} data-parallel ranks x micro-batch {micro_batch_size}"
    if accumulation > 1:
        step += f" x {accumulation} accumulation steps"
    return (
        f"dataset.uri {uri} holds {tokens:,} tokens, {have:,} {samples} of {size} tokens, "
        f"fewer than one step needs ({step} = {need:,} {samples}). Fix: " + "; or ".join(fixes)
    )
