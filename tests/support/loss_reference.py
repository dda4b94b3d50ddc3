"""The tiny model's first losses on CPU at a fixed seed: the reference the trainer's numerics are held to.

A change made for speed must leave the losses of the same plan and seed where they were (issue 38); one
that changes them on purpose regenerates the file, which review then sees:

    PYTHONPATH=operator/src:trainer_image/src python -m tests.support.loss_reference
"""

from __future__ import annotations

import contextlib
import datetime
import json
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from blackwell_trainer.data.tokens import Batch
from blackwell_trainer.loop.trainer import Trainer
from blackwell_trainer.parallel.runtime import Runtime
from blackwell_trainer.plan.config import Plan
from blackwell_trainer.plan.tuning import Tuning
from tests.support.plans import tiny_plan

REFERENCE = Path(__file__).resolve().parents[1] / "trainer" / "data" / "tiny_losses.json"
STEPS = 8
BATCH_SEED = 11
COMPUTE = {"fp32": torch.float32, "bf16": torch.bfloat16}
ONE = Runtime(rank=0, local_rank=0, world_size=1, local_world_size=1, device=torch.device("cpu"))


def reference_plan() -> Plan:
    """The tiny plan on one process (the single-device path), gradient clipping active."""
    plan = tiny_plan(shardDegree=1)
    plan.gpus_per_node = 1
    plan.optimizer.grad_clip_norm = 0.5  # below the tiny model's early gradient norms: clipping acts
    return plan


def reference_batches() -> list[list[Batch]]:
    """Two random batches, taken in turn: the model learns them, so its losses fall far and fast enough that
    a change in any part of the step (the update, the clip, the schedule, the compute dtype) shows, where
    losses of unlearnable random tokens would all sit near ln(vocabulary)."""
    generator = torch.Generator().manual_seed(BATCH_SEED)
    pool = [torch.randint(0, 256, (4, 33), generator=generator) for _ in range(2)]
    return [[Batch(pool[i % 2][:, :-1], pool[i % 2][:, 1:])] for i in range(STEPS)]


@contextlib.contextmanager
def one_rank_group() -> Iterator[None]:
    """A gloo process group of one in this process, unless one exists (the trainer builds a device mesh)."""
    if dist.is_initialized():
        yield
        return
    # A file store, not TCP: no port to take from the parallel tests beside it.
    with tempfile.TemporaryDirectory(prefix="btj-loss-reference-") as folder:
        dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=0, world_size=1)
        try:
            yield
        finally:
            dist.destroy_process_group()


def losses(compute: str, tuning: Tuning | None = None) -> list[float]:
    """The losses of the reference plan's first steps with this compute dtype and these switches."""
    with one_rank_group():
        trainer = Trainer(reference_plan(), ONE, tuning=tuning or Tuning(), compute_dtype=COMPUTE[compute])
        return [trainer.step(batch).loss for batch in reference_batches()]


def _commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        )
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> int:
    record: dict[str, Any] = {
        "command": "python -m tests.support.loss_reference",
        "date": datetime.date.today().isoformat(),
        "commit": _commit(),
        "torch": torch.__version__,
        "steps": STEPS,
        "losses": {name: losses(name) for name in COMPUTE},
    }
    REFERENCE.parent.mkdir(parents=True, exist_ok=True)
    REFERENCE.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
