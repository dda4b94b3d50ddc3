"""The trainer checks a prepared folder's manifest.json against the plan before the first step."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from blackwell_trainer.data.tokens import DataError, DataLayout, TokenSource, build_token_source
from blackwell_trainer.plan.config import DatasetConfig, DatasetKind
from blackwell_trainer.plan.shard_manifest import MANIFEST_NAME
from blackwell_trainer.prepare import Options, prepare
from tests.support.text_data import make_documents, save_tokenizer

from .test_data import s3_endpoint

__all__ = ["s3_endpoint"]  # the moto server fixture, shared with test_data

SEQ = 16


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("prepared")
    tokenizer = save_tokenizer(root / "tokenizer")
    source = root / "corpus.jsonl"
    source.write_text("".join(json.dumps({"text": d}) + "\n" for d in make_documents(400)))
    prepare(Options(inputs=[str(source)], output=root / "shards", tokenizer=tokenizer, chunk_bytes=4096))
    return root / "shards"


@pytest.fixture
def copy(prepared: Path, tmp_path: Path) -> Iterator[Path]:
    """A copy of the prepared folder each test may break."""
    target = tmp_path / "shards"
    target.mkdir()
    for f in prepared.iterdir():
        (target / f.name).write_bytes(f.read_bytes())
    yield target


def source(uri: str, *, dtype: str = "uint16", vocab: int = 300) -> TokenSource:
    return build_token_source(
        DatasetConfig(kind=DatasetKind.SHARDS, uri=uri, token_dtype=dtype),
        DataLayout(micro_batch_size=2, sequence_length=SEQ, vocab_size=vocab, rank=0, world_size=1),
    )


def test_a_matching_folder_trains(copy: Path) -> None:
    batch = source(str(copy)).next_batch()
    inputs, labels = batch.inputs, batch.labels
    assert inputs.shape == (2, SEQ) and int(labels.max()) < 300


def test_another_dtype_names_the_field_and_the_fix(copy: Path) -> None:
    with pytest.raises(
        DataError,
        match=r"prepared as uint16 \(manifest.json\) but dataset.tokenDtype is uint32; "
        r"set spec.training.dataset.tokenDtype: uint16",
    ):
        source(str(copy), dtype="uint32")


def test_a_vocabulary_larger_than_the_models_is_refused(copy: Path) -> None:
    with pytest.raises(
        DataError,
        match=r"vocabulary of 300 .* larger than the model's vocabSize 256; prepare the "
        r"data with this model's own tokenizer",
    ):
        source(str(copy), vocab=256)


def test_a_missing_shard_is_named(copy: Path) -> None:
    (copy / "part-00000-00002.bin").unlink()
    with pytest.raises(DataError, match=r"lacks part-00000-00002.bin, which manifest.json lists"):
        source(str(copy))


def test_a_truncated_shard_is_named(copy: Path) -> None:
    shard = copy / "part-00000-00001.bin"
    shard.write_bytes(shard.read_bytes()[:-2])
    with pytest.raises(
        DataError, match=r"part-00000-00001.bin has \d+ bytes but manifest.json says \d+ uint16"
    ):
        source(str(copy))


def test_a_shard_of_another_data_set_is_named(copy: Path) -> None:
    (copy / "other.bin").write_bytes(b"\x00\x01" * 64)
    with pytest.raises(DataError, match=r"holds other.bin, which manifest.json does not list"):
        source(str(copy))


def test_a_broken_manifest_is_named(copy: Path) -> None:
    (copy / MANIFEST_NAME).write_text('{"format": "something else"}')
    with pytest.raises(DataError, match=r"manifest.json is not a shard manifest"):
        source(str(copy))


def test_the_s3_copy_is_checked_the_same_way(s3_endpoint: str, copy: Path) -> None:
    import boto3

    client = boto3.client("s3", endpoint_url=s3_endpoint)
    client.create_bucket(Bucket="prepared")
    for f in copy.iterdir():
        if f.name != "part-00000-00003.bin":  # an upload that stopped early
            client.upload_file(str(f), "prepared", f"corpus/{f.name}")
    with pytest.raises(DataError, match=r"dataset.uri s3://prepared/corpus lacks part-00000-00003.bin"):
        source("s3://prepared/corpus")
    client.upload_file(str(copy / "part-00000-00003.bin"), "prepared", "corpus/part-00000-00003.bin")
    assert source("s3://prepared/corpus").next_batch().inputs.shape == (2, SEQ)
