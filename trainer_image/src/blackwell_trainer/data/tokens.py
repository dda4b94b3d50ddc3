"""Training batches: a learnable synthetic task, or memory-mapped token shards from a path or s3://."""

from __future__ import annotations

import bisect
import functools
import hashlib
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from blackwell_trainer.cloud_errors import raise_if_permanent
from blackwell_trainer.data.shard_cache import cache_dir, download_once
from blackwell_trainer.errors import DataError as DataError  # re-exported: the data source's error
from blackwell_trainer.plan.config import DatasetConfig, DatasetKind
from blackwell_trainer.plan.shard_manifest import (
    COMPANION_SUFFIXES,
    MANIFEST_NAME,
    ManifestMismatch,
    ShardManifest,
    check_manifest,
    companion,
    parse_manifest,
    too_little_data,
)

log = logging.getLogger(__name__)

STATE_VERSION = 1
# Strides of the synthetic sequences: more than one, so the next token depends on the previous two
# (the model must attend), few enough that a tiny model learns it in a few dozen steps.
SYNTHETIC_STRIDES = (1, 2, 3)
MAX_OPEN_SHARDS = 8
# How long close() waits for a background shard download before it leaves it behind (a download is
# written beside the shard and renamed into place, so one cut short leaves no half-written shard).
PREFETCH_JOIN_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Batch:
    """One micro-batch, the one shape of every source: int64 [micro_batch_size, sequence_length] each, on
    the CPU, the labels shifted by one (IGNORE_INDEX where nothing is trained on).

    `documents`: for packed chat rows, each token's document number in its row (document_mask.py), and the
    step's loss is then the mean over the trained tokens of the whole step; None for plain token data,
    where every label is trained on.
    """

    inputs: torch.Tensor
    labels: torch.Tensor
    documents: torch.Tensor | None = None


class TokenSource(Protocol):
    """What the training loop reads batches from; its position travels in checkpoints."""

    def next_batch(self) -> Batch:
        """This rank's next micro-batch."""
        ...

    position: GlobalPosition  # where the whole job is in the data (the same on every rank)
    samples_per_epoch: int | None  # None: an endless source

    @property
    def uri(self) -> str | None:
        """The data set's folder or s3:// prefix; None for synthetic tokens (no tokenizer to check)."""
        ...

    @property
    def manifest(self) -> ShardManifest | None:
        """The data set's checked manifest.json, where it has one."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """The position, identical on every rank (see `GlobalPosition`)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue exactly after the batch that was last returned when `state` was taken."""
        ...

    def close(self) -> None:
        """Stop and join this source's background work (the trainer calls it before it tears down)."""
        ...


@dataclass(frozen=True)
class DataLayout:
    """What one data-parallel rank reads: the batch shape, the vocabulary, and its place among the ranks.

    `rank` and `world_size` count data-parallel ranks (ranks that see different data): the peers of one
    context-parallel group share a data rank.
    """

    micro_batch_size: int  # sequences per batch on this rank
    sequence_length: int  # tokens per sequence (inputs and labels each)
    vocab_size: int  # the model's vocabulary: shard tokens at or above it are an error
    rank: int = 0
    world_size: int = 1
    accumulation: int = 1  # micro-batches per optimizer step: the data must feed one whole step

    @property
    def step_samples(self) -> int:
        """The global batch in sequences: one optimizer step over all data-parallel ranks."""
        return self.world_size * self.micro_batch_size * self.accumulation


@dataclass
class GlobalPosition:
    """Where the whole job is in the data, independent of the number of ranks.

    Every micro-step each of the `world_size` ranks takes `micro_batch_size` consecutive samples from
    one global sequence: rank r takes samples [consumed + r*mbs, consumed + (r+1)*mbs). All ranks then
    advance `consumed` by world_size*mbs, so every rank holds the same position. Optimizer step s
    therefore trains global samples [s*B, (s+1)*B) of the epoch, B = `samples_per_step`, whatever the
    ranks, micro-batch and accumulation: a resume with another layout and the same global batch
    continues exactly, no sample skipped or repeated (unlike a per-rank iterator position, which
    torchtitan PR #816 had to refuse to reshard). An epoch's tail shorter than one global batch is
    dropped, decided at step boundaries, so it too is the same on every layout.
    """

    rank: int
    world_size: int
    micro_batch_size: int
    samples_per_step: int
    epoch: int = 0
    consumed: int = 0
    # The epoch and sample indices of the batch last taken (for the sample ledger).
    last: tuple[int, list[int]] = field(default_factory=lambda: (0, []))

    def take(self, samples_per_epoch: int | None) -> tuple[int, list[int]]:
        """The epoch and global sample indices of this rank's next batch; advances the position."""
        at_step_start = self.consumed % self.samples_per_step == 0
        if (
            samples_per_epoch is not None
            and at_step_start
            and self.consumed + self.samples_per_step > samples_per_epoch
        ):
            # The tail of an epoch that cannot fill a global batch is dropped, the same on every layout.
            self.epoch += 1
            self.consumed = 0
        start = self.consumed + self.rank * self.micro_batch_size
        self.consumed += self.world_size * self.micro_batch_size
        self.last = (self.epoch, list(range(start, start + self.micro_batch_size)))
        return self.last

    def at_step(self, step: int, samples_per_epoch: int | None) -> tuple[int, int]:
        """(epoch, consumed) where optimizer step `step` leaves the position under this global batch."""
        if samples_per_epoch is None:
            return 0, step * self.samples_per_step
        per_epoch = samples_per_epoch // self.samples_per_step
        return step // per_epoch, (step % per_epoch) * self.samples_per_step

    def settled(self, samples_per_epoch: int | None) -> tuple[int, int]:
        """(epoch, consumed), with an epoch whose tail cannot fill another global batch counted as over
        (take() moves to the next epoch only when it is next asked for a batch)."""
        if (
            samples_per_epoch is not None
            and self.consumed % self.samples_per_step == 0
            and self.consumed + self.samples_per_step > samples_per_epoch
        ):
            return self.epoch + 1, 0
        return self.epoch, self.consumed

    @classmethod
    def start(cls, layout: DataLayout) -> GlobalPosition:
        return cls(
            rank=layout.rank,
            world_size=layout.world_size,
            micro_batch_size=layout.micro_batch_size,
            samples_per_step=layout.step_samples,
        )


def _check_state(state: dict[str, Any], *, kind: str, expected: dict[str, Any]) -> None:
    """Refuse a state from another kind of source, version, sequence length or data set."""
    if state.get("kind") != kind:
        raise DataError(
            f"checkpoint data state is for a '{state.get('kind')}' source but dataset.kind is '{kind}'; "
            "resume with the dataset the checkpoint was written with, or start a new checkpoint.path"
        )
    if state.get("version") != STATE_VERSION:
        raise DataError(f"checkpoint data state version {state.get('version')} is not {STATE_VERSION}")
    for key, want in expected.items():
        if state.get(key) != want:
            raise DataError(
                f"checkpoint data state has {key}={state.get(key)!r} but this job has {want!r}; "
                "resume with the same dataset and sequenceLength, or start a new checkpoint.path"
            )


class SyntheticTokenSource:
    """Arithmetic sequences x_t = (a + s*t) mod vocab with a random start a and stride s per sample.

    Deterministic in (seed, global sample index), so batches are the same for any rank layout.
    Learnable: the next token is the current one plus the stride read from the previous token, so
    the loss falls from ln(vocab) towards zero once the model learns to attend one token back.
    """

    def __init__(self, *, seed: int, layout: DataLayout) -> None:
        self.seed = seed
        self.sequence_length = layout.sequence_length
        self.vocab_size = layout.vocab_size
        self.position = GlobalPosition.start(layout)
        self.samples_per_epoch: int | None = None  # endless: every index is a sample
        self.uri: str | None = None  # no data set, no tokenizer to check against the weights
        self.manifest: ShardManifest | None = None

    def _sample(self, index: int) -> np.ndarray:
        rng = np.random.default_rng(np.random.SeedSequence([self.seed, index]))
        start = int(rng.integers(0, self.vocab_size))
        stride = SYNTHETIC_STRIDES[int(rng.integers(0, len(SYNTHETIC_STRIDES)))]
        return (start + stride * np.arange(self.sequence_length + 1, dtype=np.int64)) % self.vocab_size

    def next_batch(self) -> Batch:
        _, indices = self.position.take(None)
        window = torch.from_numpy(np.stack([self._sample(i) for i in indices]))
        return Batch(window[:, :-1].contiguous(), window[:, 1:].contiguous())

    def _identity(self) -> dict[str, Any]:
        return {"seed": self.seed, "sequence_length": self.sequence_length}

    def state_dict(self) -> dict[str, Any]:
        return _position_state(DatasetKind.SYNTHETIC, self._identity(), self.position)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        _restore_position(state, DatasetKind.SYNTHETIC, self._identity(), self.position)

    def close(self) -> None:
        """Nothing runs in the background."""


def shuffled_shards(seed: int, epoch: int, samples: Sequence[int]) -> tuple[list[int], list[int]]:
    """An epoch's shard order, shuffled by (seed, epoch), and the cumulative samples (ends) in that order."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, epoch]))
    order = [int(i) for i in rng.permutation(len(samples))]
    return order, [int(e) for e in np.cumsum([samples[i] for i in order])]


def check_token_ids(tokens: torch.Tensor, vocab_size: int, uri: str, fix: str) -> None:
    """DataError when a batch holds an id at or above the model's vocabulary (`fix`: what to prepare)."""
    top = int(tokens.max())
    if top >= vocab_size:
        # An out-of-range id would surface later as an opaque device-side assert in the embedding.
        raise DataError(
            f"dataset.uri {uri} has token id {top}, vocabSize is {vocab_size}; {fix} or check "
            "dataset.tokenDtype"
        )


def shards_fingerprint(shards: Sequence[Shard]) -> str:
    """What a checkpoint's data position is for: the shards' names and lengths (a resume on other data is
    refused)."""
    digest = hashlib.sha256()
    for shard in shards:
        digest.update(f"{shard.name}:{shard.num_tokens};".encode())
    return digest.hexdigest()[:16]


@dataclass
class Shard:
    """One token file: its name, length in tokens, and how to get a local copy to memory-map."""

    name: str
    num_tokens: int
    fetch: Callable[[], Path]
    size_bytes: int = -1  # the file's size, to check it against the manifest
    # Chat data: the files beside the shard (mask, conversation starts) by suffix, fetched the same way.
    companions: dict[str, Callable[[], Path]] = field(default_factory=dict)
    companion_sizes: dict[str, int] = field(default_factory=dict)


class ShardTokenSource:
    """Non-overlapping (sequence_length + 1)-token windows over *.bin shards, read through np.memmap.

    An epoch visits the shards in an order shuffled by (seed, epoch) and the windows inside each
    shard in file order; samples are dealt to ranks by `GlobalPosition`.
    """

    def __init__(
        self,
        shards: Sequence[Shard],
        *,
        token_dtype: str,
        seed: int,
        uri: str,
        layout: DataLayout,
        manifest: ShardManifest | None = None,
    ) -> None:
        self.dtype = np.dtype(token_dtype)
        self.manifest = manifest  # the checked manifest.json, if the data set has one
        self.seed = seed
        self.sequence_length = sequence_length = layout.sequence_length
        self.vocab_size = layout.vocab_size
        self.uri = uri
        self.shards = sorted(shards, key=lambda s: s.name)
        self.position = GlobalPosition.start(layout)
        # Windows step by sequence_length so each window's last label is the next window's first input.
        self._windows = [max(0, (s.num_tokens - 1) // sequence_length) for s in self.shards]
        self.samples_per_epoch: int | None = sum(self._windows)
        # The same rule and advice as `btj plan` gives for a folder it can read (shard_manifest).
        problem = too_little_data(
            [s.num_tokens for s in self.shards],
            uri=uri,
            sequence_length=sequence_length,
            data_parallel=layout.world_size,
            micro_batch_size=layout.micro_batch_size,
            accumulation=layout.accumulation,
        )
        if problem is not None:
            raise DataError(problem)
        self.fingerprint = shards_fingerprint(self.shards)
        self._epoch_cache: tuple[int, list[int], list[int]] | None = None
        # Each open memmap holds a file descriptor; windows are read shard by shard, so a few suffice
        # even for data sets of many thousands of shards.
        self._open: OrderedDict[int, np.memmap[Any, np.dtype[Any]]] = OrderedDict()
        self._prefetch: threading.Thread | None = None  # the one background fetch, joined by close()

    def _epoch_layout(self, epoch: int) -> tuple[list[int], list[int]]:
        """Shard order and cumulative window counts (ends) of an epoch."""
        if self._epoch_cache is None or self._epoch_cache[0] != epoch:
            self._epoch_cache = (epoch, *shuffled_shards(self.seed, epoch, self._windows))
        return self._epoch_cache[1], self._epoch_cache[2]

    def _window(self, epoch: int, index: int) -> np.ndarray:
        order, ends = self._epoch_layout(epoch)
        slot = bisect.bisect_right(ends, index)
        offset = (index - (ends[slot - 1] if slot else 0)) * self.sequence_length
        tokens = self._tokens(order[slot], following=order[slot + 1] if slot + 1 < len(order) else None)
        return np.asarray(tokens[offset : offset + self.sequence_length + 1], dtype=np.int64)

    def _tokens(self, shard: int, following: int | None) -> np.memmap[Any, np.dtype[Any]]:
        if shard in self._open:
            self._open.move_to_end(shard)
            return self._open[shard]
        self._open[shard] = np.memmap(self.shards[shard].fetch(), dtype=self.dtype, mode="r")
        if len(self._open) > MAX_OPEN_SHARDS:
            self._open.popitem(last=False)
        if following is not None:
            self._fetch_in_background(following)
        return self._open[shard]

    def _fetch_in_background(self, shard: int) -> None:
        """Fetch the epoch's next shard while this one trains, so a remote download overlaps training;
        an error there is raised again by the foreground fetch when the shard is needed. One at a time, so
        close() has one thread to join: while one still runs, the foreground fetches the next itself."""
        if self._prefetch is not None and self._prefetch.is_alive():
            return
        self._prefetch = threading.Thread(
            target=_quietly, args=(self.shards[shard].fetch,), name="btj-shard-prefetch", daemon=True
        )
        self._prefetch.start()

    def close(self) -> None:
        """Join the background fetch, if one runs: no thread of the data source outlives the run."""
        prefetch, self._prefetch = self._prefetch, None
        if prefetch is None:
            return
        prefetch.join(PREFETCH_JOIN_TIMEOUT_S)
        if prefetch.is_alive():
            # Daemon, so a download stuck on the network cannot hold the exit; cut short, it leaves a
            # partial file beside the shard, never a shard that looks complete.
            log.warning(
                "a background shard download is still running after %.0f s; exiting without it",
                PREFETCH_JOIN_TIMEOUT_S,
            )

    def next_batch(self) -> Batch:
        epoch, indices = self.position.take(self.samples_per_epoch)
        window = torch.from_numpy(np.stack([self._window(epoch, i) for i in indices]))
        check_token_ids(window, self.vocab_size, self.uri, "use shards tokenized for this model")
        return Batch(window[:, :-1].contiguous(), window[:, 1:].contiguous())

    def _identity(self) -> dict[str, Any]:
        return {"seed": self.seed, "fingerprint": self.fingerprint, "sequence_length": self.sequence_length}

    def state_dict(self) -> dict[str, Any]:
        return _position_state(DatasetKind.SHARDS, self._identity(), self.position)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        _restore_position(state, DatasetKind.SHARDS, self._identity(), self.position)


def _position_state(kind: DatasetKind, identity: dict[str, Any], position: GlobalPosition) -> dict[str, Any]:
    """A source's checkpoint state: what it reads (identity) and where the whole job is in it."""
    return {
        "kind": kind.value,
        "version": STATE_VERSION,
        **identity,
        "world_size": position.world_size,
        "micro_batch_size": position.micro_batch_size,
        "samples_per_step": position.samples_per_step,
        "epoch": position.epoch,
        "consumed": position.consumed,
    }


def _restore_position(
    state: dict[str, Any], kind: DatasetKind, identity: dict[str, Any], position: GlobalPosition
) -> None:
    """Resume `position` from a state written by the same kind of source over the same data, with the same
    global batch (another one would move every later step's samples)."""
    _check_state(state, kind=kind.value, expected=identity)
    saved = state.get("samples_per_step")
    if saved is not None and int(saved) != position.samples_per_step:
        raise DataError(
            f"checkpoint data position was written with a global batch of {saved} sequences but the plan's "
            f"is {position.samples_per_step}: every later step would train other samples. Fix: keep "
            "spec.training.globalBatchTokens, or start a new checkpoint.path"
        )
    position.epoch = int(state["epoch"])
    position.consumed = int(state["consumed"])


def check_resume(state: dict[str, Any], step: int, source: TokenSource) -> str:
    """The one line that says the restored data position and global batch agree with the plan at optimizer
    step `step` (where that step leaves the position under this global batch); DataError when they do not.
    Call after `source.load_state_dict(state)`."""
    position = source.position
    expected = position.at_step(step, source.samples_per_epoch)
    epoch, sample = position.settled(source.samples_per_epoch)
    if (epoch, sample) != expected:
        raise DataError(
            f"checkpoint of step {step} holds data position epoch {epoch} sample {sample}, but step "
            f"{step} with the plan's global batch of {position.samples_per_step} sequences ends at epoch "
            f"{expected[0]} sample {expected[1]}: the checkpoint was written with another global batch or "
            "data set. Fix: resume with the plan it was written with, or start a new checkpoint.path"
        )
    accumulation = position.samples_per_step // (position.world_size * position.micro_batch_size)
    saved = f"{state.get('world_size')} ranks x micro-batch {state.get('micro_batch_size')}"
    now = f"{position.world_size} x {position.micro_batch_size} x accumulation {accumulation}"
    return (
        f"resumed at step {step}: data position epoch {epoch} sample {sample} and global batch "
        f"{position.samples_per_step} sequences agree with the plan (saved by {saved}, resumed on {now})"
    )


def _quietly(fetch: Callable[[], Path]) -> None:
    try:
        fetch()
    except Exception as err:  # the foreground fetch of the same shard reports it
        log.debug("background fetch failed: %s", err)


def _parse_manifest(text: str, uri: str) -> ShardManifest:
    try:
        return parse_manifest(text, uri)
    except ManifestMismatch as err:
        raise DataError(str(err)) from None


def _local_shards(root: Path, itemsize: int) -> tuple[list[Shard], ShardManifest | None]:
    if not root.is_dir():
        raise DataError(f"dataset.uri {root} is not a folder; point it at a folder of *.bin token shards")
    files = sorted(root.glob("*.bin"))
    shards = [
        Shard(
            name=f.name,
            num_tokens=f.stat().st_size // itemsize,
            fetch=functools.partial(Path, f),
            size_bytes=f.stat().st_size,
            companions={
                suffix: functools.partial(Path, c)
                for suffix in COMPANION_SUFFIXES
                if (c := f.with_name(companion(f.name, suffix))).is_file()
            },
            companion_sizes={
                suffix: c.stat().st_size
                for suffix in COMPANION_SUFFIXES
                if (c := f.with_name(companion(f.name, suffix))).is_file()
            },
        )
        for f in files
    ]
    manifest = root / MANIFEST_NAME
    return shards, _parse_manifest(manifest.read_text(), str(root)) if manifest.is_file() else None


def _s3_shards(uri: str, itemsize: int) -> tuple[list[Shard], ShardManifest | None]:
    """List *.bin objects under an s3:// prefix (each downloaded to the cache on first use) and read the
    prefix's manifest.json, if any."""
    import boto3  # only the S3 path needs it; a local-data trainer starts without the import cost
    from botocore.config import Config
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, _, prefix = uri.removeprefix("s3://").partition("/")
    if not bucket:
        raise DataError(f"dataset.uri {uri} has no bucket; write it as s3://bucket/prefix")
    if prefix and not prefix.endswith("/"):
        prefix += "/"  # s3://b/data must not also match s3://b/data-old/
    # boto3 reads AWS_ENDPOINT_URL itself on recent versions; passing it keeps older ones and
    # S3-compatible stores (MinIO, moto) working too.
    # Every rank of every node lists and fetches at once after a restart: adaptive retries back
    # off on S3's 503 SlowDown instead of failing the job.
    client = boto3.client(
        "s3",
        endpoint_url=os.environ.get("AWS_ENDPOINT_URL") or None,
        config=Config(retries={"mode": "adaptive", "max_attempts": 10}),
    )
    try:
        return _listed_shards(client, uri, bucket, prefix, itemsize)
    except (BotoCoreError, ClientError) as err:
        raise_if_permanent(err, "dataset.uri", uri)  # AccessDenied, NoSuchBucket: once, named
        raise


def _fetcher(client: Any, bucket: str, key: str, local: Path, size: int, etag: str) -> Callable[[], Path]:
    """The shard's download into the node's cache, when first read; a refusal no restart can change
    (AccessDenied on the object) ends the job naming the permission."""

    def fetch() -> Path:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return download_once(client, bucket, key, local, size, etag)
        except (BotoCoreError, ClientError) as err:
            raise_if_permanent(err, "dataset.uri", f"s3://{bucket}/{key}")
            raise

    return fetch


def _listed_shards(
    client: Any, uri: str, bucket: str, prefix: str, itemsize: int
) -> tuple[list[Shard], ShardManifest | None]:
    shards: list[Shard] = []
    manifest: ShardManifest | None = None
    beside: dict[str, tuple[Callable[[], Path], int]] = {}  # chat data's mask and starts, by key
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            key = str(obj["Key"])
            if key == prefix + MANIFEST_NAME:
                body = client.get_object(Bucket=bucket, Key=key)["Body"].read()
                manifest = _parse_manifest(body.decode("utf-8", errors="replace"), uri)
            if key.endswith(COMPANION_SUFFIXES):
                size = int(obj["Size"])
                etag = str(obj.get("ETag", "")).strip('"')
                local = cache_dir() / "s3" / bucket / key
                beside[key] = (_fetcher(client, bucket, key, local, size, etag), size)
            if not key.endswith(".bin"):
                continue
            size = int(obj["Size"])
            etag = str(obj.get("ETag", "")).strip('"')
            local = cache_dir() / "s3" / bucket / key
            shards.append(
                Shard(
                    name=key.removeprefix(prefix).lstrip("/"),
                    num_tokens=size // itemsize,
                    fetch=_fetcher(client, bucket, key, local, size, etag),
                    size_bytes=size,
                )
            )
    for shard in shards:
        for suffix in COMPANION_SUFFIXES:
            found = beside.get(prefix + companion(shard.name, suffix))
            if found is not None:
                shard.companions[suffix], shard.companion_sizes[suffix] = found
    return shards, manifest


def list_shards(dataset: DatasetConfig) -> tuple[list[Shard], ShardManifest | None]:
    """The *.bin shards at dataset.uri (a folder or s3:// prefix) and its manifest.json, if any."""
    uri = dataset.uri or ""
    itemsize = np.dtype(dataset.token_dtype).itemsize
    return _s3_shards(uri, itemsize) if uri.startswith("s3://") else _local_shards(Path(uri), itemsize)


def build_token_source(dataset: DatasetConfig, layout: DataLayout) -> TokenSource:
    """The plan's data source (its dataset section) for one data-parallel rank."""
    if not 0 <= layout.rank < layout.world_size:
        raise DataError(f"rank {layout.rank} is outside world size {layout.world_size}")
    if dataset.kind == DatasetKind.SYNTHETIC:
        return SyntheticTokenSource(seed=dataset.seed, layout=layout)
    if dataset.kind == DatasetKind.CHAT:
        # Packed rows with documents: packed_data.build_chat_source (token_sources opens every kind).
        raise DataError("dataset.kind chat is read by packed_data.build_chat_source, not as token shards")
    uri = dataset.uri or ""
    shards, manifest = list_shards(dataset)
    if manifest is not None:
        try:
            check_manifest(
                manifest,
                {s.name: s.size_bytes for s in shards},
                uri=uri,
                token_dtype=dataset.token_dtype,
                vocab_size=layout.vocab_size,
            )
        except ManifestMismatch as err:
            raise DataError(str(err)) from err
        log.info("dataset.uri %s matches its %s (%d tokens)", uri, MANIFEST_NAME, manifest.tokens)
    if not shards:
        raise DataError(f"dataset.uri {uri} holds no *.bin token shards; upload shards or fix the uri")
    return ShardTokenSource(
        shards, token_dtype=dataset.token_dtype, seed=dataset.seed, uri=uri, layout=layout, manifest=manifest
    )
