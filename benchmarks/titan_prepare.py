"""Prepare, on a machine with PyPI, what benchmarks/titan_h200.py needs on the offline H200 machine.

    python benchmarks/titan_prepare.py            # wheels into .whl/, tokenizer and text into .titan/

Both folders are git-ignored and travel with the device call as `carry`. The wheels are the ones the GPU
image lacks (its package list: torch 2.11, triton, tokenizers, tensorboard, einops, pillow, fsspec,
huggingface-hub, pyarrow, pandas and xxhash are there; torchtitan's other needs, torchao and this trainer's
pydantic are not), pinned, for CPython 3.12 on x86-64 Linux. torchtitan's wheel holds no tokenizer and
no data set (its tests/assets stay in its repository), so a small byte-level BPE tokenizer is trained here
from this repository's own text, and the same text is written as a local JSON-lines data set that
torchtitan's `c4_test` loader reads from `--training.dataset_path`. The model's vocabulary stays 128,256
in both trainers whatever the tokenizer's size: torchtitan 0.2.2's llama3 takes `vocab_size` from the
flavor and never from the tokenizer.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# What the H200 image lacks, pinned. torchtitan 0.2.2 is the newest release that runs on torch 2.11;
# torchao 0.17.0 is built against torch 2.11 (FP8 for both trainers). datasets 4.8.5 accepts the image's
# huggingface-hub 1.x (5.x asks for pyarrow >= 24, which the image's list does not promise). tomli is
# listed by torchtitan but unused on Python 3.12 (tomllib first); it is 16 KB, so it comes along.
WHEELS = [
    "torchtitan==0.2.2",
    "torchao==0.17.0",
    "torchdata==0.11.0",
    "datasets==4.8.5",
    "dill==0.4.1",
    "multiprocess==0.70.19",
    "tyro==1.0.17",
    "docstring-parser==0.17.0",
    "typeguard==4.4.4",
    "tomli==2.3.0",
    # This trainer's plan models (pyproject: pydantic>=2.7,<3), the versions CI runs.
    "pydantic==2.14.4",
    "pydantic-core==2.50.5",
    "annotated-types==0.8.0",
    "typing-inspection==0.4.5",
    "typing-extensions==4.16.0",
]
PLATFORMS = [
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
]
CARRY_LIMIT_BYTES = 48 * 1024 * 1024  # the device call carries at most 64 MiB with the working tree
TOKENIZER_VOCAB = 4096
BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
TEXT_SUFFIXES = (".md", ".py", ".yaml", ".toml")
TEXT_CHARS = 3_000_000  # about a million tokens: the loader re-loops it, 9 steps of batch 9 need 330 K


def download_wheels(dest: Path) -> list[Path]:
    """`pip download` every pinned wheel for CPython 3.12, x86-64 Linux, without dependencies."""
    dest.mkdir(parents=True, exist_ok=True)
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    # The project's environment (bootstrap.sh makes it with uv) has no pip: borrow the first one at hand.
    has_pip = importlib.util.find_spec("pip") is not None
    pip = [sys.executable, "-m", "pip"] if has_pip else [shutil.which("pip3") or "pip"]
    cmd = [
        *pip,
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        "3.12",
        "--implementation",
        "cp",
        *platforms,
        "-d",
        str(dest),
        *WHEELS,
    ]
    subprocess.run(cmd, check=True)
    wanted = {w.split("==")[0].replace("-", "_").lower() for w in WHEELS}
    wheels = sorted(dest.glob("*.whl"))
    names = [w.name.split("-")[0].lower() for w in wheels]
    for wheel, name in zip(wheels, names, strict=True):
        if name not in wanted:
            print(f"note: {wheel.name} is not one of this benchmark's wheels; it travels too")
    # The device installs .whl/*.whl in one pip call, which refuses two versions of one package.
    doubled = sorted({n for n in names if names.count(n) > 1})
    if doubled:
        raise SystemExit(f"more than one version of {doubled} in {dest}: keep one of each (pinned: {WHEELS})")
    return [w for w, n in zip(wheels, names, strict=True) if n in wanted]


def repository_text(limit: int = TEXT_CHARS) -> list[str]:
    """This repository's tracked text files, in `git ls-files` order, up to `limit` characters."""
    listing = subprocess.run(["git", "-C", str(REPO), "ls-files"], capture_output=True, text=True, check=True)
    texts, total = [], 0
    for name in listing.stdout.splitlines():
        if not name.endswith(TEXT_SUFFIXES):
            continue
        try:
            text = (REPO / name).read_text()
        except (UnicodeDecodeError, FileNotFoundError):
            continue
        texts.append(text)
        total += len(text)
        if total >= limit:
            break
    return texts


def make_assets(dest: Path, texts: list[str]) -> tuple[Path, Path]:
    """A byte-level BPE `tokenizer.json` (+ its bos/eos config) and a JSON-lines data set of `texts`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok_dir, data_dir = dest / "tokenizer", dest / "data"
    tok_dir.mkdir(parents=True, exist_ok=True)
    data_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB,
        special_tokens=[BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    tokenizer.save(str(tok_dir / "tokenizer.json"))
    # torchtitan's HuggingFaceTokenizer finds BOS/EOS by name in tokenizer_config.json.
    (tok_dir / "tokenizer_config.json").write_text(json.dumps({"bos_token": BOS, "eos_token": EOS}) + "\n")
    with open(data_dir / "data.json", "w") as f:
        for text in texts:
            f.write(json.dumps({"text": text}) + "\n")
    return tok_dir, data_dir


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--wheels", type=Path, default=REPO / ".whl")
    parser.add_argument("--assets", type=Path, default=REPO / ".titan")
    parser.add_argument("--no-wheels", action="store_true", help="make the tokenizer and data set only")
    args = parser.parse_args()
    if not args.no_wheels:
        for wheel in download_wheels(args.wheels):
            print(f"{wheel.stat().st_size / 1e6:7.2f} MB  {wheel.name}")
    tok_dir, data_dir = make_assets(args.assets, repository_text())
    print(f"tokenizer {tok_dir} ({folder_bytes(tok_dir) / 1e6:.2f} MB), data {data_dir} "
          f"({folder_bytes(data_dir) / 1e6:.2f} MB)")  # fmt: skip
    total = folder_bytes(args.assets) + (folder_bytes(args.wheels) if args.wheels.exists() else 0)
    print(f"carried in all: {total / 1e6:.1f} MB")
    if total > CARRY_LIMIT_BYTES:
        raise SystemExit(f"{total / 1e6:.1f} MB is too close to the device call's 64 MiB: carry less")


if __name__ == "__main__":
    main()
