"""The pod's cache of S3 objects (token shards, weights): downloaded once per pod, verified against the
object's content hash before every use, least recently used shards evicted to stay within its cap (the
pod's declared share of the node's disk) and to keep a share of the disk free."""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from blackwell_trainer.data.object_hash import ContentHash, content_hashes
from blackwell_trainer.errors import DataError
from blackwell_trainer.plan import env_vars
from blackwell_trainer.plan.config import CACHE_MAX_BYTES_ENV, NODE_DISK_KEEP_FREE_FRACTION
from blackwell_trainer.plan.env_vars import CACHE_DIR_ENV, CACHE_KEEP_FREE_ENV

log = logging.getLogger(__name__)

DEFAULT_CACHE_DIR = "/tmp/btj-cache"
# The cache lives on the node's disk with other pods' files: before a download it evicts least recently
# used shards to leave this share free too (a second guard behind the cap; docs/security.md).
DEFAULT_CACHE_KEEP_FREE = NODE_DISK_KEEP_FREE_FRACTION
# What may be evicted: token shards and their chat companions (shard_manifest.COMPANION_SUFFIXES, a sibling
# module this one may not import; a test keeps them equal), fetched again when next opened. Weights are read
# for the whole load and never evicted; the export's staging is not the cache's.
EVICTABLE_SUFFIXES = (".bin", ".mask", ".docs")
NOT_CACHE = ("export-staging",)
# Serialises the room-making and download of one pod's misses, so two ranks cannot both find room for
# their shard and overshoot the cap together; cache hits never take it.
SPACE_LOCK = ".space.lock"
# How long a download waits for shards other ranks hold (being checked or downloaded) to become evictable.
SPACE_WAIT_SECONDS = 120.0
# Room kept beside each download for its verification record (<file>.etag, a small JSON object).
RECORD_BYTES = 1024
SPACE_POLL_SECONDS = 0.5


def cache_dir() -> Path:
    """The cache's root (the operator points BTJ_CACHE_DIR at the pod's node-local scratch, /local)."""
    return Path(os.environ.get(CACHE_DIR_ENV, DEFAULT_CACHE_DIR))


def keep_free_fraction() -> float:
    raw = os.environ.get(CACHE_KEEP_FREE_ENV, "")
    value = env_vars.keep_free(raw)  # the check admission runs on spec.env too
    if value is None:
        raise DataError(
            f"{CACHE_KEEP_FREE_ENV}={raw!r}: a share of the disk from 0 to 1 (below 1). Fix: e.g. "
            f"{DEFAULT_CACHE_KEEP_FREE}, or unset it for the default"
        )
    return value


def cache_max_bytes() -> int | None:
    """The cache's cap in bytes (BTJ_CACHE_MAX_BYTES, which the operator sets from the plan; 0 where the
    plan reads nothing from S3); None: unset."""
    raw = os.environ.get(CACHE_MAX_BYTES_ENV, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise DataError(
            f"{CACHE_MAX_BYTES_ENV}={raw!r}: the S3 cache's size in bytes, a whole number from 0. Fix: "
            "leave it to the operator (it sets it from spec.cluster.localStorageGiB or the plan's estimate), "
            "or remove it from spec.env"
        )
    return value


def cache_bytes(root: Path) -> int:
    """Bytes the cache holds: every file under its root but the export's staging (partial downloads count:
    they are on the disk)."""
    total = 0
    for folder, dirs, files in os.walk(root):
        if Path(folder) == root:
            dirs[:] = [d for d in dirs if d not in NOT_CACHE]
        for name in files:
            with contextlib.suppress(FileNotFoundError):  # evicted or renamed by another rank meanwhile
                total += os.stat(os.path.join(folder, name)).st_size
    return total


@contextlib.contextmanager
def space_lock(root: Path) -> Iterator[None]:
    """Held while one download makes room and writes (see SPACE_LOCK)."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / SPACE_LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _evictable(root: Path, keep: Path) -> list[Path]:
    found = [
        p
        for p in root.rglob("*")
        if p.suffix in EVICTABLE_SUFFIXES and p != keep and p.is_file() and root / "weights" not in p.parents
    ]
    return sorted(found, key=last_used)


def _evict(shard: Path, need: int) -> int | None:
    """Evict one cached file and its record unless another rank holds its lock: the bytes freed, None when
    it is held."""
    with open(shard.with_name(shard.name + ".lock"), "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return None  # another rank is downloading or checking it right now
        freed = 0
        for path in (shard, shard.with_name(shard.name + ".etag")):
            with contextlib.suppress(FileNotFoundError):
                freed += path.stat().st_size
                path.unlink()  # a reader that has it mapped keeps its pages until it unmaps
    log.info("cache: evicted %s (%d bytes) to make room for %d bytes", shard, freed, need)
    return freed


def make_room(root: Path, need: int, keep: Path) -> bool:
    """Evict least recently used cached shards (never `keep`, never one another rank holds) until `need`
    more bytes fit the cache's cap and leave the keep-free share of the disk free. Call it holding
    space_lock. True: go ahead. False: only shards other ranks hold are in the way of the cap; try again.

    The cap is the hard bound (past the pod's declared ephemeral storage the kubelet evicts it): DataError
    when even an empty cache of evictable shards cannot hold `need`. The free share guards the node against
    other pods' use as well; when only evicting what this pod does not hold could restore it and that is
    not enough, the download goes ahead with a warning (the scheduler reserved this pod's share).
    """
    fraction, cap = keep_free_fraction(), cache_max_bytes()
    if cap is not None and need + RECORD_BYTES > cap:
        raise DataError(
            f"{keep.name} is {need:,} bytes, more than the S3 cache may hold ({CACHE_MAX_BYTES_ENV}="
            f"{cap:,}). Fix: raise spec.cluster.localStorageGiB (the operator sets the cap from it), or "
            "prepare smaller shards"
        )

    # Walked once: under space_lock no other rank downloads into the cache or evicts from it meanwhile (a
    # cache hit rewrites at most its small record), so what this call evicts is what changes.
    cached = cache_bytes(root) if cap is not None else 0

    def over_cap() -> bool:
        return cap is not None and cached + need + RECORD_BYTES > cap

    def short_of_free() -> bool:
        usage = shutil.disk_usage(root)
        return usage.free - need < fraction * usage.total

    if not over_cap() and not short_of_free():
        return True
    held = False
    for shard in _evictable(root, keep):
        freed = _evict(shard, need)
        if freed is None:
            held = True
            continue
        cached -= freed
        if not over_cap() and not short_of_free():
            return True
    if over_cap():
        if held:
            return False
        raise DataError(
            f"the S3 cache under {root} holds {cache_bytes(root):,} bytes it cannot evict (initial weights "
            f"and shards in use), and {keep.name}'s {need:,} do not fit beside them within "
            f"{CACHE_MAX_BYTES_ENV}={cap:,}. Fix: raise spec.cluster.localStorageGiB"
        )
    log.warning(
        "cache: %s keeps less than %.0f%% of its disk free after evicting every idle shard; downloading "
        "%d bytes anyway (within the cache's cap)",
        root,
        100 * fraction,
        need,
    )
    return True


def _room_for(root: Path, need: int, keep: Path, download: Any) -> None:
    """Make room for `need` bytes under space_lock and run `download` there; wait for shards other ranks
    hold, releasing the lock between tries (a rank holding one may be waiting for it)."""
    deadline = time.monotonic() + SPACE_WAIT_SECONDS
    while True:
        with space_lock(root):
            if make_room(root, need, keep):
                download()
                return
        if time.monotonic() > deadline:
            raise DataError(
                f"the S3 cache under {root} found no room for {keep.name} ({need:,} bytes) within "
                f"{CACHE_MAX_BYTES_ENV}={cache_max_bytes():,} for {SPACE_WAIT_SECONDS:.0f} s: every shard "
                "it could evict is in use by another rank. Fix: raise spec.cluster.localStorageGiB"
            )
        time.sleep(SPACE_POLL_SECONDS)


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
    same size, is fetched again). The cache is bounded by its cap (BTJ_CACHE_MAX_BYTES) and by the disk:
    least recently used shards are evicted to stay within the cap and keep a share of the disk free.
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
            _room_for(cache_dir(), size, local, lambda: _download_verified(client, bucket, key, local, etag))
    return local
