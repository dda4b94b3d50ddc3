"""The pod's cache of S3 objects (token shards, weights): downloaded once per pod, verified against the
object's content hash before every use, evicted least recently used to keep a share of the disk free."""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from blackwell_trainer.errors import DataError
from blackwell_trainer.object_hash import ContentHash, content_hashes

log = logging.getLogger(__name__)

CACHE_DIR_ENV = "BTJ_CACHE_DIR"
DEFAULT_CACHE_DIR = "/tmp/btj-cache"
# The S3 cache lives on the node's disk with whatever else is there (single-node checkpoints under /local,
# other pods' scratch): before a download it evicts least recently used shards to leave this share free.
CACHE_KEEP_FREE_ENV = "BTJ_CACHE_KEEP_FREE_FRACTION"
DEFAULT_CACHE_KEEP_FREE = 0.10


def cache_dir() -> Path:
    """The cache's root (the operator points BTJ_CACHE_DIR at the pod's node-local scratch, /local)."""
    return Path(os.environ.get(CACHE_DIR_ENV, DEFAULT_CACHE_DIR))


def keep_free_fraction() -> float:
    raw = os.environ.get(CACHE_KEEP_FREE_ENV, "")
    try:
        value = float(raw) if raw else DEFAULT_CACHE_KEEP_FREE
    except ValueError:
        value = -1.0
    if not 0.0 <= value < 1.0:
        raise DataError(f"{CACHE_KEEP_FREE_ENV}={raw!r}: a share of the disk from 0 to 1. Fix: e.g. 0.1")
    return value


def make_room(root: Path, need: int, keep: Path) -> None:
    """Evict least recently used cached shards (never `keep`, never one another rank holds) until `need`
    bytes fit on the cache's disk with the keep-free share left over."""
    fraction = keep_free_fraction()
    usage = shutil.disk_usage(root)
    if usage.free - need >= fraction * usage.total:
        return
    cached = [p for p in root.rglob("*.bin") if p != keep and p.is_file()]
    for shard in sorted(cached, key=last_used):
        with open(shard.with_name(shard.name + ".lock"), "w") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # another rank is downloading or checking it right now
            size = shard.stat().st_size
            shard.unlink(missing_ok=True)  # a reader that has it mapped keeps its pages until it unmaps
            shard.with_name(shard.name + ".etag").unlink(missing_ok=True)
        log.info("cache: evicted %s (%d bytes) to make room for %d bytes", shard, size, need)
        usage = shutil.disk_usage(root)
        if usage.free - need >= fraction * usage.total:
            return
    log.warning(
        "cache: %s keeps less than %.0f%% of its disk free after evicting every idle shard; downloading "
        "%d bytes anyway",
        root,
        100 * fraction,
        need,
    )


def _tag(local: Path) -> Path:
    return local.with_name(local.name + ".etag")


def last_used(local: Path) -> float:
    """When a cached shard was last used: its tag's mtime (a hit touches the tag, never the shard itself,
    whose change time is what shows a rewrite); the shard's own atime without a tag."""
    tag = _tag(local)
    return tag.stat().st_mtime if tag.exists() else local.stat().st_atime


def _signature(local: Path) -> list[int]:
    """What any write to the file changes: a rewrite in place moves its ctime (which no unprivileged
    process can set back), a replacement its inode."""
    st = local.stat()
    return [st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]


def _record(local: Path) -> dict[str, Any]:
    try:
        record = json.loads(_tag(local).read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _write_record(local: Path, etag: str, verified_by: str) -> None:
    record = {"etag": etag, "verifiedBy": verified_by, "signature": _signature(local)}
    _tag(local).write_text(json.dumps(record))


def _mismatch(path: Path, hashes: list[ContentHash], proven: str | None = None) -> tuple[str | None, str]:
    """(the hash the file fails, or None when it passes; the hash that decided). A multipart ETag that does
    not match is an assumption that failed (parts of different sizes), not a verdict, and the next one
    decides; unless it is `proven`, the hash that verified this object's download (so its parts are equal)."""
    for candidate in hashes:
        if candidate.matches(path):
            return None, candidate.algorithm
        if not candidate.assumed or candidate.algorithm == proven:
            return candidate.algorithm, candidate.algorithm
    return None, "none (the object offers no content hash this trainer can compute)"


def _object_hashes(client: Any, bucket: str, key: str) -> list[ContentHash]:
    head = client.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")

    def part_size() -> int | None:
        return int(client.head_object(Bucket=bucket, Key=key, PartNumber=1)["ContentLength"])

    return content_hashes(head, part_size)


def _download_verified(client: Any, bucket: str, key: str, local: Path, etag: str) -> None:
    """Download to a partial file, check it against the object's content hash, then move it into place."""
    hashes = _object_hashes(client, bucket, key)
    for attempt in (1, 2):
        partial = local.with_name(f"{local.name}.part-{os.getpid()}")
        client.download_file(bucket, key, str(partial))
        failed, decided = _mismatch(partial, hashes)
        if failed is None:
            os.replace(partial, local)  # atomic: a reader never sees a half-written shard
            _write_record(local, etag, decided)  # after the data: a crash in between costs a download
            log.info("downloaded s3://%s/%s to %s (verified by %s)", bucket, key, local, decided)
            return
        partial.unlink(missing_ok=True)
        log.warning("s3://%s/%s: download %d does not match the object's %s", bucket, key, attempt, failed)
    raise DataError(
        f"s3://{bucket}/{key}: the downloaded bytes do not match the object's {failed} twice; the object "
        "was replaced while it was read, or the store returned other bytes. Fix: check the object (its "
        "checksum in `aws s3api head-object --checksum-mode ENABLED`) and upload it again if it is damaged"
    )


def download_once(client: Any, bucket: str, key: str, local: Path, size: int, etag: str) -> Path:
    """Download one object into the cache, once per pod: ranks sharing the cache wait on a file lock.

    A cached copy is used only while its size and the object's ETag still match (a shard replaced in S3 is
    fetched again) and its bytes have the object's content hash (object_hash.py): checked when it is
    downloaded and again whenever the file has changed since (a shard rewritten in place, even to the
    same size, is fetched again). The cache is bounded by the disk: least recently used shards are
    evicted to keep a share of it free.
    """
    local.parent.mkdir(parents=True, exist_ok=True)
    with open(local.with_name(local.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        record = _record(local)
        cached = local.exists() and local.stat().st_size == size and record.get("etag") == etag
        if cached and record.get("signature") != _signature(local):
            # Changed since it was verified (or never verified): check its bytes before anyone reads them.
            proven = record.get("verifiedBy")
            failed, decided = _mismatch(local, _object_hashes(client, bucket, key), proven)
            if failed is None:
                _write_record(local, etag, decided)
            else:
                log.warning(
                    "cache: %s does not match s3://%s/%s's %s (changed on disk): downloading it again",
                    local,
                    bucket,
                    key,
                    failed,
                )
                cached = False
        if cached:
            _tag(local).touch()  # recently used, for the eviction order; the shard itself is left alone
        else:
            make_room(cache_dir(), size, keep=local)
            _download_verified(client, bucket, key, local, etag)
    return local
