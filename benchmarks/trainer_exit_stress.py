"""How often a finished trainer run exits cleanly: the fine-tuning e2e case under torchrun, N times.

Usage: python benchmarks/trainer_exit_stress.py [--runs N] [--mode finetune|synthetic] [--label L]
       [--env KEY=VALUE ...] [--cpus LIST] [--stage-exit-race] [--logs DIR] [--write]

Each run is the CPU/gloo case of tests/trainer/test_finetune_e2e.py (a Hugging Face checkpoint's weights
loaded, shards prepared with its tokenizer, 3 steps on 2 processes, the final checkpoint and the export),
or with --mode synthetic the tiny synthetic-data plan with a final checkpoint and an export. It counts
torchrun's exit code and every worker's (torchrun names a failed worker's signal, e.g. -6 for SIGABRT),
and keeps the output of each run that did not exit 0 under --logs. PYTHONFAULTHANDLER is on, so an abort
prints every Python thread's stack. --stage-exit-race makes the rare race certain in every worker (see
STAGED_RACE). --write adds the experiment to benchmarks/results/trainer_exit_stress.json
(one entry per --label). Run it under `nice -n 10` on a shared machine.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the tests' reference model, tokenizer, documents and plans

from tests.support.hf_models import save_hf_model  # noqa: E402
from tests.support.text_data import make_documents, save_tokenizer  # noqa: E402
from tests.trainer.test_finetune_e2e import VOCAB, Prepared, finetune_plan  # noqa: E402
from tests.trainer.test_train_e2e import edit_plan, write_plan  # noqa: E402

from blackwell_trainer.prepare import Options, prepare  # noqa: E402

RESULT = ROOT / "benchmarks" / "results" / "trainer_exit_stress.json"
# torchrun's failure report: one block per failed worker.
FAILED_WORKER = re.compile(r"rank\s*:\s*(\d+) \(local_rank: \d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)")
RUN_TIMEOUT_S = 300
# --stage-exit-race: a sitecustomize for the trainer's processes. When the trainer destroys its process
# group (run()'s finally) it registers an atexit handler that, on every rank, hands the still-living gloo
# group one more all-reduce whose tensor's Python object dies at once, then keeps the GIL while the gloo
# worker completes it and waits for the GIL to free the tensor: what happens rarely by chance (the worker
# late, the main thread on its way out), made certain. An exit through the
# interpreter's finalization then aborts; the trainer's exit (process_exit.py) must not.
STAGED_RACE = """
import atexit, os, sys, time
if "blackwell_trainer" in " ".join(sys.orig_argv):
    import torch.distributed as dist
    _destroy = dist.destroy_process_group
    def _destroy_then_stage(group=None):
        world = dist.group.WORLD
        _destroy(group)
        def last_collective():
            import torch
            sys.setswitchinterval(1000)  # the waiting worker never asks the main thread for the GIL
            world.allreduce([torch.ones(4)])
            end = time.monotonic() + 2.0
            while time.monotonic() < end:
                pass
        atexit.register(last_collective)
    dist.destroy_process_group = _destroy_then_stage
"""


def prepare_inputs(root: Path) -> Prepared:
    """The e2e test's inputs: a tiny Llama checkpoint with its tokenizer, and shards prepared with it."""
    checkpoint = root / "Llama-tiny"
    save_hf_model("llama3.1", checkpoint, vocab_size=VOCAB)
    save_tokenizer(checkpoint)
    docs = make_documents(400)
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    options = Options(inputs=[str(corpus)], output=root / "shards", tokenizer=checkpoint, chunk_bytes=8192)
    return Prepared(checkpoint, root / "shards", prepare(options), docs)


def make_plan(mode: str, folder: Path, prepared: Prepared | None) -> Path:
    if mode == "finetune":
        assert prepared is not None
        return finetune_plan(folder, prepared)
    plan = write_plan(folder, steps=3, checkpoint=folder / "ckpt", interval=1000)
    return edit_plan(plan, lambda p: p.update(output={"uri": str(folder / "export")}))


def launch(plan: Path, env: dict[str, str], cpus: str | None) -> tuple[int, dict[int, int], str, float]:
    """torchrun's exit code, each failed worker's exit code by rank, the output, and the seconds it took.

    `cpus` pins torchrun and its workers to those CPUs (taskset): both ranks on one core make the
    scheduling delays of a loaded node likely without loading the machine further.
    """
    cmd = ["taskset", "-c", cpus] if cpus else []
    cmd += [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    cmd += ["-m", "blackwell_trainer", "--plan", str(plan)]
    started = time.monotonic()
    done = subprocess.run(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=RUN_TIMEOUT_S,
        env={**os.environ, "PYTHONFAULTHANDLER": "1", **env},
    )
    failed = {int(rank): int(code) for rank, code in FAILED_WORKER.findall(done.stdout)}
    return done.returncode, failed, done.stdout, time.monotonic() - started


def trainer_source() -> str:
    """Which trainer the launches run: its folder and that checkout's commit."""
    import blackwell_trainer

    folder = Path(blackwell_trainer.__file__).resolve().parent
    commit = subprocess.run(
        ["git", "-C", str(folder), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "-C", str(folder), "status", "--porcelain", "--", "."], capture_output=True, text=True
    ).stdout.strip()
    return f"{folder} at {commit}{' (modified)' if dirty else ''}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--mode", choices=("finetune", "synthetic"), default="finetune")
    parser.add_argument("--label", default="experiment", help="the experiment's name in the result file")
    parser.add_argument("--env", action="append", default=[], help="KEY=VALUE for the trainer processes")
    parser.add_argument("--cpus", default=None, help="pin each launch to these CPUs (taskset -c), e.g. 0")
    parser.add_argument("--stage-exit-race", action="store_true", help="make the exit race certain")
    parser.add_argument("--logs", type=Path, default=None, help="where to keep the output of failed runs")
    parser.add_argument("--write", action="store_true", help="store the result in benchmarks/results/")
    args = parser.parse_args()
    env = dict(item.split("=", 1) for item in args.env)
    asked = dict(env)  # what the result records (the staging's PYTHONPATH is a temporary folder)
    root = Path(tempfile.mkdtemp(prefix="exit-stress-"))
    if args.stage_exit_race:
        (root / "stage").mkdir()
        (root / "stage" / "sitecustomize.py").write_text(STAGED_RACE)
        env["PYTHONPATH"] = os.pathsep.join([str(root / "stage"), os.environ.get("PYTHONPATH", "")])
    logs = args.logs or root / "failed"
    logs.mkdir(parents=True, exist_ok=True)
    prepared = prepare_inputs(root / "inputs") if args.mode == "finetune" else None
    torchrun_codes: collections.Counter[int] = collections.Counter()
    worker_codes: collections.Counter[str] = collections.Counter()
    seconds = []
    for index in range(args.runs):
        plan = make_plan(args.mode, root / f"run-{index:03d}", prepared)
        rc, failed, output, took = launch(plan, env, args.cpus)
        seconds.append(took)
        torchrun_codes[rc] += 1
        for rank, code in failed.items():
            worker_codes[f"rank {rank}: {code}"] += 1
        if rc != 0:
            (logs / f"run-{index:03d}.log").write_text(output)
        print(
            f"run {index + 1}/{args.runs}: torchrun {rc} failed workers {failed} ({took:.1f} s)", flush=True
        )
    entry: dict[str, Any] = {
        "label": args.label,
        "mode": args.mode,
        "runs": args.runs,
        "clean_exits": torchrun_codes.get(0, 0),
        "torchrun_exit_codes": {str(k): v for k, v in sorted(torchrun_codes.items())},
        "failed_workers": dict(sorted(worker_codes.items())),
        "env": asked,
        "cpus": args.cpus,
        "staged_exit_race": args.stage_exit_race,
        "trainer": trainer_source(),
        "mean_run_seconds": round(sum(seconds) / len(seconds), 1),
        "command": " ".join(["nice -n 10 python benchmarks/trainer_exit_stress.py", *sys.argv[1:]]),
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": f"{platform.node()} {os.cpu_count()} CPUs, {platform.python_version()}",
    }
    print(json.dumps(entry, indent=1))
    if args.write:
        results = json.loads(RESULT.read_text()) if RESULT.exists() else {"experiments": []}
        results["experiments"] = [e for e in results["experiments"] if e["label"] != args.label] + [entry]
        RESULT.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
