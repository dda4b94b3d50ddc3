"""The S3 cache stays within its cap, BTJ_CACHE_MAX_BYTES (issue 24): the pod's declared share of the node's
disk, which the operator sets from the plan. Shards come from moto's S3 server over real HTTP."""

from __future__ import annotations

import fcntl
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import blackwell_trainer.data.shard_cache as cache_module
from blackwell_trainer.data.tokens import ShardTokenSource
from blackwell_trainer.errors import DataError
from blackwell_trainer.plan.config import CACHE_MAX_BYTES_ENV
from blackwell_trainer.plan.shard_manifest import COMPANION_SUFFIXES
from tests.trainer.test_data import s3_endpoint, shards, used_at

__all__ = ["s3_endpoint"]  # the fixture, shared with test_data

SHARD_TOKENS = 2048  # uint16: 4 KiB a shard
SHARD_BYTES = 2 * SHARD_TOKENS
# Two shards with their verification records and locks; a third needs an eviction.
CAP = 2 * (SHARD_BYTES + cache_module.RECORD_BYTES) + 512


def _bucket(endpoint: str, name: str, count: int) -> Any:
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint)
    client.create_bucket(Bucket=name)
    for i in range(count):
        body = np.full(SHARD_TOKENS, i, np.uint16).tobytes()
        client.put_object(Bucket=name, Key=f"corpus/{i}.bin", Body=body)
    return client


def _source(uri: str) -> ShardTokenSource:
    source = shards(uri, mbs=1)
    assert isinstance(source, ShardTokenSource)
    return source


def _watch_downloads(monkeypatch: pytest.MonkeyPatch, root: Path) -> list[int]:
    """The cache's size right after each download, the moment it is fullest."""
    sizes: list[int] = []
    download = cache_module._download_verified

    def watched(*args: Any) -> None:
        download(*args)
        sizes.append(cache_module.cache_bytes(root))

    monkeypatch.setattr(cache_module, "_download_verified", watched)
    return sizes


def test_the_cache_never_exceeds_its_cap_and_fetches_an_evicted_shard_again(
    s3_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _bucket(s3_endpoint, "capped", 4)
    cache = tmp_path / "cache"
    monkeypatch.setenv(CACHE_MAX_BYTES_ENV, str(CAP))
    sizes = _watch_downloads(monkeypatch, cache)
    source = _source("s3://capped/corpus")
    corpus = cache / "s3" / "capped" / "corpus"
    for when, index in enumerate(range(4)):  # 0, 1, 2, 3, each used after the one before
        local = source.shards[index].fetch()
        used_at(local, 1_000 + when)
        assert np.array_equal(np.fromfile(local, np.uint16), np.full(SHARD_TOKENS, index, np.uint16))
    assert sorted(p.name for p in corpus.glob("*.bin")) == ["2.bin", "3.bin"]  # 0 and 1 evicted, oldest first
    again = source.shards[0].fetch()  # needed again: downloaded again, intact; 2 (least recent) goes
    assert np.array_equal(np.fromfile(again, np.uint16), np.zeros(SHARD_TOKENS, np.uint16))
    assert sorted(p.name for p in corpus.glob("*.bin")) == ["0.bin", "3.bin"]
    assert len(sizes) == 5 and max(sizes) <= CAP


def test_ranks_downloading_at_once_stay_within_the_cap_together(
    s3_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Eight ranks of a pod miss at once: each alone would find room, together they would overshoot.
    # flock locks of separate open() calls exclude each other between threads as between processes.
    _bucket(s3_endpoint, "together", 8)
    cache = tmp_path / "cache"
    monkeypatch.setenv(CACHE_MAX_BYTES_ENV, str(CAP))
    sizes = _watch_downloads(monkeypatch, cache)
    source = _source("s3://together/corpus")
    with ThreadPoolExecutor(max_workers=8) as pool:
        fetched = list(pool.map(lambda shard: shard.fetch().name, source.shards))
    assert sorted(fetched) == [f"{i}.bin" for i in range(8)]
    assert len(sizes) == 8 and max(sizes) <= CAP
    assert cache_module.cache_bytes(cache) <= CAP


def test_a_shard_larger_than_the_cap_names_the_field_to_raise(
    s3_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _bucket(s3_endpoint, "huge", 1)
    monkeypatch.setenv(CACHE_MAX_BYTES_ENV, str(SHARD_BYTES))
    with pytest.raises(
        DataError,
        match=r"more than the S3 cache may hold \(BTJ_CACHE_MAX_BYTES=4,096\).*"
        r"Fix: raise spec.cluster.localStorageGiB",
    ):
        _source("s3://huge/corpus").shards[0].fetch()


def test_weights_are_never_evicted_and_a_shard_that_cannot_fit_beside_them_is_refused(
    s3_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _bucket(s3_endpoint, "beside", 1)
    cache = tmp_path / "cache"
    weights = cache / "weights" / "models" / "llama" / "model.safetensors"
    weights.parent.mkdir(parents=True)
    weights.write_bytes(b"\0" * (CAP - SHARD_BYTES))
    monkeypatch.setenv(CACHE_MAX_BYTES_ENV, str(CAP))
    with pytest.raises(DataError, match=r"cannot evict.*Fix: raise spec.cluster.localStorageGiB"):
        _source("s3://beside/corpus").shards[0].fetch()
    assert weights.exists()


def test_a_download_waits_for_shards_other_ranks_hold_then_says_why(
    s3_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _bucket(s3_endpoint, "held", 3)
    monkeypatch.setenv(CACHE_MAX_BYTES_ENV, str(CAP))
    monkeypatch.setattr(cache_module, "SPACE_WAIT_SECONDS", 0.3)
    monkeypatch.setattr(cache_module, "SPACE_POLL_SECONDS", 0.05)
    source = _source("s3://held/corpus")
    first, second = source.shards[0].fetch(), source.shards[1].fetch()
    locks = [open(p.with_name(p.name + ".lock"), "w") for p in (first, second)]  # noqa: SIM115
    try:
        for lock in locks:
            fcntl.flock(lock, fcntl.LOCK_EX)  # other ranks are checking both cached shards
        with pytest.raises(DataError, match=r"every shard it could evict is in use by another rank"):
            source.shards[2].fetch()
    finally:
        for lock in locks:
            lock.close()
    assert first.exists() and second.exists()
    source.shards[2].fetch()  # released: the least recently used one makes room
    assert cache_module.cache_bytes(tmp_path / "cache") <= CAP


@pytest.mark.parametrize("raw", ["lots", "-5", "1.5e9"])
def test_a_bad_cap_names_the_variable_and_the_fix(
    raw: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(CACHE_MAX_BYTES_ENV, raw)
    with pytest.raises(DataError, match=rf"BTJ_CACHE_MAX_BYTES='{raw}': the S3 cache's size in bytes.*Fix"):
        cache_module.make_room(tmp_path, 1, keep=tmp_path / "x.bin")


def test_the_keep_free_default_stays_above_the_kubelets_eviction_thresholds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # nodefs.available<10% and imagefs.available<15% by default (docs/security.md).
    monkeypatch.delenv(cache_module.CACHE_KEEP_FREE_ENV, raising=False)
    assert cache_module.keep_free_fraction() > 0.15


def test_chat_companions_are_evicted_with_the_shards() -> None:
    assert set(cache_module.EVICTABLE_SUFFIXES) == {".bin", *COMPANION_SUFFIXES}
