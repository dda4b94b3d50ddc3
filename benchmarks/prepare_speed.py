"""Data preparation speed: JSONL through python -m blackwell_trainer.prepare with 1 and 2 workers.

Usage: python benchmarks/prepare_speed.py [--megabytes N] [--write]
Writes about N MB of JSONL (the test documents, each four times over), trains a byte-level BPE of 2,000
tokens with the tokenizers library, prepares the file with --workers 1 and 2 (4 MiB units), and prints
MB/s and tokens/s of each; --write stores them in benchmarks/results/prepare_speed.json. It measures
this machine: on a shared 2-core one the tokenizer's own threads already take both cores with one worker.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the tests' tokenizer and documents

from tests.support.text_data import make_documents, save_tokenizer  # noqa: E402

from blackwell_trainer.prepare import Options, prepare  # noqa: E402

RESULT = ROOT / "benchmarks" / "results" / "prepare_speed.json"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=float, default=30)
    parser.add_argument("--write", action="store_true", help="store the result in benchmarks/results/")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="prepare-speed-"))
    tokenizer = save_tokenizer(root / "tokenizer", vocab_size=2000)
    corpus = root / "corpus.jsonl"
    docs = make_documents(20000, seed=5)
    with corpus.open("w") as handle:
        while handle.tell() < args.megabytes * 1e6:
            for doc in docs:
                handle.write(json.dumps({"text": doc * 4}) + "\n")
    size = corpus.stat().st_size
    runs = []
    for workers in (1, 2):
        start = time.perf_counter()
        manifest = prepare(
            Options(
                inputs=[str(corpus)],
                output=root / f"out-{workers}",
                tokenizer=tokenizer,
                chunk_bytes=4 << 20,
                workers=workers,
            )
        )
        seconds = time.perf_counter() - start
        runs.append(
            {
                "workers": workers,
                "seconds": round(seconds, 1),
                "megabytes_per_second": round(size / 1e6 / seconds, 2),
                "tokens_per_second": round(manifest.tokens / seconds),
                "documents": manifest.documents,
                "tokens": manifest.tokens,
                "shards": len(manifest.shards),
            }
        )
    result = {
        "benchmark": f"prepare {size / 1e6:.1f} MB of JSONL, byte-level BPE of 2,000 tokens",
        "runs": runs,
        "load_average_1min": round(os.getloadavg()[0], 2),
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{os.cpu_count()} CPUs ({platform.machine()}), shared with other jobs; "
        f"Python {platform.python_version()}",
        "command": "python benchmarks/prepare_speed.py --write",
    }
    print(json.dumps(result, indent=2))
    if args.write:
        RESULT.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":  # the workers are spawned processes that import this file again
    main()
