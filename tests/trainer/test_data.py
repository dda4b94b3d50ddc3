"""Token sources: determinism, the learnable synthetic task, shards on disk and in S3 (moto), exact resume."""

from __future__ import annotations

import fcntl
import itertools
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
import torch

import blackwell_trainer.data.shard_cache as cache_module
from blackwell_trainer.data.tokens import (
    MAX_OPEN_SHARDS,
    DataError,
    DataLayout,
    ShardTokenSource,
    TokenSource,
    build_token_source,
)
from blackwell_trainer.plan.config import DatasetConfig, DatasetKind

SEQ = 8
VOCAB = 1000


def synthetic(rank: int = 0, world: int = 1, mbs: int = 2, seed: int = 1) -> TokenSource:
    return build_token_source(
        DatasetConfig(seed=seed),
        DataLayout(micro_batch_size=mbs, sequence_length=SEQ, vocab_size=VOCAB, rank=rank, world_size=world),
    )


def shards(uri: str, rank: int = 0, world: int = 1, mbs: int = 2, dtype: str = "uint16") -> TokenSource:
    return build_token_source(
        DatasetConfig(kind=DatasetKind.SHARDS, uri=uri, token_dtype=dtype, seed=3),
        DataLayout(micro_batch_size=mbs, sequence_length=SEQ, vocab_size=VOCAB, rank=rank, world_size=world),
    )


def batches(source: TokenSource, n: int) -> list[torch.Tensor]:
    return [source.next_batch().inputs for _ in range(n)]


def test_batches_have_the_contract_shape_and_shifted_labels() -> None:
    batch = synthetic(mbs=3).next_batch()
    inputs, labels = batch.inputs, batch.labels
    assert inputs.shape == labels.shape == (3, SEQ)
    assert inputs.dtype == labels.dtype == torch.int64
    assert torch.equal(inputs[:, 1:], labels[:, :-1])


def test_synthetic_is_deterministic_per_seed_and_rank() -> None:
    assert all(
        torch.equal(a, b) for a, b in zip(batches(synthetic(), 3), batches(synthetic(), 3), strict=True)
    )
    assert not torch.equal(
        synthetic(rank=0, world=2).next_batch().inputs, synthetic(rank=1, world=2).next_batch().inputs
    )
    assert not torch.equal(synthetic(seed=1).next_batch().inputs, synthetic(seed=2).next_batch().inputs)


def test_synthetic_task_is_learnable_from_the_previous_two_tokens() -> None:
    batch = synthetic(mbs=16).next_batch()
    inputs, labels = batch.inputs, batch.labels
    stride = (inputs[:, 1:2] - inputs[:, 0:1]) % VOCAB
    # The next token is always the current one plus the sequence's stride: a model can learn it.
    assert torch.equal(labels, (inputs + stride) % VOCAB)
    assert set(stride.flatten().tolist()) <= {1, 2, 3}


def test_ranks_split_one_global_sequence_of_samples() -> None:
    two = [synthetic(rank=r, world=2, mbs=2) for r in (0, 1)]
    one = synthetic(rank=0, world=1, mbs=4)
    for _ in range(3):
        assert torch.equal(torch.cat([s.next_batch().inputs for s in two]), one.next_batch().inputs)


def test_resume_continues_with_the_next_batch() -> None:
    source = synthetic()
    batches(source, 4)
    state = source.state_dict()
    expected = batches(source, 3)
    resumed = synthetic()
    resumed.load_state_dict(state)
    assert all(torch.equal(a, b) for a, b in zip(batches(resumed, 3), expected, strict=True))


def test_resume_on_fewer_ranks_skips_and_repeats_nothing() -> None:
    two = [synthetic(rank=r, world=2, mbs=2) for r in (0, 1)]
    for s in two:
        batches(s, 5)
    states = [s.state_dict() for s in two]
    assert states[0] == states[1]  # the position is global: every rank saves the same one
    expected = torch.cat([s.next_batch().inputs for s in two])
    one = synthetic(rank=0, world=1, mbs=4)
    one.load_state_dict(states[0])
    assert torch.equal(one.next_batch().inputs, expected)


def test_resume_refuses_another_sequence_length_or_seed() -> None:
    state = synthetic().state_dict()
    with pytest.raises(DataError, match="seed"):
        synthetic(seed=9).load_state_dict(state)
    other = build_token_source(
        DatasetConfig(seed=1), DataLayout(micro_batch_size=2, sequence_length=16, vocab_size=VOCAB)
    )
    with pytest.raises(DataError, match="sequence_length"):
        other.load_state_dict(state)


@pytest.fixture
def shard_dir(tmp_path: Path) -> Path:
    """Three uint16 shards of consecutive token ids, so every window tells where it came from."""
    folder = tmp_path / "shards"
    folder.mkdir()
    start = 0
    for name, length in (("a.bin", 41), ("b.bin", 25), ("c.bin", 33)):
        np.arange(start, start + length, dtype=np.uint16).tofile(folder / name)
        start += length
    (folder / "README.txt").write_text("not a shard")
    return folder


def test_shard_windows_are_contiguous_slices_of_the_files(shard_dir: Path) -> None:
    batch = shards(str(shard_dir)).next_batch()
    inputs, labels = batch.inputs, batch.labels
    assert torch.equal(inputs[:, 1:], labels[:, :-1])
    for row in torch.cat([inputs, labels[:, -1:]], dim=1):
        assert torch.equal(row, torch.arange(int(row[0]), int(row[0]) + SEQ + 1))


def test_an_epoch_visits_every_window_once_across_ranks(shard_dir: Path) -> None:
    # Windows per shard: (41-1)//8 + (25-1)//8 + (33-1)//8 = 5 + 3 + 4 = 12; 2 ranks x 2 take 4 a step.
    sources = [shards(str(shard_dir), rank=r, world=2) for r in (0, 1)]
    starts = [int(x) for _ in range(3) for s in sources for x in s.next_batch().inputs[:, 0]]
    assert len(starts) == len(set(starts)) == 12
    # The fourth step starts epoch 1: the same windows in another shard order.
    assert sources[0].state_dict()["epoch"] == 0
    sources[0].next_batch()
    assert sources[0].state_dict()["epoch"] == 1


def test_uint32_shards(tmp_path: Path) -> None:
    np.arange(100, 100 + 50, dtype=np.uint32).tofile(tmp_path / "x.bin")
    batch = shards(str(tmp_path), dtype="uint32", mbs=1).next_batch()
    inputs = batch.inputs
    assert int(inputs[0, 0]) in range(100, 150)


def test_shard_resume_is_exact_and_checks_the_data_set(shard_dir: Path, tmp_path: Path) -> None:
    source = shards(str(shard_dir))
    batches(source, 7)
    state = source.state_dict()
    expected = batches(source, 4)
    resumed = shards(str(shard_dir))
    resumed.load_state_dict(state)
    assert all(torch.equal(a, b) for a, b in zip(batches(resumed, 4), expected, strict=True))
    np.arange(10, dtype=np.uint16).tofile(shard_dir / "d.bin")  # the data set changed under the job
    with pytest.raises(DataError, match="fingerprint"):
        shards(str(shard_dir)).load_state_dict(state)


def test_token_ids_beyond_the_vocabulary_are_an_error(tmp_path: Path) -> None:
    np.full(100, VOCAB + 5, dtype=np.uint16).tofile(tmp_path / "x.bin")
    with pytest.raises(DataError, match="vocabSize"):
        shards(str(tmp_path)).next_batch()


def test_missing_or_empty_data_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="not a folder"):
        shards(str(tmp_path / "nope"))
    with pytest.raises(DataError, match=r"no \*\.bin"):
        shards(str(tmp_path))
    np.arange(5, dtype=np.uint16).tofile(tmp_path / "tiny.bin")
    with pytest.raises(DataError, match="fewer than one step"):
        shards(str(tmp_path))


@pytest.fixture
def s3_endpoint(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[str]:
    """A moto S3 server on a free local port (real HTTP), with boto3 pointed at it by environment."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("BTJ_CACHE_DIR", str(tmp_path / "cache"))
    # How full this machine's disk is must not decide what these tests cache (a CI disk over 90% full
    # would evict every shard); the eviction tests below set the share and the disk they run on.
    monkeypatch.setenv("BTJ_CACHE_KEEP_FREE_FRACTION", "0")
    yield endpoint
    server.stop()


def test_s3_shards_download_once_and_match_the_local_ones(
    s3_endpoint: str, shard_dir: Path, tmp_path: Path
) -> None:
    import boto3

    client = boto3.client("s3", endpoint_url=s3_endpoint)
    client.create_bucket(Bucket="tokens")
    for f in shard_dir.iterdir():
        client.upload_file(str(f), "tokens", f"corpus/{f.name}")
    client.put_object(Bucket="tokens", Key="corpus-old/z.bin", Body=b"\xff\xff" * 64)  # a sibling prefix

    remote = shards("s3://tokens/corpus", mbs=3)
    local = shards(str(shard_dir), mbs=3)
    assert all(torch.equal(a, b) for a, b in zip(batches(remote, 5), batches(local, 5), strict=True))
    cached = sorted(p.name for p in (tmp_path / "cache" / "s3" / "tokens" / "corpus").glob("*.bin"))
    assert cached == ["a.bin", "b.bin", "c.bin"]
    # A second source (another rank on the node) reuses the cache instead of downloading again.
    stamp = (tmp_path / "cache" / "s3" / "tokens" / "corpus" / "a.bin").stat().st_mtime_ns
    batches(shards("s3://tokens/corpus", mbs=3), 5)
    assert (tmp_path / "cache" / "s3" / "tokens" / "corpus" / "a.bin").stat().st_mtime_ns == stamp


def used_at(shard: Path, when: float) -> None:
    """Mark a cached shard last used at `when` (its tag's mtime: the eviction order)."""
    os.utime(shard.with_name(shard.name + ".etag"), (when, when))


def test_a_cache_hit_keeps_the_shards_mtime_to_the_nanosecond(s3_endpoint: str, tmp_path: Path) -> None:
    # A hit marks the shard recently used (its tag, for the eviction order) and must not touch the shard:
    # setting its mtime from a float of seconds moved it by up to ~240 ns on every hit (a flaky test
    # above), and any change of its times moves its ctime, which is what shows a rewrite.
    import boto3

    client = boto3.client("s3", endpoint_url=s3_endpoint)
    client.create_bucket(Bucket="hits")
    client.put_object(Bucket="hits", Key="corpus/a.bin", Body=np.arange(64, dtype=np.uint16).tobytes())
    head = client.head_object(Bucket="hits", Key="corpus/a.bin")
    local = tmp_path / "cache" / "s3" / "hits" / "corpus" / "a.bin"
    cache_module.download_once(client, "hits", "corpus/a.bin", local, head["ContentLength"], head["ETag"])
    # An mtime no float of seconds holds exactly at this epoch (odd nanoseconds).
    stamp = local.stat().st_mtime_ns // 1000 * 1000 + 123
    os.utime(local, ns=(stamp, stamp))
    used_at(local, 1_000)
    cache_module.download_once(client, "hits", "corpus/a.bin", local, head["ContentLength"], head["ETag"])
    assert local.stat().st_mtime_ns == stamp
    assert cache_module.last_used(local) > 1_000


def test_a_shard_replaced_in_s3_is_fetched_again(s3_endpoint: str, tmp_path: Path) -> None:
    # The node-level cache outlives the container: a cached copy of the same size but an older ETag
    # (the object was re-uploaded) must not be served.
    import boto3

    client = boto3.client("s3", endpoint_url=s3_endpoint)
    client.create_bucket(Bucket="replaced")
    old, new = np.arange(64, dtype=np.uint16), np.arange(64, 128, dtype=np.uint16)
    client.put_object(Bucket="replaced", Key="corpus/a.bin", Body=old.tobytes())
    assert int(batches(shards("s3://replaced/corpus", mbs=1), 1)[0][0, 0]) in set(old.tolist())
    client.put_object(Bucket="replaced", Key="corpus/a.bin", Body=new.tobytes())  # same size, new content
    assert int(batches(shards("s3://replaced/corpus", mbs=1), 1)[0][0, 0]) in set(new.tolist())
    cached = np.fromfile(tmp_path / "cache" / "s3" / "replaced" / "corpus" / "a.bin", dtype=np.uint16)
    assert np.array_equal(cached, new)


def test_many_shards_are_read_with_few_files_open(tmp_path: Path) -> None:
    # 20 shards of 2 windows each; an epoch reads all 40 windows while at most MAX_OPEN_SHARDS stay mapped.
    for i in range(20):
        np.arange(i * 17, i * 17 + 17, dtype=np.uint16).tofile(tmp_path / f"{i:02d}.bin")
    source = shards(str(tmp_path), mbs=4)
    assert isinstance(source, ShardTokenSource)
    starts = [int(x) for _ in range(10) for x in source.next_batch().inputs[:, 0]]
    assert sorted(starts) == sorted(i * 17 + w * SEQ for i in range(20) for w in range(2))
    assert len(source._open) <= MAX_OPEN_SHARDS


class _Usage(NamedTuple):
    total: int
    used: int
    free: int


class _SmallDisk:
    """shutil.disk_usage of a `total`-byte disk that holds only the cache (its free space is what the cache
    leaves): a full NVMe without filling the machine's, as an unprivileged test cannot mount a small one."""

    def __init__(self, root: Path, total: int) -> None:
        self.root, self.total = root, total

    def __call__(self, path: object) -> _Usage:
        used = sum(p.stat().st_size for p in self.root.rglob("*") if p.is_file())
        return _Usage(self.total, used, self.total - used)


def test_the_s3_cache_evicts_the_least_recently_used_shard_to_keep_the_disk_free(
    s3_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import boto3

    client = boto3.client("s3", endpoint_url=s3_endpoint)
    client.create_bucket(Bucket="big")
    for i, name in enumerate("abc"):  # three shards of 128 bytes
        client.put_object(Bucket="big", Key=f"corpus/{name}.bin", Body=np.full(64, i, np.uint16).tobytes())
    cache = tmp_path / "cache"
    monkeypatch.setenv(cache_module.CACHE_KEEP_FREE_ENV, "0.1")
    # 600 bytes with 10% kept free: two shards (and their tags, ~130 bytes each) fit, a third needs an
    # eviction.
    monkeypatch.setattr(cache_module.shutil, "disk_usage", _SmallDisk(cache, 600))
    source = shards("s3://big/corpus", mbs=1)
    assert isinstance(source, ShardTokenSource)
    fetched = [source.shards[i].fetch() for i in (0, 1)]  # a, b
    used_at(fetched[0], 1_000)  # a used long ago: b is the fresher one
    third = source.shards[2].fetch()  # c: a is evicted
    corpus = cache / "s3" / "big" / "corpus"
    assert sorted(p.name for p in corpus.glob("*.bin")) == ["b.bin", "c.bin"]
    assert not (corpus / "a.bin.etag").exists()
    assert np.array_equal(np.fromfile(third, dtype=np.uint16), np.full(64, 2, np.uint16))
    # Needed again, a comes back (and b, now the least recently used, goes); its data is intact.
    used_at(corpus / "b.bin", 2_000)
    again = source.shards[0].fetch()
    assert np.array_equal(np.fromfile(again, dtype=np.uint16), np.full(64, 0, np.uint16))
    assert sorted(p.name for p in corpus.glob("*.bin")) == ["a.bin", "c.bin"]


def test_a_shard_another_rank_holds_is_never_evicted(
    s3_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import boto3

    client = boto3.client("s3", endpoint_url=s3_endpoint)
    client.create_bucket(Bucket="held")
    for name in "ab":
        client.put_object(Bucket="held", Key=f"corpus/{name}.bin", Body=np.zeros(64, np.uint16).tobytes())
    cache = tmp_path / "cache"
    monkeypatch.setenv(cache_module.CACHE_KEEP_FREE_ENV, "0.1")
    monkeypatch.setattr(cache_module.shutil, "disk_usage", _SmallDisk(cache, 200))  # room for one shard
    source = shards("s3://held/corpus", mbs=1)
    assert isinstance(source, ShardTokenSource)
    first = source.shards[0].fetch()
    with open(first.with_name(first.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another rank is checking or downloading it
        source.shards[1].fetch()  # no room, nothing idle to evict: downloaded anyway, with a warning
    assert first.exists()


def test_a_bad_keep_free_share_names_the_variable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(cache_module.CACHE_KEEP_FREE_ENV, "half")
    with pytest.raises(DataError, match=r"BTJ_CACHE_KEEP_FREE_FRACTION='half'.*Fix"):
        cache_module.make_room(tmp_path, 1, keep=tmp_path / "x.bin")


# A cached copy is used only with the object's content hash (issue 24): whoever rewrites a cached shard in
# place, to the same size and behind the cache's back, gets it detected and fetched again.
PART = 5 << 20  # S3's smallest multipart part


def _upload(client: object, bucket: str, key: str, data: bytes, how: str) -> None:
    from boto3.s3.transfer import TransferConfig

    if how == "multipart":
        config = TransferConfig(multipart_threshold=PART, multipart_chunksize=PART)
        path = Path(os.environ["BTJ_CACHE_DIR"]).parent / "upload.bin"
        path.write_bytes(data)
        client.upload_file(str(path), bucket, key, Config=config)  # type: ignore[attr-defined]
        return
    extra = {
        "plain": {},
        "sha256": {"ChecksumAlgorithm": "SHA256"},
        "sha1": {"ChecksumAlgorithm": "SHA1"},
        "kms": {"ServerSideEncryption": "aws:kms"},  # its ETag is not the bytes' MD5: the CRC32 decides
    }[how]
    client.put_object(Bucket=bucket, Key=key, Body=data, **extra)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("how", "verified_by"),
    [
        ("plain", "ETag (MD5)"),
        ("sha256", "ChecksumSHA256"),
        ("sha1", "ChecksumSHA1"),
        ("kms", "ChecksumCRC32"),
        ("multipart", "ETag (multipart MD5)"),
    ],
)
def test_a_poisoned_cached_shard_is_detected_and_fetched_again(
    s3_endpoint: str, tmp_path: Path, how: str, verified_by: str, caplog: pytest.LogCaptureFixture
) -> None:
    import boto3

    client = boto3.client("s3", endpoint_url=s3_endpoint)
    client.create_bucket(Bucket="poison")
    size = 2 * PART + 4096 if how == "multipart" else 4096
    honest = np.random.default_rng(0).integers(0, VOCAB, size // 2, dtype=np.uint16).tobytes()
    _upload(client, "poison", "corpus/a.bin", honest, how)
    head = client.head_object(Bucket="poison", Key="corpus/a.bin")
    local = tmp_path / "cache" / "s3" / "poison" / "corpus" / "a.bin"
    fetch = (client, "poison", "corpus/a.bin", local, head["ContentLength"], head["ETag"].strip('"'))
    cache_module.download_once(*fetch)
    assert json.loads(local.with_name("a.bin.etag").read_text())["verifiedBy"] == verified_by
    # Rewritten in place: same size, same name, the tag left as it was.
    with open(local, "r+b") as f:
        f.seek(100)
        f.write(b"\x00\x01" * 8)
    assert local.stat().st_size == len(honest) and local.read_bytes() != honest
    with caplog.at_level("WARNING", logger=cache_module.__name__):
        cache_module.download_once(*fetch)
    assert local.read_bytes() == honest
    assert f"does not match s3://poison/corpus/a.bin's {verified_by}" in caplog.text
    # An untouched copy is a plain hit: no warning, no new download.
    caplog.clear()
    inode = local.stat().st_ino
    cache_module.download_once(*fetch)
    assert local.stat().st_ino == inode and "does not match" not in caplog.text


def test_a_rewrite_that_puts_the_mtime_back_is_still_detected(
    s3_endpoint: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Same inode, same size, the mtime set back with utime: only the ctime (which no unprivileged process
    # can set) shows the write, so the cache's signature must hold it.
    import time

    import boto3

    client = boto3.client("s3", endpoint_url=s3_endpoint)
    client.create_bucket(Bucket="poison3")
    honest = np.arange(2048, dtype=np.uint16).tobytes()
    client.put_object(Bucket="poison3", Key="corpus/a.bin", Body=honest)
    head = client.head_object(Bucket="poison3", Key="corpus/a.bin")
    local = tmp_path / "cache" / "s3" / "poison3" / "corpus" / "a.bin"
    fetch = (client, "poison3", "corpus/a.bin", local, len(honest), head["ETag"].strip('"'))
    cache_module.download_once(*fetch)
    before = local.stat()
    time.sleep(0.05)  # past the file system's timestamp granularity: the write below moves the ctime
    with open(local, "r+b") as f:
        f.seek(10)
        f.write(b"\xff\xff" * 4)
    os.utime(local, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = local.stat()
    same = ("st_ino", "st_size", "st_mtime_ns")
    assert [getattr(after, k) for k in same] == [getattr(before, k) for k in same]
    assert after.st_ctime_ns != before.st_ctime_ns and local.read_bytes() != honest
    with caplog.at_level("WARNING", logger=cache_module.__name__):
        cache_module.download_once(*fetch)
    assert local.read_bytes() == honest
    assert "does not match s3://poison3/corpus/a.bin's ETag (MD5)" in caplog.text


def test_a_poisoned_shard_is_never_read_by_the_data_source(s3_endpoint: str, tmp_path: Path) -> None:
    """Through the trainer's own path: a second data source (a rank starting later) reads the honest bytes."""
    import boto3

    client = boto3.client("s3", endpoint_url=s3_endpoint)
    client.create_bucket(Bucket="poison2")
    honest = np.arange(64, dtype=np.uint16)
    client.put_object(Bucket="poison2", Key="corpus/a.bin", Body=honest.tobytes())
    assert set(batches(shards("s3://poison2/corpus", mbs=1), 1)[0].flatten().tolist()) <= set(honest.tolist())
    local = tmp_path / "cache" / "s3" / "poison2" / "corpus" / "a.bin"
    np.full(64, 999, dtype=np.uint16).tofile(local)  # the same size, other tokens
    seen = batches(shards("s3://poison2/corpus", mbs=1), 4)
    assert 999 not in {int(x) for batch in seen for x in batch.flatten()}
    assert np.array_equal(np.fromfile(local, dtype=np.uint16), honest)


def test_an_object_replaced_while_it_is_read_is_refused_not_cached(s3_endpoint: str, tmp_path: Path) -> None:
    # Each GET returns bytes other than the HEAD described (the object is re-uploaded in between, by a
    # second client on the real server): both tries fail the hash, nothing is cached, the error says why.
    import boto3

    client = boto3.client("s3", endpoint_url=s3_endpoint)
    writer = boto3.client("s3", endpoint_url=s3_endpoint)
    client.create_bucket(Bucket="moving")
    client.put_object(Bucket="moving", Key="corpus/a.bin", Body=b"\x01\x00" * 64, ChecksumAlgorithm="SHA256")
    head = client.head_object(Bucket="moving", Key="corpus/a.bin")
    counter = iter(range(2, 100))

    def replace(**_: object) -> None:
        body = bytes([next(counter), 0]) * 64
        writer.put_object(Bucket="moving", Key="corpus/a.bin", Body=body, ChecksumAlgorithm="SHA256")

    client.meta.events.register("before-call.s3.GetObject", replace)
    local = tmp_path / "cache" / "s3" / "moving" / "corpus" / "a.bin"
    with pytest.raises(DataError, match=r"s3://moving/corpus/a.bin: .*ChecksumSHA256 twice.*Fix"):
        cache_module.download_once(client, "moving", "corpus/a.bin", local, 128, head["ETag"].strip('"'))
    assert not local.exists()
    assert not list(local.parent.glob("a.bin.part-*"))


def test_parts_of_different_sizes_fall_back_to_the_next_hash(s3_endpoint: str, tmp_path: Path) -> None:
    # A multipart ETag is recomputed assuming equal parts; an upload whose parts differ does not match it,
    # which must not fail a good download: the full-object hash after it (here none) decides.
    import boto3

    client = boto3.client("s3", endpoint_url=s3_endpoint)
    client.create_bucket(Bucket="uneven")
    data = np.random.default_rng(1).integers(0, VOCAB, (2 * PART + PART // 2) // 2, dtype=np.uint16).tobytes()
    upload = client.create_multipart_upload(Bucket="uneven", Key="corpus/a.bin")["UploadId"]
    cuts = [0, PART + PART // 2, 2 * PART + PART // 2, len(data)]  # 7.5 MiB, 5 MiB, then the rest
    parts = []
    for number, (start, end) in enumerate(itertools.pairwise(cuts), start=1):
        answer = client.upload_part(
            Bucket="uneven", Key="corpus/a.bin", UploadId=upload, PartNumber=number, Body=data[start:end]
        )
        parts.append({"PartNumber": number, "ETag": answer["ETag"]})
    client.complete_multipart_upload(
        Bucket="uneven", Key="corpus/a.bin", UploadId=upload, MultipartUpload={"Parts": parts}
    )
    head = client.head_object(Bucket="uneven", Key="corpus/a.bin")
    local = tmp_path / "cache" / "s3" / "uneven" / "corpus" / "a.bin"
    cache_module.download_once(client, "uneven", "corpus/a.bin", local, len(data), head["ETag"].strip('"'))
    assert local.read_bytes() == data
