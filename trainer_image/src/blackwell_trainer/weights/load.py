"""Load a Hugging Face checkpoint into the (FSDP2-sharded) model: each rank reads only its own slices."""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard

from blackwell_trainer.data.tokens import DataError
from blackwell_trainer.plan.config import (
    Architecture,
    HfConfigError,
    architecture_from_hf_config,
    architecture_mismatch,
)
from blackwell_trainer.plan.shard_manifest import (
    TOKENIZER_FILE,
    ManifestMismatch,
    ShardManifest,
    check_tokenizer,
    tokenizer_sha256,
)
from blackwell_trainer.plan.units import GIB
from blackwell_trainer.weights.hf_layout import IGNORED_HF_SUFFIXES, clean_fqn, hf_name
from blackwell_trainer.weights.store import HfCheckpoint, WeightsError, open_checkpoint

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadReport:
    """What one rank loaded: tensors, the bytes of its slices, and how long it took."""

    uri: str
    tensors: int
    bytes_read: int
    seconds: float


def check_architecture(checkpoint: HfCheckpoint, arch: Architecture, sequence_length: int) -> None:
    """Refuse a checkpoint whose config.json is not the plan's architecture (WeightsError, one line)."""
    try:
        theirs = architecture_from_hf_config(checkpoint.config, sequence_length=sequence_length)
    except (HfConfigError, ValueError) as err:
        raise WeightsError(f"weights.uri {checkpoint.uri}: {err}") from None
    mismatch = architecture_mismatch(arch, theirs)
    if mismatch:
        raise WeightsError(
            f"weights.uri {checkpoint.uri}: {mismatch}; plan with the checkpoint's architecture "
            "(btj plan reads it from a local folder) or point weights.uri at the right checkpoint"
        )


def check_data_tokenizer(weights_uri: str, dataset_uri: str, manifest: ShardManifest | None) -> None:
    """Refuse token shards prepared with another tokenizer.json than the initial weights' (DataError).

    Where either side has no tokenizer to compare (shards without a manifest, a checkpoint without a
    tokenizer.json), nothing can be checked: one warning says so and training goes on.
    """
    if manifest is None:
        log.warning(
            "dataset.uri %s has no manifest.json: its tokenizer is not checked against weights.uri %s",
            dataset_uri,
            weights_uri,
        )
        return
    # config.json and the tokenizer files only (on S3: these small files, not the tensors).
    theirs = next(
        (f for f in open_checkpoint(weights_uri, tensors=False).tokenizer_files if f.name == TOKENIZER_FILE),
        None,
    )
    if theirs is None:
        log.warning(
            "weights.uri %s has no %s: the tokenizer dataset.uri %s was prepared with (sha256 %s) is not "
            "checked against it",
            weights_uri,
            TOKENIZER_FILE,
            dataset_uri,
            manifest.tokenizer_sha256,
        )
        return
    try:
        check_tokenizer(manifest, tokenizer_sha256(theirs), uri=dataset_uri, weights_uri=weights_uri)
    except ManifestMismatch as err:
        raise DataError(str(err)) from None
    log.info(
        "dataset.uri %s was prepared with weights.uri %s's %s (sha256 %s)",
        dataset_uri,
        weights_uri,
        TOKENIZER_FILE,
        manifest.tokenizer_sha256,
    )


def local_region(tensor: torch.Tensor) -> tuple[slice, ...]:
    """The index region of the global tensor that this rank's shard of `tensor` holds.

    FSDP2 shards dim 0 the way torch.chunk does (ceil-sized pieces, the last ones shorter or empty);
    Replicate dims hold everything. Other placements are refused rather than guessed.
    """
    if not isinstance(tensor, DTensor):
        return tuple(slice(0, n) for n in tensor.shape)
    local_shape = tensor.to_local().shape
    starts = [0] * tensor.dim()
    coordinate = tensor.device_mesh.get_coordinate()
    assert coordinate is not None, "this rank is not in the parameter's mesh"
    sharded: set[int] = set()
    for mesh_dim, placement in enumerate(tensor.placements):
        if isinstance(placement, Replicate):
            continue
        if type(placement) is not Shard or placement.dim in sharded:
            raise WeightsError(f"cannot load into a parameter placed as {tensor.placements}")
        dim = placement.dim
        sharded.add(dim)
        chunk = math.ceil(tensor.shape[dim] / tensor.device_mesh.size(mesh_dim))
        starts[dim] = min(coordinate[mesh_dim] * chunk, tensor.shape[dim])
    region = tuple(slice(s, s + n) for s, n in zip(starts, local_shape, strict=True))
    for r, full in zip(region, tensor.shape, strict=True):
        assert r.stop <= full, f"shard region {region} outside {tuple(tensor.shape)}"
    return region


def _targets(model: nn.Module) -> dict[str, torch.Tensor]:
    """Hugging Face tensor name -> the model's parameter (sharded or not)."""
    return {hf_name(clean_fqn(fqn)): p for fqn, p in model.named_parameters()}


def _plan_reads(
    checkpoint: HfCheckpoint, targets: dict[str, torch.Tensor], tied: bool
) -> dict[Path, list[str]]:
    """Which tensors to read from which file; WeightsError for a tensor missing or left over."""
    available = set(checkpoint.tensor_files)
    missing = sorted(set(targets) - available)
    if missing:
        raise WeightsError(
            f"weights.uri {checkpoint.uri} has no tensor {missing[0]} ({len(missing)} missing); is it a "
            "checkpoint of this architecture?"
        )
    extra = sorted(
        n
        for n in available - set(targets)
        if not n.endswith(IGNORED_HF_SUFFIXES) and not (tied and n == "lm_head.weight")
    )
    if extra:
        raise WeightsError(
            f"weights.uri {checkpoint.uri} has tensor {extra[0]} the plan's architecture has no place for "
            f"({len(extra)} such); check architecture.attentionBias and tieWordEmbeddings"
        )
    by_file: dict[Path, list[str]] = defaultdict(list)
    for name in targets:
        by_file[checkpoint.tensor_files[name]].append(name)
    return by_file


@torch.no_grad()
def load_into(model: nn.Module, checkpoint: HfCheckpoint, *, tied: bool) -> tuple[int, int]:
    """Copy every parameter's slice from the checkpoint, tensor by tensor; (tensors, bytes read)."""
    from safetensors import safe_open

    targets = _targets(model)
    count = read = 0
    for path, names in _plan_reads(checkpoint, targets, tied).items():
        with safe_open(str(path), framework="pt") as f:
            for name in names:
                param = targets[name]
                stored = f.get_slice(name)
                shape = tuple(stored.get_shape())
                if shape != tuple(param.shape):
                    raise WeightsError(
                        f"weights.uri {checkpoint.uri}: tensor {name} is {list(shape)} but the plan's "
                        f"architecture needs {list(param.shape)}"
                    )
                local = param.to_local() if isinstance(param, DTensor) else param
                count += 1
                if local.numel() == 0:
                    continue  # this rank holds no rows of it (more ranks than rows)
                # Only this rank's rows are read from the file (safetensors maps it, reads the range).
                part = stored[local_region(param)]
                local.copy_(part.to(device=local.device, dtype=local.dtype, non_blocking=True))
                read += part.numel() * part.element_size()
    return count, read


def load_pretrained(model: nn.Module, uri: str, arch: Architecture, sequence_length: int) -> LoadReport:
    """Check the checkpoint at `uri` against the plan's architecture, then load it into `model`.

    Call after the model has storage (parallelize); the RoPE tables come from the architecture. Every
    rank calls it and reads only the slices it holds: no rank materialises the full model.
    """
    started = time.perf_counter()
    checkpoint = open_checkpoint(uri)
    check_architecture(checkpoint, arch, sequence_length)
    tensors, read = load_into(model, checkpoint, tied=arch.tie_word_embeddings)
    if torch.cuda.is_available():
        torch.cuda.synchronize()  # the copies are asynchronous: the time below includes them
    seconds = time.perf_counter() - started
    log.info(
        "loaded %d tensors (%.2f GiB of this rank's slices) from %s in %.1f s",
        tensors,
        read / GIB,
        uri,
        seconds,
    )
    return LoadReport(uri=uri, tensors=tensors, bytes_read=read, seconds=seconds)
