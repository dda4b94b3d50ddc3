"""What `btj plan` checks of spec.training.dataset where it is a folder on this machine: its manifest.json."""

from __future__ import annotations

from pathlib import Path

from blackwell_trainer.config import DatasetKind, Plan
from blackwell_trainer.shard_manifest import (
    COMPANION_SUFFIXES,
    MANIFEST_NAME,
    TOKENIZER_FILE,
    check_manifest,
    check_tokenizer,
    parse_manifest,
    tokenizer_sha256,
)


def _local_folder(uri: str | None) -> Path | None:
    """The folder `uri` names when this machine has it (a login node mounting the same FSx path)."""
    if not uri or uri.startswith("s3://") or not Path(uri).is_dir():
        return None
    return Path(uri)


def check_local_dataset(plan: Plan) -> None:
    """Refuse a prepared data set readable here that the trainer would refuse at start, with the trainer's
    own line (ManifestMismatch): its manifest's dtype, vocabulary and shard files against the plan, and
    its tokenizer against the initial weights' tokenizer.json where both are readable here too.

    Nothing is checked for S3, a folder this machine does not have, or shards without a manifest (the
    trainer checks the first two at start; the last it cannot check either).
    """
    dataset = plan.dataset
    root = _local_folder(dataset.uri) if dataset.kind in (DatasetKind.SHARDS, DatasetKind.CHAT) else None
    if root is None or not (root / MANIFEST_NAME).is_file():
        return
    uri = str(dataset.uri)
    manifest = parse_manifest((root / MANIFEST_NAME).read_text(errors="replace"), uri)
    files = {f.name: f.stat().st_size for f in root.glob("*.bin")}
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
    weights_uri = plan.weights.uri if plan.weights else None
    weights = _local_folder(weights_uri)
    if weights_uri and weights is not None and (weights / TOKENIZER_FILE).is_file():
        check_tokenizer(
            manifest, tokenizer_sha256(weights / TOKENIZER_FILE), uri=uri, weights_uri=weights_uri
        )
