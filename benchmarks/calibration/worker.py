"""One calibration configuration in this process (or in each of torchrun's): the trainer's steps, timed.

    python -m benchmarks.calibration.worker PLAN.json --result-dir DIR --warmup 2 --timed 3
    python -m benchmarks.calibration.worker --wait-in DIR     # pre-started (prewarm.py): imports, then waits

Every rank writes DIR/result.rank<R>.json (status ok/oom/error, step times, losses, peak memory); the exit
code is OOM_EXIT on an out-of-memory error, so that torchrun stops the other ranks.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from blackwell_trainer.plan.config import Plan

OOM_EXIT = 3
# A worker's folder: its output (stdout and stderr), and, for a pre-started one, the configuration it is
# handed.
LOG_FILE = "log.txt"
GO_FILE = "go.json"
# What a configuration imports before it touches the GPU: worker()'s own imports, then what the trainer and
# torch.compile import on first use (optional: a CPU machine may lack them).
PRELOAD = (
    "torch",
    "blackwell_trainer.data.tokens",
    "blackwell_trainer.loop.step_report",
    "blackwell_trainer.loop.trainer",
    "blackwell_trainer.parallel.runtime",
)
OPTIONAL_PRELOAD = ("torchao.float8", "torch._inductor.compile_fx")
POLL_S = 0.05


def _is_oom(err: BaseException) -> bool:
    import torch

    return isinstance(err, torch.cuda.OutOfMemoryError) or "out of memory" in str(err).lower()


def wait_in(folder: Path) -> None:
    """A pre-started worker: import now, then wait for folder/go.json and run that configuration.

    It exits instead of waiting if its imports started CUDA (a context held while another configuration
    is measured would take that one's memory), or when the harness that started it is gone."""
    started, parent = time.perf_counter(), os.getppid()
    for name in PRELOAD:
        importlib.import_module(name)
    for name in OPTIONAL_PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    import torch

    if torch.cuda.is_initialized():
        print("CUDA was started by the imports: not waiting beside a configuration measured", flush=True)
        os._exit(1)
    imported = time.perf_counter() - started
    go = folder / GO_FILE
    while not go.exists():
        if os.getppid() != parent:
            os._exit(0)  # the harness ended without handing it a configuration
        time.sleep(POLL_S)
    ticket = json.loads(go.read_text())
    worker(
        Path(ticket["plan"]),
        Path(ticket["result_dir"]),
        int(ticket["warmup"]),
        int(ticket["timed"]),
        imported_before=imported,
    )


def worker(
    plan_path: Path, result_dir: Path, warmup: int, timed: int, imported_before: float | None = None
) -> None:
    """Run one configuration in this process; every rank writes result.rank<R>.json. `imported_before`: the
    seconds a pre-started worker spent importing before it was handed this configuration."""
    # Where a configuration's wall time goes (the timed steps are a few seconds of 20-90): the next
    # speed-up of the harness starts from these.
    phases: dict[str, float] = {}
    mark = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal mark
        now = time.perf_counter()
        phases[name] = phases.get(name, 0.0) + now - mark
        mark = now

    import torch

    from blackwell_trainer.data.tokens import Batch
    from blackwell_trainer.loop.step_report import allocator_stats
    from blackwell_trainer.loop.trainer import Trainer
    from blackwell_trainer.parallel.runtime import Runtime, init_distributed

    lap("import")
    runtime = Runtime.from_env()
    result: dict[str, Any] = {"status": "error", "detail": "", "phases": phases}
    if imported_before is not None:
        result["imported_before"] = round(imported_before, 1)
    code = 0
    try:
        plan = Plan.from_file(plan_path)
        init_distributed(runtime)
        trainer = Trainer(plan, runtime)
        result["single_device"] = trainer.single_device  # the record says which path it measured
        lap("setup")
        gen = torch.Generator(device=runtime.device).manual_seed(1234 + runtime.rank)
        shape = (plan.chosen.micro_batch_size, plan.sequence_length)
        vocab = plan.architecture.vocab_size
        # One step is every micro-batch of the plan (gradients accumulate across them).
        batches = [
            Batch(
                torch.randint(0, vocab, shape, device=runtime.device, generator=gen),
                torch.randint(0, vocab, shape, device=runtime.device, generator=gen),
            )
            for _ in range(plan.chosen.gradient_accumulation_steps)
        ]
        times, losses = [], []
        for i in range(warmup + timed):
            step = trainer.step(batches)
            losses.append(step.loss)
            if i >= warmup:
                times.append(step.seconds)
            lap("warmup" if i < warmup else "timed")
        result.update(
            status="ok",
            step_times=times,
            losses=losses,
            tokens_per_step=trainer.tokens_per_micro_batch * len(batches),
        )
    except BaseException as err:  # recorded, not raised: the grid goes on
        if _is_oom(err):
            result.update(status="oom", detail=str(err).splitlines()[0][:300])
            code = OOM_EXIT
        else:
            result.update(
                detail=f"{type(err).__name__}: {err}"[:600] + " | " + traceback.format_exc()[-1500:]
            )
            code = 1
    finally:
        if torch.cuda.is_available():
            stats = allocator_stats(runtime.device)
            result["peak_allocated_bytes"] = stats.peak_allocated
            result["peak_reserved_bytes"] = stats.peak_reserved
            # >0 means the allocator hit the GPU's capacity and freed its cache to go on (slow steps).
            result["alloc_retries"] = stats.retries
        (result_dir / f"result.rank{runtime.rank}.json").write_text(json.dumps(result))
        sys.stdout.flush()
        sys.stderr.flush()
        # No destroy_process_group: after an OOM a peer may sit in a collective. A non-zero exit makes
        # torchrun stop the other ranks.
        os._exit(code)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("plan", type=Path, nargs="?")
    parser.add_argument("--result-dir", type=Path)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--timed", type=int, default=3)
    parser.add_argument("--wait-in", type=Path, help="pre-start: import, then wait for DIR/go.json")
    args = parser.parse_args(argv)
    if args.wait_in is not None:
        wait_in(args.wait_in)
    elif args.plan is None or args.result_dir is None:
        parser.error("PLAN and --result-dir are needed (or --wait-in DIR)")
    else:
        worker(args.plan, args.result_dir, args.warmup, args.timed)


if __name__ == "__main__":
    main()
