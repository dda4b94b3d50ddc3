"""Host time between training steps in the product's own loop (`blackwell_trainer.train`), in one process.

Every step of the trainer ends in one synchronising read (its loss and the non-finite flags), so on a GPU
the device waits while the host does what lies between two steps: the next batch, the step's report and
metrics, the checkpoint schedule, the preemption flag, and the next step's work up to its first forward.
This times that host work around `Trainer.step` and `Trainer._forward_backward` (the tiny model on CPU,
where the step itself is synchronous; the figures between steps are host time alone):

    python benchmarks/host_gap.py --steps 300 --out benchmarks/results/host_gap_cpu.json

Issue 38 asked whether deferring that read by a step would close the gap to torchtitan (which reads every
10 steps): see docs/benchmarks/titan_h100.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SKIP_STEPS = 50  # the first steps warm the allocator and the metrics


class GapTimer:
    """Wraps the two Trainer methods; collects host seconds between steps and before each forward."""

    def __init__(self) -> None:
        self.between: list[float] = []
        self.before_forward: list[float] = []
        self._returned: float | None = None
        self._entered = 0.0

    def install(self) -> Callable[[], None]:
        """Wrap the methods; returns what puts them back."""
        import blackwell_trainer.loop.trainer as loop

        step, forward_backward = loop.Trainer.step, loop.Trainer._forward_backward
        timer = self

        def timed_step(trainer: Any, batches: Any) -> Any:
            timer._entered = time.perf_counter()
            if timer._returned is not None:
                timer.between.append(timer._entered - timer._returned)
            result = step(trainer, batches)
            timer._returned = time.perf_counter()
            return result

        def timed_forward_backward(trainer: Any, batches: Any, index: int, compiling: bool) -> Any:
            timer.before_forward.append(time.perf_counter() - timer._entered)
            return forward_backward(trainer, batches, index, compiling)

        loop.Trainer.step = timed_step  # type: ignore[method-assign]
        loop.Trainer._forward_backward = timed_forward_backward  # type: ignore[method-assign]

        def restore() -> None:
            loop.Trainer.step = step  # type: ignore[method-assign]
            loop.Trainer._forward_backward = forward_backward  # type: ignore[method-assign]

        return restore


def tiny_single_process_plan(steps: int, checkpoint: Path, interval: int) -> dict[str, Any]:
    """The test suite's tiny plan on one process, with a checkpoint schedule."""
    from tests.ports import free_port
    from tests.support.plans import tiny_plan, tiny_plan_dict

    plan = tiny_plan_dict(shardDegree=1)
    plan.update(gpusPerNode=1, globalBatchTokens=4 * 32, steps=steps, metricsPort=free_port())
    plan["parameterCount"] = tiny_plan().architecture.parameter_count()
    plan["checkpoint"] = {"path": str(checkpoint), "intervalSteps": interval, "keepLatest": 2}
    return plan


def summary(seconds: Sequence[float]) -> dict[str, float]:
    """Median, 90th percentile and largest, in milliseconds."""
    ordered = sorted(seconds)
    return {
        "median_ms": round(1e3 * statistics.median(ordered), 3),
        "p90_ms": round(1e3 * ordered[int(0.9 * (len(ordered) - 1))], 3),
        "max_ms": round(1e3 * ordered[-1], 3),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--checkpoint-every", type=int, default=100)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.steps <= SKIP_STEPS + 1:
        parser.error(f"--steps must be over {SKIP_STEPS + 1} (the first {SKIP_STEPS} are left out)")

    from blackwell_trainer.train import main as train

    timer = GapTimer()
    restore = timer.install()
    # The trainer gives a lone process a world of one through MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE in the
    # environment; put it back after, so a process started later (a test's) does not inherit that port.
    environment = dict(os.environ)
    try:
        with tempfile.TemporaryDirectory(prefix="btj-host-gap-") as tmp:
            plan_path = Path(tmp) / "plan.json"
            plan = tiny_single_process_plan(args.steps, Path(tmp) / "checkpoints", args.checkpoint_every)
            plan_path.write_text(json.dumps(plan))
            rc = train(["--plan", str(plan_path)])
    finally:
        restore()
        os.environ.clear()
        os.environ.update(environment)
    if rc != 0:
        print(f"the training exited {rc}", file=sys.stderr)
        return rc
    result = {
        "command": "python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.python_version()}",
        "steps": args.steps,
        "left_out_first": SKIP_STEPS,
        "checkpoint_every": args.checkpoint_every,
        "between_steps": summary(timer.between[SKIP_STEPS:]),
        "step_entry_to_forward": summary(timer.before_forward[SKIP_STEPS:]),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
