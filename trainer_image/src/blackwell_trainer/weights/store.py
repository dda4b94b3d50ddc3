"""Where weights live: a Hugging Face folder on a volume, or an s3:// prefix cached on the node's disk."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from blackwell_trainer.checkpoint.store import StorageFailed
from blackwell_trainer.weights.hf_layout import CONFIG_FILE, INDEX_FILE, SINGLE_FILE, TOKENIZER_FILES

log = logging.getLogger(__name__)


class WeightsError(ValueError):
    """Weights that cannot be read or do not fit the plan; one line naming the field and the fix."""


class WeightsUnavailable(StorageFailed):
    """S3 did not serve the weights (denied, no such bucket, unreachable): a restart may help."""


@dataclass(frozen=True)
class S3Prefix:
    """An s3://bucket/prefix/ (the prefix empty or ending in '/')."""

    bucket: str
    prefix: str

    @classmethod
    def parse(cls, uri: str, field: str) -> S3Prefix:
        bucket, _, prefix = uri.removeprefix("s3://").partition("/")
        if not bucket:
            raise WeightsError(f"{field} {uri} has no bucket; write it as s3://bucket/prefix")
        if prefix and not prefix.endswith("/"):
            prefix += "/"  # s3://b/model must not also match s3://b/model-old/
        return cls(bucket, prefix)

    def uri(self, name: str) -> str:
        return f"s3://{self.bucket}/{self.prefix}{name}"


def s3_client() -> Any:
    """A boto3 S3 client; AWS_ENDPOINT_URL (MinIO, moto) honoured; adaptive retries on 503 SlowDown."""
    import boto3  # only S3 weights need it
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=os.environ.get("AWS_ENDPOINT_URL") or None,
        config=Config(retries={"mode": "adaptive", "max_attempts": 10}),
    )


@dataclass(frozen=True)
class HfCheckpoint:
    """A Hugging Face checkpoint as local files: its config, which file holds each tensor, its tokenizer."""

    uri: str
    folder: Path
    config: dict[str, Any]
    tensor_files: dict[str, Path]  # tensor name -> the safetensors file holding it
    tokenizer_files: tuple[Path, ...]


def _wanted(name: str, tensors: bool) -> bool:
    return name in (CONFIG_FILE, INDEX_FILE, *TOKENIZER_FILES) or (tensors and name.endswith(".safetensors"))


def _local_folder(uri: str, tensors: bool) -> Path:
    """The folder itself, or for s3:// the node's cached copy (each file downloaded once per node)."""
    if not uri.startswith("s3://"):
        folder = Path(uri)
        if not folder.is_dir():
            raise WeightsError(
                f"weights.uri {uri} is not a folder; mount the volume holding the checkpoint or give s3://"
            )
        return folder
    # The shard cache's downloader: one download per node under a file lock, re-fetched when the ETag
    # changes, least recently used token shards evicted to make room (it never evicts weights).
    from botocore.exceptions import BotoCoreError, ClientError

    from blackwell_trainer.cloud_errors import raise_if_permanent
    from blackwell_trainer.data.shard_cache import cache_dir, download_once

    where = S3Prefix.parse(uri, "weights.uri")
    client = s3_client()
    folder = cache_dir() / "weights" / where.bucket / where.prefix
    found = 0
    try:
        for page in client.get_paginator("list_objects_v2").paginate(
            Bucket=where.bucket, Prefix=where.prefix
        ):
            for obj in page.get("Contents", []):
                name = str(obj["Key"]).removeprefix(where.prefix)
                if "/" in name or not _wanted(name, tensors):
                    continue
                etag = str(obj.get("ETag", "")).strip('"')
                download_once(client, where.bucket, str(obj["Key"]), folder / name, int(obj["Size"]), etag)
                found += 1
    except (BotoCoreError, ClientError) as err:
        raise_if_permanent(err, "weights.uri", uri)  # AccessDenied, NoSuchBucket: no restart helps
        raise WeightsUnavailable(
            f"weights.uri {uri} could not be read from S3: {' '.join(str(err).split())}; check the bucket, "
            "the prefix and the pod's S3 permissions"
        ) from None
    if not found:
        raise WeightsError(
            f"weights.uri {uri} holds no Hugging Face checkpoint files (config.json, *.safetensors)"
        )
    return folder


def _tensor_files(folder: Path, uri: str) -> dict[str, Path]:
    """Tensor name -> file, from the index of a sharded checkpoint or the header of the single file."""
    index = folder / INDEX_FILE
    if index.is_file():
        weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        files = {name: folder / file for name, file in weight_map.items()}
        absent = sorted({p.name for p in files.values() if not p.is_file()})
        if absent:
            raise WeightsError(f"weights.uri {uri}: {INDEX_FILE} names {absent[0]}, which is not there")
        return files
    from safetensors import safe_open

    shards = (
        [folder / SINGLE_FILE] if (folder / SINGLE_FILE).is_file() else sorted(folder.glob("*.safetensors"))
    )
    if not shards:
        raise WeightsError(
            f"weights.uri {uri} holds no *.safetensors files (PyTorch .bin checkpoints are not read)"
        )
    if len(shards) > 1:
        raise WeightsError(f"weights.uri {uri} holds {len(shards)} safetensors files but no {INDEX_FILE}")
    with safe_open(str(shards[0]), framework="pt") as f:
        return {name: shards[0] for name in f.keys()}  # noqa: SIM118 (safe_open is no Mapping)


def open_checkpoint(uri: str, *, tensors: bool = True) -> HfCheckpoint:
    """The checkpoint at `uri` (a folder or s3:// prefix), its config.json read; `tensors`=False skips the
    tensor index (what an export needs from the input: config and tokenizer)."""
    folder = _local_folder(uri, tensors)
    try:
        config: dict[str, Any] = json.loads((folder / CONFIG_FILE).read_text())
    except FileNotFoundError:
        raise WeightsError(
            f"weights.uri {uri} has no {CONFIG_FILE}; save the model with save_pretrained"
        ) from None
    except json.JSONDecodeError as err:
        raise WeightsError(f"weights.uri {uri}: {CONFIG_FILE} is not JSON ({err})") from None
    return HfCheckpoint(
        uri=uri,
        folder=folder,
        config=config,
        tensor_files=_tensor_files(folder, uri) if tensors else {},
        tokenizer_files=tuple(folder / n for n in TOKENIZER_FILES if (folder / n).is_file()),
    )
