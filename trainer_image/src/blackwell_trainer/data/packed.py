"""Chat data as packed rows: whole conversations side by side, the loss on the assistant's tokens only.

A row is `sequence_length` tokens holding consecutive whole conversations of one shard (greedily, in file
order; a conversation longer than a row is cut to one row of its own, and counted). The rest of a row is
padding, a document of its own that is never trained on. Each row comes with:
- `documents`: each token's document number in the row, for the document mask (document_mask.py);
- `labels`: the next token where it lies in the same conversation and the mask file marks it as the
  assistant's, else IGNORE_INDEX: no prediction across a boundary, none of system or user text.
Rows are the samples `GlobalPosition` deals to the ranks, so the sequence of global rows, and every step's
batch, is the same on any number of ranks; an epoch visits the shards in an order shuffled by the seed.
"""

from __future__ import annotations

import bisect
import logging
import time
import zlib
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from blackwell_trainer.data.tokens import (
    MAX_OPEN_SHARDS,
    Batch,
    DataError,
    DataLayout,
    GlobalPosition,
    Shard,
    _position_state,
    _restore_position,
    check_token_ids,
    list_shards,
    shards_fingerprint,
    shuffled_shards,
)
from blackwell_trainer.model.loss import IGNORE_INDEX
from blackwell_trainer.plan.config import DatasetConfig, DatasetKind
from blackwell_trainer.plan.shard_manifest import (
    DOCS_SUFFIX,
    MANIFEST_NAME,
    MASK_SUFFIX,
    ManifestMismatch,
    ShardManifest,
    check_manifest,
    check_mask,
    companion,
    step_shortfall,
)

log = logging.getLogger(__name__)


def pack_rows(starts: Sequence[int], num_tokens: int, row_tokens: int) -> tuple[list[tuple[int, int]], int]:
    """Rows of whole conversations, as (first, last) conversation indices, and how many were cut.

    `starts` are the conversations' first tokens in the shard (sorted, the first 0), `num_tokens` the
    shard's length. Greedy in order: a row takes the next conversations while they fit.
    """
    ends = [*starts[1:], num_tokens]
    rows: list[tuple[int, int]] = []
    cut = 0
    first, used = 0, 0
    for index, (start, end) in enumerate(zip(starts, ends, strict=True)):
        length = end - start
        if length > row_tokens:
            cut += 1
        if index > first and used + length > row_tokens:
            rows.append((first, index - 1))
            first, used = index, 0
        used += min(length, row_tokens)
    if len(starts):
        rows.append((first, len(starts) - 1))
    return rows, cut


class ChatTokenSource:
    """Packed rows over chat shards (prepare --chat): tokens, the assistant mask and conversation starts."""

    def __init__(
        self,
        shards: Sequence[Shard],
        *,
        token_dtype: str,
        seed: int,
        uri: str,
        layout: DataLayout,
        manifest: ShardManifest | None = None,
    ):
        self.dtype = np.dtype(token_dtype)
        self.manifest = manifest  # the checked manifest.json (its tokenizer is checked against the weights)
        self.seed = seed
        self.sequence_length = layout.sequence_length
        self.vocab_size = layout.vocab_size
        self.uri = uri
        self.shards = sorted(shards, key=lambda s: s.name)
        self.position = GlobalPosition.start(layout)
        self._starts: list[np.ndarray[Any, np.dtype[np.uint64]]] = []
        self._rows: list[list[tuple[int, int]]] = []
        cut = 0
        for shard in self.shards:
            starts = np.fromfile(self._companion(shard, DOCS_SUFFIX), dtype=np.uint64)
            rows, shard_cut = pack_rows([int(s) for s in starts], shard.num_tokens, self.sequence_length)
            self._starts.append(starts)
            self._rows.append(rows)
            cut += shard_cut
        self.samples_per_epoch: int | None = sum(len(r) for r in self._rows)
        if cut:
            log.warning(
                "%d conversation(s) of %s are longer than sequenceLength %d and are cut to it",
                cut,
                uri,
                self.sequence_length,
            )
        # The advice of token shards (shard_manifest), counted in packed rows; a shorter sequence packs
        # the conversations anew, so it is not offered from here.
        problem = step_shortfall(
            self.samples_per_epoch,
            uri=uri,
            tokens=sum(s.num_tokens for s in self.shards),
            sequence_length=self.sequence_length,
            data_parallel=layout.world_size,
            micro_batch_size=layout.micro_batch_size,
            accumulation=layout.accumulation,
            shorter=None,
            samples="packed rows",
        )
        if problem is not None:
            raise DataError(problem)
        self.fingerprint = shards_fingerprint(self.shards)
        self._epoch_cache: tuple[int, list[int], list[int]] | None = None
        self._open: OrderedDict[int, tuple[np.memmap[Any, np.dtype[Any]], np.memmap[Any, np.dtype[Any]]]] = (
            OrderedDict()
        )

    @staticmethod
    def _companion(shard: Shard, suffix: str) -> Any:
        fetch = shard.companions.get(suffix)
        if fetch is None:
            raise DataError(
                f"{shard.name} has no {companion(shard.name, suffix)} beside it; chat data sets are the "
                "whole folder prepare --chat wrote: copy every file of it"
            )
        return fetch()

    def _order(self, epoch: int) -> tuple[list[int], list[int]]:
        """Shard order and cumulative row counts of an epoch, computed once per epoch (not per row)."""
        if self._epoch_cache is None or self._epoch_cache[0] != epoch:
            counts = [len(rows) for rows in self._rows]
            self._epoch_cache = (epoch, *shuffled_shards(self.seed, epoch, counts))
        return self._epoch_cache[1], self._epoch_cache[2]

    def _maps(self, shard: int) -> tuple[np.memmap[Any, np.dtype[Any]], np.memmap[Any, np.dtype[Any]]]:
        """A shard's tokens and mask, memory-mapped once and kept for the next rows of the shard."""
        if shard not in self._open:
            entry = self.shards[shard]
            self._open[shard] = (
                np.memmap(entry.fetch(), dtype=self.dtype, mode="r"),
                np.memmap(self._companion(entry, MASK_SUFFIX), dtype=np.uint8, mode="r"),
            )
            if len(self._open) > MAX_OPEN_SHARDS:
                self._open.popitem(last=False)
        self._open.move_to_end(shard)
        return self._open[shard]

    def row(self, epoch: int, index: int) -> tuple[np.ndarray[Any, Any], ...]:
        """tokens, labels and document numbers of global row `index` of `epoch`."""
        order, ends = self._order(epoch)
        slot = bisect.bisect_right(ends, index)
        shard = order[slot]
        first, last = self._rows[shard][index - (ends[slot - 1] if slot else 0)]
        tokens, mask = self._maps(shard)
        starts = self._starts[shard]
        seq = self.sequence_length
        out_tokens = np.zeros(seq, dtype=np.int64)
        out_labels = np.full(seq, IGNORE_INDEX, dtype=np.int64)
        out_docs = np.full(seq, last - first + 1, dtype=np.int64)  # padding: a document of its own
        at = 0
        for number, doc in enumerate(range(first, last + 1)):
            begin = int(starts[doc])
            end = int(starts[doc + 1]) if doc + 1 < len(starts) else tokens.size
            take = min(end - begin, seq - at)
            piece = np.asarray(tokens[begin : begin + take], dtype=np.int64)
            trained = np.asarray(mask[begin : begin + take], dtype=bool)
            out_tokens[at : at + take] = piece
            out_docs[at : at + take] = number
            # Position t predicts token t+1 of the same conversation, where the mask trains on it.
            out_labels[at : at + take - 1] = np.where(trained[1:], piece[1:], IGNORE_INDEX)
            at += take
        return out_tokens, out_labels, out_docs

    def next_batch(self) -> Batch:
        """This rank's next micro-batch of packed rows, with each token's document."""
        epoch, indices = self.position.take(self.samples_per_epoch)
        rows = [self.row(epoch, i) for i in indices]
        tokens = torch.from_numpy(np.stack([r[0] for r in rows]))
        check_token_ids(tokens, self.vocab_size, self.uri, "use data prepared with this model's tokenizer")
        labels = torch.from_numpy(np.stack([r[1] for r in rows]))
        documents = torch.from_numpy(np.stack([r[2] for r in rows]))
        return Batch(tokens, labels, documents)

    def _identity(self) -> dict[str, Any]:
        return {"seed": self.seed, "fingerprint": self.fingerprint, "sequence_length": self.sequence_length}

    def state_dict(self) -> dict[str, Any]:
        return _position_state(DatasetKind.CHAT, self._identity(), self.position)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        _restore_position(state, DatasetKind.CHAT, self._identity(), self.position)

    def close(self) -> None:
        """Nothing runs in the background."""


_MASK_CHUNK = 8 * 2**20


def read_mask(path: Path) -> tuple[str, int]:
    """A mask file's CRC32 (8 hex digits) and how many tokens it trains on (bytes not 0), in one read."""
    crc, trained = 0, 0
    with path.open("rb") as f:
        while chunk := f.read(_MASK_CHUNK):
            crc = zlib.crc32(chunk, crc)
            trained += int(np.count_nonzero(np.frombuffer(chunk, dtype=np.uint8)))
    return f"{crc:08x}", trained


def check_masks(shards: Sequence[Shard], manifest: ShardManifest, uri: str) -> None:
    """DataError naming the first .mask that is not the one prepare wrote (shard_manifest.check_mask): every
    mask is read once at start (S3 data: fetched into the node's cache first), so a replaced mask stops the
    job before it trains on what the mask should have hidden."""
    entries = {entry.name: entry for entry in manifest.shards}
    if not any(entry.mask_crc32 for entry in manifest.shards):
        log.warning(
            "dataset.uri %s: %s has no mask checksums (prepared before them): each .mask is checked for "
            "the tokens it trains on only; prepare the data again to have them checked in full",
            uri,
            MANIFEST_NAME,
        )
    started, read = time.monotonic(), 0
    for shard in shards:
        entry = entries[shard.name]
        if entry.trained_tokens is None and entry.mask_crc32 is None:
            continue  # nothing recorded to compare with
        path = Path(ChatTokenSource._companion(shard, MASK_SUFFIX))
        stat = path.stat()
        key = (str(path), stat.st_size, stat.st_mtime_ns, entry.trained_tokens, entry.mask_crc32)
        if key in _MASKS_CHECKED:
            continue  # the probe builds a source per candidate: each file is read once per process
        crc32, trained = read_mask(path)
        problem = check_mask(entry, path.name, crc32, trained, uri=uri)
        if problem is not None:
            raise DataError(problem)
        _MASKS_CHECKED.add(key)
        read += stat.st_size
    seconds = time.monotonic() - started
    log.info(
        "dataset.uri %s: %d loss masks (%d bytes read) checked in %.1f s", uri, len(shards), read, seconds
    )


# The masks this process checked: the file (path, size, modification time) and what it was checked against.
_MASKS_CHECKED: set[tuple[str, int, int, int | None, str | None]] = set()


def build_chat_source(dataset: DatasetConfig, layout: DataLayout) -> ChatTokenSource:
    """The packed chat source of dataset.uri, after its manifest is checked against the plan."""
    uri = dataset.uri or ""
    shards, manifest = list_shards(dataset)
    if manifest is None:
        # Without the manifest there is no proof the mask files belong to these shards.
        raise DataError(
            f"dataset.uri {uri} has no {MANIFEST_NAME}; chat data is the whole folder `prepare --chat` wrote"
        )
    files = {s.name: s.size_bytes for s in shards}
    for shard in shards:
        files.update({companion(shard.name, k): v for k, v in shard.companion_sizes.items()})
    try:
        check_manifest(
            manifest,
            files,
            uri=uri,
            token_dtype=dataset.token_dtype,
            vocab_size=layout.vocab_size,
            kind=DatasetKind.CHAT.value,
        )
    except ManifestMismatch as err:
        raise DataError(str(err)) from err
    check_masks(shards, manifest, uri)
    log.info(
        "dataset.uri %s: %d conversations, %d tokens, %.1f%% of them trained on (the assistant's)",
        uri,
        manifest.documents,
        manifest.tokens,
        100 * (manifest.loss_mask_coverage or 0.0),
    )
    return ChatTokenSource(
        shards, token_dtype=dataset.token_dtype, seed=dataset.seed, uri=uri, layout=layout, manifest=manifest
    )
