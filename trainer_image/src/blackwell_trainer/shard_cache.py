"""The node's cache of S3 objects (token shards, weights): downloaded once per node, evicted least
recently used to keep a share of the disk free."""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

from blackwell_trainer.errors import DataError

log = logging.getLogger(__name__)

CACHE_DIR_ENV = "BTJ_CACHE_DIR"
DEFAULT_CACHE_DIR = "/tmp/btj-cache"
# The S3 cache lives on the node's NVMe with whatever else is there (single-node checkpoints under /local,
# other jobs' caches): before a download it evicts least recently used shards to leave this share free.
CACHE_KEEP_FREE_ENV = "BTJ_CACHE_KEEP_FREE_FRACTION"
DEFAULT_CACHE_KEEP_FREE = 0.10


def cache_dir() -> Path:
    """The cache's root (the operator points BTJ_CACHE_DIR at the node's NVMe)."""
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
    for shard in sorted(cached, key=lambda p: p.stat().st_atime):
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


def download_once(client: Any, bucket: str, key: str, local: Path, size: int, etag: str) -> Path:
    """Download one object into the cache, once per node: ranks sharing the cache wait on a file lock.

    The cache outlives the container (the operator points it at the node's NVMe), so a cached copy is
    used only while its size and the object's ETag still match: a shard replaced in S3 is fetched again;
    and it is bounded by the disk: least recently used shards are evicted to keep a share of it free.
    """
    local.parent.mkdir(parents=True, exist_ok=True)
    tag = local.with_name(local.name + ".etag")
    with open(local.with_name(local.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        fresh = local.exists() and local.stat().st_size == size and tag.exists() and tag.read_text() == etag
        if fresh:
            # Recently used (atime), same content: mtime kept to the nanosecond (a float of seconds holds
            # only about 240 ns at today's epoch, and moved it on every cache hit).
            os.utime(local, ns=(time.time_ns(), local.stat().st_mtime_ns))
        else:
            make_room(cache_dir(), size, keep=local)
            partial = local.with_name(f"{local.name}.part-{os.getpid()}")
            client.download_file(bucket, key, str(partial))
            os.replace(partial, local)  # atomic: a reader never sees a half-written shard
            tag.write_text(etag)  # after the data: a crash in between means one more download, no stale read
            log.info("downloaded s3://%s/%s to %s", bucket, key, local)
    return local
