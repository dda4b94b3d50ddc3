"""Planning speed: Llama-3.1-70B on 64 ml.p6-b200.48xlarge nodes (512 B200), sequence 8192.

Usage: python benchmarks/plan_speed.py [--repeat N] [--write]
Prints the median wall time of plan_job over N runs (after one warm-up that loads the catalogs) and the
number of candidates the search evaluated; --write stores them in benchmarks/results/plan_speed.json.
The budget is 50 ms on the 2-core CI machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from blackwell_operator.models.spec import BlackwellTrainingJobSpec
from blackwell_operator.planner import plan_job

RESULT = Path(__file__).resolve().parent / "results" / "plan_speed.json"
SPEC = {
    "model": {"preset": "llama3.1-70b"},
    "cluster": {"instanceType": "ml.p6-b200.48xlarge", "nodes": 64},
    "training": {"sequenceLength": 8192},
}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--write", action="store_true", help="store the result in benchmarks/results/")
    args = parser.parse_args()
    spec = BlackwellTrainingJobSpec.model_validate(SPEC)
    plan = plan_job(spec)  # warm-up: loads catalogs and calibration
    times, cpu = [], []
    for _ in range(args.repeat):
        start, start_cpu = time.perf_counter(), time.process_time()
        plan = plan_job(spec)
        times.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    c = plan.chosen
    result = {
        "benchmark": "plan_job Llama-3.1-70B, 64 x ml.p6-b200.48xlarge (512 B200), sequence 8192",
        "median_ms": round(statistics.median(times) * 1000, 2),
        "min_ms": round(min(times) * 1000, 2),
        "max_ms": round(max(times) * 1000, 2),
        "median_cpu_ms": round(statistics.median(cpu) * 1000, 2),
        "load_average_1min": round(os.getloadavg()[0], 2),
        "repeats": args.repeat,
        "candidates_evaluated": plan.candidates_evaluated,
        "chosen": (
            f"{c.precision.value}/{c.precision_recipe.value}, AC {c.activation_checkpointing.value}, "
            f"mbs {c.micro_batch_size}, {c.sharding.value} sharding, cp {c.context_parallel}"
        ),
        "budget_ms": 50,
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{_cpu_model()}, {os.cpu_count()} CPUs ({platform.machine()}), shared with other jobs; "
        f"Python {platform.python_version()}",
        "command": "python benchmarks/plan_speed.py --write",
    }
    print(json.dumps(result, indent=2))
    if args.write:
        RESULT.parent.mkdir(parents=True, exist_ok=True)
        RESULT.write_text(json.dumps(result, indent=2) + "\n")
    sys.exit(0 if result["median_ms"] < result["budget_ms"] else 1)


if __name__ == "__main__":
    main()
