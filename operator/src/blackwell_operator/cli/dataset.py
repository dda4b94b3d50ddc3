"""What `btj plan` checks of spec.training.dataset where it is a folder on this machine: manifest, samples."""

from __future__ import annotations

from pathlib import Path

from blackwell_trainer.plan.config import DatasetKind, Plan
from blackwell_trainer.plan.shard_manifest import (
    COMPANION_SUFFIXES,
    ITEMSIZE,
    MANIFEST_NAME,
    TOKENIZER_FILE,
    ManifestMismatch,
    ShardManifest,
    check_manifest,
    check_tokenizer,
    parse_manifest,
    tokenizer_sha256,
    too_little_data,
)


def _local_folder(uri: str | None) -> Path | None:
    """The folder `uri` names when this machine has it (a login node mounting the same FSx path)."""
    if not uri or uri.startswith("s3://") or not Path(uri).is_dir():
        return None
    return Path(uri)


def check_local_dataset(plan: Plan) -> ShardManifest | None:
    """Refuse a prepared data set readable here that the trainer would refuse at start, with the trainer's
    own line (ManifestMismatch): its manifest's dtype, vocabulary and shard files against the plan, its
    tokenizer against the initial weights' tokenizer.json where both are readable here too, and whether
    token shards hold the samples of one optimizer step of the plan (with or without a manifest).

    Nothing is checked for S3 or a folder this machine does not have (the trainer checks both at start).
    Returns the data set's manifest where one was read (its facts go into the plan's explanation).
    """
    dataset = plan.dataset
    root = _local_folder(dataset.uri) if dataset.kind in (DatasetKind.SHARDS, DatasetKind.CHAT) else None
    if root is None:
        return None
    uri = str(dataset.uri)
    manifest: ShardManifest | None = None
    files = {f.name: f.stat().st_size for f in root.glob("*.bin")}
    shard_tokens = [size // ITEMSIZE[dataset.token_dtype] for size in files.values()]
    if (root / MANIFEST_NAME).is_file():
        manifest = parse_manifest((root / MANIFEST_NAME).read_text(errors="replace"), uri)
        if dataset.kind == DatasetKind.CHAT:  # each shard's mask and conversation starts are checked too
            files |= {f.name: f.stat().st_size for s in COMPANION_SUFFIXES for f in root.glob(f"*{s}")}
        check_manifest(
            manifest,
            files,
            uri=uri,
            token_dtype=dataset.token_dtype,
            vocab_size=plan.architecture.vocab_size,
            kind=dataset.kind.value,
        )
        shard_tokens = [shard.tokens for shard in manifest.shards]
        weights_uri = plan.weights.uri if plan.weights else None
        weights = _local_folder(weights_uri)
        if weights_uri and weights is not None and (weights / TOKENIZER_FILE).is_file():
            check_tokenizer(
                manifest, tokenizer_sha256(weights / TOKENIZER_FILE), uri=uri, weights_uri=weights_uri
            )
    # Chat data packs conversations into rows (the trainer counts them); token shards are windows.
    if dataset.kind != DatasetKind.SHARDS or not shard_tokens:
        return (
            manifest  # no shards yet: the trainer names that at start (the folder may be filled before then)
        )
    problem = too_little_data(
        shard_tokens,
        uri=uri,
        sequence_length=plan.sequence_length,
        data_parallel=plan.world_size // plan.chosen.context_parallel,
        micro_batch_size=plan.chosen.micro_batch_size,
        accumulation=plan.chosen.gradient_accumulation_steps,
    )
    if problem is not None:
        raise ManifestMismatch(problem)
    return manifest


def describe_chat_data(manifest: ShardManifest, uri: str) -> str:
    """The explanation's line on a chat data set: how much of it the mask trains on, and its template."""
    return (
        f"dataset.uri {uri}: {manifest.documents:,} conversations, {manifest.tokens:,} tokens, "
        f"{manifest.trained_tokens or 0:,} trained on ({manifest.loss_mask_coverage or 0:.1%}: the "
        f"assistant's replies), chat template sha256 {manifest.chat_template_sha256}"
    )
