"""`python -m blackwell_trainer.prepare`: tokenize JSONL, Parquet or text into the trainer's token shards.

Each work unit of the inputs (text_inputs.py) becomes one shard file: its documents, tokenized with the
model's own tokenizer.json, each followed by the EOS token, as a flat array of uint16/uint32 token ids.
With `--chat`, each JSONL record is a conversation rendered with the checkpoint's own chat template
(chat_template.py), and a mask file beside each shard marks the assistant's tokens, the only ones trained on
(data/chat.py); a `.docs` file holds where each conversation starts, for packing without crossing them.
Units run in parallel processes; a unit's shard is written under a temporary name and renamed, then its
record is written, so a killed run redoes only the units without a record: no document is lost or
written twice. When every unit is done, manifest.json lists the shards, and the trainer checks it.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import logging
import os
import shutil
import sys
import zlib
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np

from blackwell_trainer.data.chat import ChatFormat, assistant_mask, conversation, detect_format
from blackwell_trainer.data.chat_template import ChatTemplate, ChatTemplateError, load_chat_template
from blackwell_trainer.data.text_inputs import (
    InputError,
    InputFormat,
    Unit,
    documents,
    expand_inputs,
    input_format,
    json_records,
    line_number,
    plan_units,
)
from blackwell_trainer.plan.shard_manifest import (
    DOCS_SUFFIX,
    ITEMSIZE,
    MANIFEST_NAME,
    MASK_SUFFIX,
    ShardEntry,
    ShardManifest,
    companion,
    tokenizer_sha256,
)
from blackwell_trainer.plan.units import MIB

log = logging.getLogger("blackwell_trainer.prepare")

STATE_DIR = ".prepare"  # per-unit records of a run in progress; removed once manifest.json is written
SETTINGS_NAME = "settings.json"
DEFAULT_CHUNK_BYTES = 256 * MIB  # ~64M tokens of English per shard: few files, little tail lost per shard
ENCODE_BATCH = 512  # documents per encode_batch call
UINT16_LIMIT = 1 << 16


class PrepareError(ValueError):
    """A preparation that cannot start or continue; the message names the option or input and the fix."""


@dataclass(frozen=True)
class TokenizerInfo:
    """The tokenizer file, its hash and the ids the shards depend on."""

    path: Path
    sha256: str
    vocab_size: int
    eos_token_id: int


def _tokenizer_file(path: Path) -> Path:
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise PrepareError(
            f"--tokenizer {path}: no tokenizer.json there; pass the model's checkpoint folder or its "
            "tokenizer.json"
        )
    return file


def _eos_from_configs(folder: Path) -> tuple[str | None, int | None]:
    """The EOS token as tokenizer_config.json names it, and the id config.json gives, where present."""
    token: str | None = None
    token_id: int | None = None
    config = folder / "tokenizer_config.json"
    if config.is_file():
        raw = json.loads(config.read_text()).get("eos_token")
        token = raw.get("content") if isinstance(raw, dict) else raw
    for name in ("generation_config.json", "config.json"):
        model_config = folder / name
        if token_id is None and model_config.is_file():
            raw_id = json.loads(model_config.read_text()).get("eos_token_id")
            # Llama 3.1 Instruct lists several stop ids; the first is the end of text.
            token_id = raw_id[0] if isinstance(raw_id, list) and raw_id else raw_id
    return token, token_id if isinstance(token_id, int) else None


def load_tokenizer_info(path: Path, eos_token: str | None) -> TokenizerInfo:
    """Find tokenizer.json and the EOS id: --eos-token, else tokenizer_config.json, else config.json."""
    from tokenizers import Tokenizer

    file = _tokenizer_file(path)
    try:
        tokenizer = Tokenizer.from_file(str(file))
    except Exception as err:  # the Rust library raises a bare Exception for a malformed file
        raise PrepareError(f"--tokenizer {file}: not a tokenizers file ({err})") from err
    named, config_id = _eos_from_configs(file.parent)
    name = eos_token or named
    if name is not None:
        eos_id = tokenizer.token_to_id(name)
        if eos_id is None:
            raise PrepareError(f"--eos-token {name!r} is not a token of {file}; pass the model's EOS token")
    elif config_id is not None:
        eos_id = config_id
    else:
        raise PrepareError(
            f"--tokenizer {path}: no EOS token named (no tokenizer_config.json eos_token, no config.json "
            "eos_token_id); pass --eos-token, e.g. --eos-token '<|end_of_text|>'"
        )
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    if not 0 <= eos_id < vocab:
        raise PrepareError(f"EOS id {eos_id} is outside the tokenizer's vocabulary of {vocab}")
    return TokenizerInfo(file, tokenizer_sha256(file), vocab, eos_id)


def choose_dtype(requested: str, vocab_size: int) -> str:
    """uint16 when every id fits in it (half the disk), else uint32; a pinned dtype must hold the vocab."""
    dtype = requested if requested != "auto" else ("uint16" if vocab_size <= UINT16_LIMIT else "uint32")
    if dtype == "uint16" and vocab_size > UINT16_LIMIT:
        raise PrepareError(f"--dtype uint16 cannot hold a vocabulary of {vocab_size}; use uint32 or auto")
    return dtype


# --- one work unit, in a worker process -------------------------------------------------------------------

_WORKER: dict[str, Any] = {}


def _init_worker(tokenizer_file: str, quiet_threads: bool) -> None:
    if quiet_threads:
        # Each process is one worker: the tokenizer's own thread pool would oversubscribe the cores.
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    from tokenizers import Tokenizer

    _WORKER["tokenizer"] = Tokenizer.from_file(tokenizer_file)


def _batches(texts: Iterator[str | None], size: int) -> Iterator[tuple[list[str], int]]:
    """Lists of up to `size` documents, and how many empty inputs were skipped before each."""
    batch: list[str] = []
    skipped = 0
    for text in texts:
        if text is None:
            skipped += 1
            continue
        batch.append(text)
        if len(batch) == size:
            yield batch, skipped
            batch, skipped = [], 0
    if batch or skipped:
        yield batch, skipped


def _run_unit(job: dict[str, Any]) -> dict[str, Any]:
    """Tokenize one unit into its shard (atomically) and return the unit's record."""
    if job.get("chat"):
        return _run_chat_unit(job)
    unit = Unit(**job["unit"])
    out = Path(job["out"])
    name: str = job["name"]
    dtype = np.dtype(job["dtype"])
    eos = int(job["eos"])
    tokenizer = _WORKER["tokenizer"]
    # The fast variant skips the character offsets, which shards do not keep (tokenizers >= 0.20.2).
    encode = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)
    docs = tokens = skipped = top = 0
    partial = out / f"{name}.tmp-{os.getpid()}"
    with partial.open("wb") as handle:
        for batch, empty in _batches(documents(unit, text_field=job["text_field"]), ENCODE_BATCH):
            skipped += empty
            if not batch:
                continue
            encoded = encode(batch, add_special_tokens=job["add_special_tokens"])
            end = np.array([eos], dtype=np.int64)
            flat = np.concatenate(
                [part for e in encoded for part in (np.asarray(e.ids, dtype=np.int64), end)]
            )
            top = max(top, int(flat.max()))
            handle.write(flat.astype(dtype).tobytes())
            docs += len(batch)
            tokens += int(flat.size)
        handle.flush()
        os.fsync(handle.fileno())
    if docs:
        os.replace(partial, out / name)  # the shard appears whole or not at all
    else:
        partial.unlink()
    record = {
        "name": name,
        "tokens": tokens,
        "documents": docs,
        "skipped": skipped,
        "maxTokenId": top,
        "source": unit.describe(),
    }
    state = out / STATE_DIR
    _write_atomic(state / f"{name}.json", json.dumps(record))  # after the shard: the unit is done
    return record


def _run_chat_unit(job: dict[str, Any]) -> dict[str, Any]:
    """Render, tokenize and mask one unit's conversations: its shard, mask and document starts."""
    unit = Unit(**job["unit"])
    out, name, dtype = Path(job["out"]), str(job["name"]), np.dtype(job["dtype"])
    template = ChatTemplate(**job["chat"]["template"])
    wanted = job["chat"]["format"]
    tokenizer = _WORKER["tokenizer"]
    ids_parts: list[np.ndarray[Any, Any]] = []
    mask_parts: list[np.ndarray[Any, Any]] = []
    for index, record in json_records(unit):
        try:
            fmt = detect_format(record) if wanted == "auto" else ChatFormat(wanted)
            ids, mask = assistant_mask(tokenizer, template.locate(conversation(record, fmt)))
        except ChatTemplateError as err:
            # Never train on every token instead: the whole run stops, naming the line and the reason.
            raise InputError(f"{unit.path}: line {line_number(unit, index)}: {err}") from None
        ids_parts.append(ids)
        mask_parts.append(mask)
    docs = len(ids_parts)
    tokens = sum(int(p.size) for p in ids_parts)
    trained = sum(int(m.sum()) for m in mask_parts)
    if docs:
        starts = np.cumsum([0, *(int(p.size) for p in ids_parts[:-1])], dtype=np.uint64)
        flat = np.concatenate(ids_parts)
        # The mask and the starts first: the token shard's rename is what makes the unit's output count.
        mask = np.concatenate(mask_parts)
        _write_array(out / companion(name, MASK_SUFFIX), mask)
        mask_crc32 = f"{zlib.crc32(mask.tobytes()):08x}"  # the trainer checks the file against it
        _write_array(out / companion(name, DOCS_SUFFIX), starts)
        _write_array(out / name, flat.astype(dtype))
    top = int(max((int(p.max()) for p in ids_parts if p.size), default=0))
    record = {
        "name": name,
        "tokens": tokens,
        "documents": docs,
        "skipped": 0,
        "maxTokenId": top,
        "trainedTokens": trained,
        **({"maskCrc32": mask_crc32} if docs else {}),
        "source": unit.describe(),
    }
    _write_atomic(out / STATE_DIR / f"{name}.json", json.dumps(record))
    return record


def _write_array(path: Path, values: np.ndarray[Any, Any]) -> None:
    partial = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    with partial.open("wb") as handle:
        handle.write(values.tobytes())
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(partial, path)


def _write_atomic(path: Path, text: str) -> None:
    partial = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    partial.write_text(text)
    os.replace(partial, path)


# --- the whole run ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    """What one preparation run reads and how it writes."""

    inputs: list[str]
    output: Path
    tokenizer: Path
    text_field: str = "text"
    text_lines: bool = False
    dtype: str = "auto"
    eos_token: str | None = None
    add_special_tokens: bool = True
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    workers: int = 1
    chat: str | None = None  # None: plain text; "auto", "messages" or "sharegpt": conversations
    chat_template_name: str = "default"


def _settings(
    options: Options, files: list[Path], info: TokenizerInfo, dtype: str, template: ChatTemplate | None
) -> dict[str, str]:
    """Everything the shards depend on: a resume with other settings would mix two data sets."""
    listing = [f"{p}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in files]
    chat = {} if template is None else {"chat": str(options.chat), "chatTemplateSha256": template.sha256}
    return {
        **chat,
        "inputs": hashlib.sha256("\n".join(listing).encode()).hexdigest(),
        "inputFiles": str(len(files)),
        "tokenizerSha256": info.sha256,
        "eosTokenId": str(info.eos_token_id),
        "tokenDtype": dtype,
        "textField": options.text_field,
        "textLines": str(options.text_lines),
        "addSpecialTokens": str(options.add_special_tokens),
        "chunkBytes": str(options.chunk_bytes),
    }


def _refuse_other_settings(found: dict[str, str], wanted: dict[str, str], output: Path) -> None:
    changed = sorted(k for k in wanted if found.get(k) != wanted[k])
    if changed:
        raise PrepareError(
            f"--output {output} holds a preparation with other {', '.join(changed)}; resume with the same "
            "inputs and options, or prepare into a new --output folder"
        )


def _start_state(options: Options, settings: dict[str, str]) -> Path | None:
    """The state folder of a new or resumed run; None when the output is already complete."""
    out, state = options.output, options.output / STATE_DIR
    manifest_path = out / MANIFEST_NAME
    if manifest_path.is_file():
        done = ShardManifest.model_validate_json(manifest_path.read_text())
        _refuse_other_settings(done.settings, settings, out)
        shutil.rmtree(state, ignore_errors=True)  # a run killed after writing its manifest
        return None
    if (state / SETTINGS_NAME).is_file():
        _refuse_other_settings(json.loads((state / SETTINGS_NAME).read_text()), settings, out)
    elif out.is_dir() and any(p.name != STATE_DIR for p in out.iterdir()):  # a kill before settings.json
        raise PrepareError(f"--output {out} is not empty and holds no preparation; use a new or empty folder")
    state.mkdir(parents=True, exist_ok=True)
    _write_atomic(state / SETTINGS_NAME, json.dumps(settings))
    for leftover in out.glob("*.tmp-*"):
        leftover.unlink()  # a shard a killed worker was writing
    return state


def _done_records(state: Path, out: Path, itemsize: int) -> dict[str, dict[str, Any]]:
    """Records of finished units whose shard is whole (a record is written after its shard)."""
    records: dict[str, dict[str, Any]] = {}
    for path in state.glob("part-*.json"):
        record = json.loads(path.read_text())
        shard = out / str(record["name"])
        if record["documents"] == 0 or (
            shard.is_file() and shard.stat().st_size == record["tokens"] * itemsize
        ):
            records[str(record["name"])] = record
    return records


def prepare(options: Options) -> ShardManifest:
    """Tokenize the inputs into shards and write manifest.json; continue a killed run where it stopped."""
    if options.workers < 1:
        raise PrepareError(f"--workers {options.workers}: use 1 or more")
    if options.chunk_bytes < 1:
        raise PrepareError(f"--chunk-bytes {options.chunk_bytes}: use 1 or more")
    info = load_tokenizer_info(options.tokenizer, options.eos_token)
    dtype = choose_dtype(options.dtype, info.vocab_size)
    files = expand_inputs(options.inputs)
    template = _chat_template(options, info, files)
    units: dict[str, Unit] = {}
    for index, path in enumerate(files):
        fmt = input_format(path, options.text_lines)
        for part, unit in enumerate(
            plan_units(path, fmt, text_field=options.text_field, chunk_bytes=options.chunk_bytes)
        ):
            units[f"part-{index:05d}-{part:05d}.bin"] = unit
    settings = _settings(options, files, info, dtype, template)
    options.output.mkdir(parents=True, exist_ok=True)
    state = _start_state(options, settings)
    if state is None:
        log.info("%s is already complete", options.output / MANIFEST_NAME)
        return ShardManifest.model_validate_json((options.output / MANIFEST_NAME).read_text())
    records = _done_records(state, options.output, ITEMSIZE[dtype])
    todo = [name for name in units if name not in records]
    log.info(
        "%d units, %d done before, %d to do, %d worker(s)",
        len(units),
        len(records),
        len(todo),
        options.workers,
    )
    jobs = [
        {
            "unit": vars(units[name]),
            "name": name,
            "out": str(options.output),
            "dtype": dtype,
            "eos": info.eos_token_id,
            "text_field": options.text_field,
            "add_special_tokens": options.add_special_tokens,
            "chat": None
            if template is None
            else {"format": options.chat, "template": dataclasses.asdict(template)},
        }
        for name in todo
    ]
    for record in _run_all(jobs, info, options.workers):
        records[str(record["name"])] = record
        log.info("%s: %d documents, %d tokens", record["name"], record["documents"], record["tokens"])
    manifest = _manifest(records, info, dtype, options, settings, template)
    _write_atomic(options.output / MANIFEST_NAME, manifest.model_dump_json(by_alias=True, indent=2))
    shutil.rmtree(state, ignore_errors=True)
    return manifest


def _chat_template(options: Options, info: TokenizerInfo, files: list[Path]) -> ChatTemplate | None:
    """The checkpoint's chat template for a --chat run (which reads JSONL only); None for plain text."""
    if options.chat is None:
        return None
    if options.chat not in ("auto", *ChatFormat):
        raise PrepareError(f"--chat {options.chat}: use auto, messages or sharegpt")
    not_jsonl = [p for p in files if input_format(p, text_lines=False) is not InputFormat.JSONL]
    if not_jsonl:
        raise PrepareError(f"--chat reads JSONL conversations; {not_jsonl[0]} is not .jsonl/.ndjson")
    try:
        return load_chat_template(info.path.parent, options.chat_template_name)
    except ChatTemplateError as err:
        raise PrepareError(f"--tokenizer {options.tokenizer}: {err}") from None


def _run_all(jobs: list[dict[str, Any]], info: TokenizerInfo, workers: int) -> Iterator[dict[str, Any]]:
    if workers == 1 or len(jobs) <= 1:
        _init_worker(str(info.path), quiet_threads=False)
        for job in jobs:
            yield _run_unit(job)
        return
    # spawn: a forked child of a process whose tokenizer already ran threads can deadlock.
    with ProcessPoolExecutor(
        max_workers=workers,
        mp_context=get_context("spawn"),
        initializer=_init_worker,
        initargs=(str(info.path), True),
    ) as pool:
        yield from pool.map(_run_unit, jobs)


def _manifest(
    records: dict[str, dict[str, Any]],
    info: TokenizerInfo,
    dtype: str,
    options: Options,
    settings: dict[str, str],
    template: ChatTemplate | None,
) -> ShardManifest:
    kept = [records[name] for name in sorted(records) if records[name]["documents"] > 0]
    tokens = sum(int(r["tokens"]) for r in kept)
    trained = sum(int(r.get("trainedTokens", 0)) for r in kept)
    chat: dict[str, Any] = (
        {}
        if template is None
        else {
            "kind": "chat",
            "trained_tokens": trained,
            "loss_mask_coverage": round(trained / tokens, 6) if tokens else 0.0,
            "chat_template_sha256": template.sha256,
        }
    )
    return ShardManifest(
        **chat,
        token_dtype=dtype,
        vocab_size=info.vocab_size,
        max_token_id=max((int(r["maxTokenId"]) for r in kept), default=0),
        eos_token_id=info.eos_token_id,
        add_special_tokens=options.add_special_tokens,
        tokenizer_sha256=info.sha256,
        documents=sum(int(r["documents"]) for r in kept),
        tokens=tokens,
        skipped=sum(int(r["skipped"]) for r in records.values()),
        shards=[
            ShardEntry(
                name=r["name"],
                tokens=r["tokens"],
                documents=r["documents"],
                trained_tokens=r.get("trainedTokens"),
                mask_crc32=r.get("maskCrc32"),  # none in a unit an older prepare recorded before a resume
                source=r["source"],
            )
            for r in kept
        ],
        settings=settings,
    )


def parse_args(argv: Sequence[str] | None) -> Options:
    """The command line as Options."""
    parser = argparse.ArgumentParser(
        prog="python -m blackwell_trainer.prepare", description=__doc__.splitlines()[0]
    )
    parser.add_argument("inputs", nargs="+", help="JSONL (.jsonl/.ndjson), Parquet or .txt files, or folders")
    parser.add_argument(
        "--output", "-o", required=True, type=Path, help="folder for the shards and manifest.json"
    )
    parser.add_argument(
        "--tokenizer", required=True, type=Path, help="the model's checkpoint folder or its tokenizer.json"
    )
    parser.add_argument("--text-field", default="text", help="JSONL field / Parquet column of the text")
    parser.add_argument(
        "--text-lines",
        action="store_true",
        help="each non-empty line of a .txt file is a document (default: the file)",
    )
    parser.add_argument("--dtype", default="auto", choices=["auto", "uint16", "uint32"], help="token id type")
    parser.add_argument(
        "--eos-token", default=None, help="the token that ends each document (default: the model's)"
    )
    parser.add_argument(
        "--no-special-tokens",
        action="store_true",
        help="do not add the tokenizer's own special tokens (e.g. Llama 3's <|begin_of_text|>)",
    )
    parser.add_argument(
        "--chat",
        nargs="?",
        const="auto",
        default=None,
        choices=["auto", *ChatFormat],
        help="JSONL conversations (messages: role/content, sharegpt: from/value; auto: either), rendered "
        "with the checkpoint's chat template; only the assistant's tokens are trained on",
    )
    parser.add_argument(
        "--chat-template-name", default="default", help="which of several named chat templates to use"
    )
    parser.add_argument("--chunk-bytes", type=int, default=DEFAULT_CHUNK_BYTES, help="input bytes per shard")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="parallel processes")
    args = parser.parse_args(list(argv) if argv is not None else None)
    return Options(
        inputs=list(args.inputs),
        output=args.output,
        tokenizer=args.tokenizer,
        text_field=args.text_field,
        text_lines=args.text_lines,
        dtype=args.dtype,
        eos_token=args.eos_token,
        add_special_tokens=not args.no_special_tokens,
        chunk_bytes=args.chunk_bytes,
        workers=args.workers,
        chat=args.chat,
        chat_template_name=args.chat_template_name,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """CLI entry: 0 when manifest.json is written, 2 with one line for bad input."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    options = parse_args(argv)
    try:
        manifest = prepare(options)
    except (PrepareError, InputError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if manifest.kind == "chat":
        print(
            f"{options.output}: {len(manifest.shards)} shards, {manifest.documents:,} conversations, "
            f"{manifest.tokens:,} tokens, {manifest.trained_tokens:,} trained on (the assistant's: "
            f"{manifest.loss_mask_coverage:.1%}); chat template sha256 {manifest.chat_template_sha256}"
        )
        return 0
    print(
        f"{options.output}: {len(manifest.shards)} shards, {manifest.documents:,} documents, "
        f"{manifest.tokens:,} tokens ({manifest.skipped} empty inputs skipped). Train on it with "
        f"spec.training.dataset: {{kind: shards, uri: <this folder, or its copy on S3/FSx>, "
        f"tokenDtype: {manifest.token_dtype}}}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
