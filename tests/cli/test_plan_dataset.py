"""`btj plan` checks a prepared data set it can read as the trainer will, refusing in the trainer's words."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from blackwell_operator.cli import _register_commands, app
from blackwell_trainer.data.tokens import DataError, DataLayout, build_token_source
from blackwell_trainer.plan.config import DatasetConfig, DatasetKind
from blackwell_trainer.prepare import Options, prepare
from blackwell_trainer.weights.load import check_data_tokenizer
from tests.cli.test_plan_weights import job, named
from tests.support.hf_models import save_hf_model
from tests.support.text_data import VOCAB, make_documents, save_tokenizer

_register_commands()
runner = CliRunner()


@pytest.fixture(scope="module")
def fsx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A mounted volume holding a checkpoint with its tokenizer and text prepared with that tokenizer."""
    root = tmp_path_factory.mktemp("fsx")
    save_hf_model("llama3.1", root / "llama", vocab_size=VOCAB)
    save_tokenizer(root / "llama")
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": d}) + "\n" for d in make_documents(200)))
    prepare(Options(inputs=[str(corpus)], output=root / "shards", tokenizer=root / "llama", chunk_bytes=4096))
    return root


# The fixture's 90 samples of 129 tokens feed 2 GPUs x 8; auto would choose 256 (issue 26: not enough).
FITTING = {"microBatchSize": 8}


def plan(
    weights: Path,
    shards: Path,
    dtype: str = "uint16",
    tuning: dict[str, object] | None = None,
    command: str = "plan",
    sequences: int = 16,
) -> tuple[int, str]:
    """`btj plan` of a job mounting one volume that holds both (pytest's temporary root)."""
    volume = Path(os.path.commonpath([weights, shards]))
    dataset = {"kind": "shards", "uri": str(shards), "tokenDtype": dtype}
    # The model named, as the operator needs it (issue 39): the checkpoint's own.
    path = job(volume, {"architecture": named(weights), "weights": {"uri": str(weights)}}, dataset=dataset)
    manifest = yaml.safe_load(path.read_text())
    manifest["spec"]["tuning"] = FITTING if tuning is None else tuning
    # The global batch pinned (the planner's rule would ask for far more than the fixture holds).
    manifest["spec"]["training"]["globalBatchTokens"] = (
        sequences * manifest["spec"]["training"]["sequenceLength"]
    )
    path.write_text(yaml.safe_dump(manifest))
    result = runner.invoke(app, [command, str(path), "-o", "json"])
    return result.exit_code, result.stderr.strip()


def trainers_line(shards: Path, dtype: str = "uint16", vocab: int = VOCAB) -> str:
    """What the trainer says of the same data set at start (its stderr line)."""
    with pytest.raises(DataError) as caught:
        build_token_source(
            DatasetConfig(kind=DatasetKind.SHARDS, uri=str(shards), token_dtype=dtype),
            DataLayout(micro_batch_size=1, sequence_length=16, vocab_size=vocab),
        )
    return f"error: {caught.value}"


def test_data_prepared_with_the_checkpoints_tokenizer_plans(fsx: Path) -> None:
    code, err = plan(fsx / "llama", fsx / "shards")
    assert code == 0, err


def test_another_token_dtype_is_refused_in_the_trainers_words(fsx: Path) -> None:
    code, err = plan(fsx / "llama", fsx / "shards", dtype="uint32")
    assert code == 2
    assert err == trainers_line(fsx / "shards", dtype="uint32")
    assert err.endswith("set spec.training.dataset.tokenDtype: uint16")


def test_a_vocabulary_larger_than_the_models_is_refused_in_the_trainers_words(
    fsx: Path, tmp_path: Path
) -> None:
    small = tmp_path / "small"
    save_hf_model("llama3.1", small, vocab_size=256)  # no tokenizer: only the vocabulary can be compared
    shutil.copytree(fsx / "shards", tmp_path / "shards")
    code, err = plan(small, tmp_path / "shards")
    assert code == 2
    assert err == trainers_line(tmp_path / "shards", vocab=256)
    assert "larger than the model's vocabSize 256" in err


def test_a_missing_shard_is_refused_in_the_trainers_words(fsx: Path, tmp_path: Path) -> None:
    shards = tmp_path / "shards"
    shutil.copytree(fsx / "shards", shards)
    next(iter(sorted(shards.glob("*.bin")))).unlink()
    code, err = plan(fsx / "llama", shards)
    assert code == 2 and err == trainers_line(shards)


def test_another_tokenizer_than_the_weights_is_refused_in_the_trainers_words(
    fsx: Path, tmp_path: Path
) -> None:
    other = tmp_path / "other"
    shutil.copytree(fsx / "llama", other)
    save_tokenizer(other, vocab_size=280)  # same weights, another tokenizer.json
    shutil.copytree(fsx / "shards", tmp_path / "shards")
    code, err = plan(other, tmp_path / "shards")
    assert code == 2
    manifest = build_token_source(
        DatasetConfig(kind=DatasetKind.SHARDS, uri=str(tmp_path / "shards"), token_dtype="uint16"),
        DataLayout(micro_batch_size=1, sequence_length=16, vocab_size=VOCAB),
    ).manifest  # type: ignore[attr-defined]
    with pytest.raises(DataError) as caught:
        check_data_tokenizer(str(other), str(tmp_path / "shards"), manifest)
    assert err == f"error: {caught.value}"
    assert "was tokenized with another tokenizer than weights.uri" in err


def test_a_broken_manifest_is_refused_in_the_trainers_words(fsx: Path, tmp_path: Path) -> None:
    shards = tmp_path / "shards"
    shutil.copytree(fsx / "shards", shards)
    (shards / "manifest.json").write_text('{"format": "something else"}')
    code, err = plan(fsx / "llama", shards)
    assert code == 2 and err == trainers_line(shards)


def test_data_too_small_for_one_step_is_refused_naming_what_works(fsx: Path) -> None:
    # Issue 26: micro-batch 256 (auto's choice on 2 GPUs at sequence 128) for 12K tokens passed `btj plan`.
    code, err = plan(fsx / "llama", fsx / "shards", tuning={}, sequences=512)
    assert code == 2
    assert "fewer than one step needs (2 data-parallel ranks x micro-batch 256 = 512 samples)" in err, err
    # The trainer says the same of the same data and plan.
    with pytest.raises(DataError) as caught:
        build_token_source(
            DatasetConfig(kind=DatasetKind.SHARDS, uri=str(fsx / "shards"), token_dtype="uint16"),
            DataLayout(micro_batch_size=256, sequence_length=128, vocab_size=VOCAB, world_size=2),
        )
    assert err == f"error: {caught.value}"
    # The micro-batch it names plans, one more does not; no shorter sequence is offered below the minimum.
    largest = int(err.split("spec.tuning.microBatchSize: ")[1].split()[0])
    fits = plan(fsx / "llama", fsx / "shards", tuning={"microBatchSize": largest}, sequences=2 * largest)
    assert fits[0] == 0
    over = plan(
        fsx / "llama", fsx / "shards", tuning={"microBatchSize": largest + 1}, sequences=2 * largest + 2
    )
    assert over[0] == 2
    assert "sequenceLength" not in err


def test_data_this_machine_cannot_read_is_left_to_the_trainer(fsx: Path) -> None:
    code, err = plan(fsx / "llama", fsx / "not-here", dtype="uint32")
    assert code == 0, err
