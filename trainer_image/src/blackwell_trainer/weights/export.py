"""Write weights as a Hugging Face checkpoint (sharded safetensors, index, config.json, tokenizer), streamed.

Tensors arrive one at a time (gathered from the FSDP2 shards, or read from a distributed checkpoint);
the writing rank holds at most one output file's worth (``max_shard_bytes``) before writing it, so no
rank ever holds the whole model.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from blackwell_trainer.checkpoint.store import StorageFailed
from blackwell_trainer.cloud_errors import PermanentCloudError, raise_if_permanent
from blackwell_trainer.plan.config import EXPORT_FILE_BYTES, PERMANENT_ERROR_PREFIX, Architecture
from blackwell_trainer.weights.hf_layout import (
    CONFIG_FILE,
    INDEX_FILE,
    SINGLE_FILE,
    clean_fqn,
    export_config,
    export_dtype,
    hf_name,
)
from blackwell_trainer.weights.store import S3Prefix, WeightsError, open_checkpoint, s3_client

log = logging.getLogger(__name__)

# At most this many bytes per safetensors file (the writer's buffer); Hugging Face's default is 5 GB.
DEFAULT_MAX_SHARD_BYTES = EXPORT_FILE_BYTES
SHARD_FILE = "model-{index:05d}-of-{total:05d}.safetensors"


class ExportFailed(StorageFailed):
    """The output storage did not take the export (full, denied, unreachable): a restart may help."""


@dataclass(frozen=True)
class ExportTensor:
    """One tensor of the export: its Hugging Face name, global shape, and how to get it in full.

    `fetch` may be a collective (gathering FSDP2 shards): every rank calls it, in the same order.
    """

    name: str
    shape: tuple[int, ...]
    fetch: Callable[[], torch.Tensor]


def shard_files(
    tensors: Sequence[ExportTensor], itemsize: int, max_shard_bytes: int
) -> list[list[ExportTensor]]:
    """Consecutive groups of tensors, each under max_shard_bytes (a larger tensor gets a file of its own)."""
    groups: list[list[ExportTensor]] = [[]]
    size = 0
    for tensor in tensors:
        nbytes = itemsize * int(torch.Size(tensor.shape).numel())
        if groups[-1] and size + nbytes > max_shard_bytes:
            groups.append([])
            size = 0
        groups[-1].append(tensor)
        size += nbytes
    return [g for g in groups if g]


class Destination(Protocol):
    """Where an export's files go; ``commit`` makes them visible as a whole where the storage allows."""

    def write(self, name: str, produce: Callable[[Path], None]) -> None: ...

    def commit(self, names: set[str]) -> None: ...

    def abort(self) -> None: ...


class FolderDestination:
    """A folder: written beside the target, then swapped into place (a crash leaves the old export)."""

    def __init__(self, uri: str) -> None:
        self.final = Path(uri)
        self.final.parent.mkdir(parents=True, exist_ok=True)
        self.staging = self.final.parent / f".{self.final.name}.partial-{os.getpid()}"
        shutil.rmtree(self.staging, ignore_errors=True)
        self.staging.mkdir()

    def write(self, name: str, produce: Callable[[Path], None]) -> None:
        produce(self.staging / name)

    def commit(self, names: set[str]) -> None:
        old = self.final.parent / f".{self.final.name}.old-{os.getpid()}"
        if self.final.exists():
            os.rename(self.final, old)
        os.rename(self.staging, self.final)
        shutil.rmtree(old, ignore_errors=True)

    def abort(self) -> None:
        shutil.rmtree(self.staging, ignore_errors=True)


class S3Destination:
    """An s3:// prefix: each file staged on local disk, uploaded (multipart) and deleted; config.json goes
    last, and files of an earlier export under the prefix that this one did not write are removed."""

    def __init__(self, uri: str, staging_root: Path) -> None:
        self.where = S3Prefix.parse(uri, "output.uri")
        self.client = s3_client()
        staging_root.mkdir(parents=True, exist_ok=True)
        self.staging = Path(tempfile.mkdtemp(prefix="export-", dir=staging_root))

    def write(self, name: str, produce: Callable[[Path], None]) -> None:
        local = self.staging / name
        produce(local)
        try:
            self.client.upload_file(str(local), self.where.bucket, self.where.prefix + name)
        except Exception as err:  # boto3's S3UploadFailedError wraps the ClientError
            raise_if_permanent(err, "output.uri", self.where.uri(name))
            raise
        finally:
            local.unlink(missing_ok=True)

    def commit(self, names: set[str]) -> None:
        """Remove the files of an earlier export this one did not write (needs s3:DeleteObject)."""
        paginator = self.client.get_paginator("list_objects_v2")
        key = self.where.prefix
        try:
            for page in paginator.paginate(Bucket=self.where.bucket, Prefix=self.where.prefix):
                for obj in page.get("Contents", []):
                    key = str(obj["Key"])
                    name = key.removeprefix(self.where.prefix)
                    if name not in names and "/" not in name and name.endswith((".safetensors", INDEX_FILE)):
                        self.client.delete_object(Bucket=self.where.bucket, Key=key)
        except Exception as err:
            raise_if_permanent(err, "output.uri", f"s3://{self.where.bucket}/{key}")
            raise
        self.abort()

    def abort(self) -> None:
        shutil.rmtree(self.staging, ignore_errors=True)


def destination(uri: str) -> Destination:
    if uri.startswith("s3://"):
        from blackwell_trainer.data.shard_cache import cache_dir

        return S3Destination(uri, cache_dir() / "export-staging")
    if "://" in uri:
        raise WeightsError(f"output.uri {uri}: give a folder on a mounted volume or an s3:// prefix")
    return FolderDestination(uri)


def _save_safetensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    from safetensors.torch import save_file

    save_file(tensors, str(path), metadata={"format": "pt"})


def _json_writer(value: Any) -> Callable[[Path], None]:
    def produce(path: Path) -> None:
        path.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n")

    return produce


def write_hf(
    tensors: Sequence[ExportTensor],
    uri: str,
    *,
    config: dict[str, Any],
    dtype: torch.dtype,
    extra_files: Iterable[Path] = (),
    is_writer: bool = True,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
) -> str | None:
    """Stream `tensors` into a Hugging Face checkpoint at `uri` (folder or s3://); every rank calls it.

    Only the writer touches storage; the others only take part in each `fetch`. The writer returns the
    first error as one line (and keeps fetching so that no rank waits in a collective), else None.
    """
    groups = shard_files(tensors, torch.empty((), dtype=dtype).element_size(), max_shard_bytes)
    files = (
        [SINGLE_FILE]
        if len(groups) == 1
        else [SHARD_FILE.format(index=i + 1, total=len(groups)) for i in range(len(groups))]
    )
    error: str | None = None
    dest: Destination | None = None
    if is_writer:
        try:
            dest = destination(uri)
        except (OSError, WeightsError) as err:
            error = str(err) if isinstance(err, WeightsError) else f"output.uri {uri}: {err}"
    weight_map: dict[str, str] = {}
    total = 0
    for group, file in zip(groups, files, strict=True):
        buffer: dict[str, torch.Tensor] = {}
        for tensor in group:
            full = tensor.fetch()
            if is_writer and error is None:
                buffer[tensor.name] = full.detach().to(dtype).cpu().contiguous()
                weight_map[tensor.name] = file
                total += buffer[tensor.name].numel() * buffer[tensor.name].element_size()
            del full
        if dest is not None and error is None:
            try:
                dest.write(file, functools.partial(_save_safetensors, buffer))
            except PermanentCloudError as err:
                error = f"{PERMANENT_ERROR_PREFIX}{err}"  # AccessDenied, NoSuchBucket: no restart helps
            except Exception as err:  # OSError, botocore's ClientError / S3UploadFailedError
                error = f"output.uri {uri}: writing {file} failed: {' '.join(str(err).split())}"
        buffer.clear()
    if dest is None:
        return error
    try:
        if error is None:
            if len(files) > 1:
                dest.write(
                    INDEX_FILE, _json_writer({"metadata": {"total_size": total}, "weight_map": weight_map})
                )
            for extra in extra_files:
                dest.write(extra.name, functools.partial(shutil.copyfile, extra))
            dest.write(CONFIG_FILE, _json_writer(config))  # last: a reader finds config.json only when done
            # A stale index of an earlier, sharded export must go too when this one is a single file.
            written = {*files, CONFIG_FILE, *(p.name for p in extra_files)}
            dest.commit(written | {INDEX_FILE} if len(files) > 1 else written)
    except PermanentCloudError as err:
        error = f"{PERMANENT_ERROR_PREFIX}{err}"
    except Exception as err:
        error = f"output.uri {uri}: {' '.join(str(err).split())}"
    if error is not None:
        dest.abort()
    return error


def model_tensors(model: nn.Module, dtype: torch.dtype) -> list[ExportTensor]:
    """The trainer model's parameters as export tensors; fetching gathers a DTensor's shards (collective).

    Each shard is cast to the export dtype before the gather: the full tensor every rank holds for a
    moment (the embedding: 2 GiB in bf16 for Llama-3.1-70B) is then half the fp32 master's size.
    """

    def fetch(param: torch.Tensor) -> Callable[[], torch.Tensor]:
        def gather() -> torch.Tensor:
            cast = param.to(dtype)
            return cast.full_tensor() if isinstance(cast, DTensor) else cast

        return gather

    return [
        ExportTensor(hf_name(clean_fqn(fqn)), tuple(p.shape), fetch(p)) for fqn, p in model.named_parameters()
    ]


def input_checkpoint(weights_uri: str | None) -> tuple[dict[str, Any] | None, tuple[Path, ...]]:
    """The input checkpoint's config.json and tokenizer files (None and none without one)."""
    if weights_uri is None:
        return None, ()
    source = open_checkpoint(weights_uri, tensors=False)
    return source.config, source.tokenizer_files


@torch.no_grad()
def export_model(
    model: nn.Module,
    arch: Architecture,
    uri: str,
    *,
    sequence_length: int,
    weights_uri: str | None,
    is_writer: bool,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
) -> float:
    """Export the trained model (collective: every rank calls it); the seconds it took.

    The dtype is the input checkpoint's (config.json dtype), bfloat16 without one. ExportFailed on every
    rank when the writer could not write (the caller agrees on the writer's verdict, see ``agree``).
    """
    import torch.distributed as dist

    started = time.perf_counter()
    base, tokenizer = input_checkpoint(weights_uri)  # on every rank: an error there is raised by all
    dtype = export_dtype(base)
    config = export_config(arch, dtype=dtype, max_positions=sequence_length, base=base)
    error = write_hf(
        model_tensors(model, dtype),
        uri,
        config=config,
        dtype=dtype,
        extra_files=tokenizer,
        is_writer=is_writer,
        max_shard_bytes=max_shard_bytes,
    )
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        verdict: list[Any] = [error]
        dist.broadcast_object_list(verdict, src=0)
        error = verdict[0]
        dist.barrier()
    if error is not None and error.startswith(PERMANENT_ERROR_PREFIX):
        # The writer's refusal no restart changes (a missing s3:PutObject or s3:DeleteObject): on every rank.
        raise PermanentCloudError(
            f"export of the trained weights not written: {error.removeprefix(PERMANENT_ERROR_PREFIX)}"
        )
    if error is not None:
        raise ExportFailed(f"export of the trained weights not written: {error}")
    seconds = time.perf_counter() - started
    if is_writer:
        log.info("exported the trained weights to %s (%s) in %.1f s", uri, dtype, seconds)
    return seconds
