"""Data preparation with a real tokenizer: each input format, parallel, resumed after a kill, bad input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from blackwell_trainer.data.text_inputs import InputError
from blackwell_trainer.plan.shard_manifest import MANIFEST_NAME, ShardManifest
from blackwell_trainer.prepare import STATE_DIR, Options, PrepareError, main, prepare
from tests.support.text_data import EOS, make_documents, read_documents, save_tokenizer

KILL_TIMEOUT_S = 60  # safety net for the subprocess; no assertion depends on timing


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tokenizer(tmp_path_factory.mktemp("tokenizer"))


def write_jsonl(path: Path, docs: list[str], field: str = "text") -> Path:
    path.write_text("".join(json.dumps({field: d, "id": i}) + "\n" for i, d in enumerate(docs)))
    return path


def run(inputs: list[Path], out: Path, tokenizer: Path, **options: object) -> ShardManifest:
    return prepare(Options(inputs=[str(p) for p in inputs], output=out, tokenizer=tokenizer, **options))  # type: ignore[arg-type]


def folder_bytes(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def test_jsonl_documents_come_back_in_order_each_ending_with_eos(tokenizer: Path, tmp_path: Path) -> None:
    docs = make_documents(300)
    source = write_jsonl(tmp_path / "corpus.jsonl", docs)
    manifest = run([source], tmp_path / "out", tokenizer, chunk_bytes=4096)

    assert len(manifest.shards) > 3  # the file was cut into several units on line boundaries
    assert read_documents(tmp_path / "out", tokenizer, "uint16") == docs
    assert manifest.token_dtype == "uint16"  # a 300-token vocabulary fits in two bytes
    assert manifest.documents == 300 and manifest.skipped == 0
    assert manifest.tokens == sum(s.tokens for s in manifest.shards)
    assert manifest.tokens == sum(os.path.getsize(tmp_path / "out" / s.name) // 2 for s in manifest.shards)
    assert manifest.vocab_size == 300 and manifest.max_token_id < 300
    from tokenizers import Tokenizer

    assert manifest.eos_token_id == Tokenizer.from_file(str(tokenizer / "tokenizer.json")).token_to_id(EOS)
    assert len(manifest.tokenizer_sha256) == 64
    assert not (tmp_path / "out" / STATE_DIR).exists()  # the run's records go once the manifest is written
    on_disk = ShardManifest.model_validate_json((tmp_path / "out" / MANIFEST_NAME).read_text())
    assert on_disk == manifest


def test_parquet_row_groups_with_a_null_row(tokenizer: Path, tmp_path: Path) -> None:
    docs = make_documents(50)
    texts: list[str | None] = [*docs[:20], None, *docs[20:]]
    pq.write_table(pa.table({"content": texts}), tmp_path / "corpus.parquet", row_group_size=16)
    manifest = run([tmp_path / "corpus.parquet"], tmp_path / "out", tokenizer, text_field="content")

    assert len(manifest.shards) == 4  # 51 rows in row groups of 16
    assert read_documents(tmp_path / "out", tokenizer, "uint16") == docs
    assert manifest.skipped == 1 and manifest.documents == 50


def test_text_files_as_documents_or_lines(tokenizer: Path, tmp_path: Path) -> None:
    docs = [d.replace("\n", " ") for d in make_documents(6)]
    folder = tmp_path / "texts"
    folder.mkdir()
    for index, doc in enumerate(docs[:3]):
        (folder / f"{index}.txt").write_text(doc)
    run([folder], tmp_path / "files", tokenizer)
    assert read_documents(tmp_path / "files", tokenizer, "uint16") == docs[:3]

    (tmp_path / "lines.txt").write_text("\n".join(docs) + "\n\n")
    manifest = run([tmp_path / "lines.txt"], tmp_path / "lines", tokenizer, text_lines=True)
    assert read_documents(tmp_path / "lines", tokenizer, "uint16") == docs
    assert manifest.documents == 6


def test_mixed_formats_and_uint32(tokenizer: Path, tmp_path: Path) -> None:
    docs = make_documents(30)
    write_jsonl(tmp_path / "a.jsonl", docs[:10])
    pq.write_table(pa.table({"text": docs[10:20]}), tmp_path / "b.parquet")
    (tmp_path / "c.txt").write_text(docs[20])
    inputs = [tmp_path / "a.jsonl", tmp_path / "b.parquet", tmp_path / "c.txt"]
    manifest = run(inputs, tmp_path / "out", tokenizer, dtype="uint32")
    assert manifest.token_dtype == "uint32"
    assert read_documents(tmp_path / "out", tokenizer, "uint32") == [*docs[:10], *docs[10:20], docs[20]]


def test_parallel_workers_write_exactly_what_one_worker_writes(tokenizer: Path, tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "corpus.jsonl", make_documents(400))
    run([source], tmp_path / "one", tokenizer, chunk_bytes=8192, workers=1)
    run([source], tmp_path / "two", tokenizer, chunk_bytes=8192, workers=2)
    assert folder_bytes(tmp_path / "one") == folder_bytes(tmp_path / "two")


def test_a_killed_run_resumes_without_losing_or_repeating_a_document(tokenizer: Path, tmp_path: Path) -> None:
    docs = make_documents(3000)
    source = write_jsonl(tmp_path / "corpus.jsonl", docs)
    run([source], tmp_path / "clean", tokenizer, chunk_bytes=2048)

    out = tmp_path / "killed"
    argv = [sys.executable, "-m", "blackwell_trainer.prepare", str(source), "-o", str(out)]
    argv += ["--tokenizer", str(tokenizer), "--chunk-bytes", "2048", "--workers", "1"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + KILL_TIMEOUT_S
    while len(list((out / STATE_DIR).glob("part-*.json"))) < 5 and time.monotonic() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=KILL_TIMEOUT_S)
    done = len(list((out / STATE_DIR).glob("part-*.json")))
    assert not (out / MANIFEST_NAME).exists(), "the run finished before the kill; the test proves nothing"
    assert (
        5
        <= done
        < len(ShardManifest.model_validate_json((tmp_path / "clean" / MANIFEST_NAME).read_text()).shards)
    )
    # What a kill in the middle of a write leaves: a partial shard under its temporary name.
    (out / "part-00000-00099.bin.tmp-4242").write_bytes(b"\x01\x02\x03")

    assert main([str(source), "-o", str(out), "--tokenizer", str(tokenizer), "--chunk-bytes", "2048"]) == 0
    assert folder_bytes(out) == folder_bytes(tmp_path / "clean")
    assert read_documents(out, tokenizer, "uint16") == docs
    # Running it again on the finished folder changes nothing.
    assert main([str(source), "-o", str(out), "--tokenizer", str(tokenizer), "--chunk-bytes", "2048"]) == 0
    assert folder_bytes(out) == folder_bytes(tmp_path / "clean")


def test_a_resume_with_other_settings_is_refused(tokenizer: Path, tmp_path: Path) -> None:
    source = write_jsonl(tmp_path / "corpus.jsonl", make_documents(20))
    run([source], tmp_path / "out", tokenizer)
    with pytest.raises(
        PrepareError, match=r"holds a preparation with other tokenDtype; resume with the same"
    ):
        run([source], tmp_path / "out", tokenizer, dtype="uint32")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(PrepareError, match=r"is not empty and holds no preparation"):
        run([source], tmp_path / "other", tokenizer)


@pytest.mark.parametrize(
    ("lines", "field", "message"),
    [
        (
            '{"text": "ok"}\n{"text": broken\n',
            "text",
            r"corpus.jsonl: line 2: not JSON .*fix or remove the line",
        ),
        ('{"text": "ok"}\n\n{"body": "x"}\n', "text", r"line 3: no field 'text'; pass --text-field"),
        ('{"text": 5}\n', "text", r"line 1: field 'text' is int, not text"),
    ],
)
def test_bad_jsonl_names_the_line(
    tokenizer: Path, tmp_path: Path, lines: str, field: str, message: str
) -> None:
    (tmp_path / "corpus.jsonl").write_text(lines)
    with pytest.raises(InputError, match=message):
        run([tmp_path / "corpus.jsonl"], tmp_path / "out", tokenizer, text_field=field)
    assert not (tmp_path / "out" / MANIFEST_NAME).exists()


def test_bad_inputs_and_options_are_one_line_errors(
    tokenizer: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pq.write_table(pa.table({"body": ["x"]}), tmp_path / "a.parquet")
    with pytest.raises(InputError, match=r"no column 'text' \(columns: body\); pass --text-field"):
        run([tmp_path / "a.parquet"], tmp_path / "o1", tokenizer)
    (tmp_path / "a.csv").write_text("x")
    with pytest.raises(InputError, match=r"unknown input format .csv"):
        run([tmp_path / "a.csv"], tmp_path / "o2", tokenizer)
    with pytest.raises(PrepareError, match=r"--tokenizer .*: no tokenizer.json there"):
        run([tmp_path / "a.parquet"], tmp_path / "o3", tmp_path)
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "tokenizer.json").write_bytes((tokenizer / "tokenizer.json").read_bytes())
    with pytest.raises(PrepareError, match=r"no EOS token named .* pass --eos-token"):
        run([tmp_path / "a.parquet"], tmp_path / "o4", bare, text_field="body")
    with pytest.raises(PrepareError, match=r"--eos-token '</s>' is not a token"):
        run([tmp_path / "a.parquet"], tmp_path / "o5", bare, text_field="body", eos_token="</s>")
    (bare / "config.json").write_text(json.dumps({"eos_token_id": [1, 0]}))  # several stop ids: the first
    assert run([tmp_path / "a.parquet"], tmp_path / "o6", bare, text_field="body").eos_token_id == 1

    assert (
        main([str(tmp_path / "missing.jsonl"), "-o", str(tmp_path / "o7"), "--tokenizer", str(tokenizer)])
        == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    missing = tmp_path / "missing.jsonl"
    assert err == [f"error: {missing}: no such file or folder; pass existing JSONL, Parquet or text files"]


def test_shards_are_the_trainer_format(tokenizer: Path, tmp_path: Path) -> None:
    # The trainer memory-maps *.bin files as flat arrays of the manifest's dtype: nothing else in them.
    docs = make_documents(10)
    manifest = run([write_jsonl(tmp_path / "c.jsonl", docs)], tmp_path / "out", tokenizer)
    ids = np.concatenate([np.fromfile(tmp_path / "out" / s.name, dtype=np.uint16) for s in manifest.shards])
    assert ids.size == manifest.tokens
    assert int((ids == manifest.eos_token_id).sum()) == manifest.documents
