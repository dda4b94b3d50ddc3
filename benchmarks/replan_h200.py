"""H200 record of the out-of-memory path: an over-sized plan runs out, the re-planner's plan runs.

Usage (on the GPU machine, from the repository root, both packages' src folders on PYTHONPATH):

    python benchmarks/replan_h200.py --out $OUT --steps 4

1. Plans Llama-3.2-3B on one H200 (ml.p5en.48xlarge, 1 GPU, BF16 and AC none pinned, sequence 4096) and
   makes an over-sized plan from it: twice the planner's micro-batch, whose predicted peak is over the
   GPU's memory (the planner itself would refuse it: it is written here, as a mis-sized plan would be).
2. Runs the real trainer (``python -m blackwell_trainer``) on it; it must end on a CUDA OOM, exit 2, with
   the structured result in its termination message (BTJ_TERMINATION_LOG).
3. Re-plans as the operator does (blackwell_operator.planner.correction.learn, then plan_job with the
   correction) and runs the trainer on the new plan for a few steps; it must finish, exit 0.

Writes ``OUT/replan_h200.json`` (command, date, device, versions, both plans, the OOM result, the
correction, the second run's steps) and both trainer logs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import re
import sys
from pathlib import Path
from typing import Any

from blackwell_operator.models.spec import BlackwellTrainingJobSpec
from blackwell_operator.planner import evaluate, plan_job
from blackwell_operator.planner.correction import learn
from blackwell_trainer.plan.config import OomResult, Plan

# Run as a script, benchmarks/ is on the path, not the root that holds it.
_ROOT = Path(__file__).resolve().parents[1]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from benchmarks.trainer_process import run_trainer  # noqa: E402

GIB = 2**30
STEP = re.compile(
    r"step (\d+)/\d+ loss ([0-9.naif]+) .* tokens/s/gpu (\d+) .* "
    r"peak allocated ([0-9.]+) GiB reserved ([0-9.]+) GiB"
)
SPEC = {
    "model": {"preset": "llama3.2-3b"},
    "cluster": {"instanceType": "ml.p5en.48xlarge", "nodes": 1, "gpusPerNode": 1},
    "training": {"sequenceLength": 4096},
    "tuning": {"precision": "bf16", "activationCheckpointing": "none"},
}


def runnable(plan: Plan, steps: int) -> Plan:
    """The plan as the trainer gets it here: a few steps (trainer_process logs every one, on a free port)."""
    return plan.model_copy(update={"steps": steps})


def train(plan: Plan, out: Path, name: str, timeout_s: float) -> dict[str, Any]:
    """One trainer process on `plan`: exit code, seconds, the step lines and the termination message."""
    run = run_trainer(plan, out, name, timeout_s)
    steps = [
        {
            "step": int(m[1]),
            "loss": float(m[2]),
            "tokens_per_second_per_gpu": int(m[3]),
            "peak_allocated_gib": float(m[4]),
            "peak_reserved_gib": float(m[5]),
        }
        for m in map(STEP.search, run.stderr.splitlines())
        if m
    ]
    return {
        "exit_code": run.returncode,
        "seconds": run.seconds,
        "steps": steps,
        "termination_message": run.termination_message,
    }


def versions() -> dict[str, str]:
    import pydantic
    import torch

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": str(torch.version.cuda),
        "pydantic": pydantic.VERSION,
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "device_memory_gib": f"{torch.cuda.get_device_properties(0).total_memory / GIB:.2f}"
        if torch.cuda.is_available()
        else "0",
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--timeout-s", type=float, default=200.0)
    parser.add_argument("--spec", type=Path, help="another spec (JSON), e.g. a tiny one to try it on CPU")
    args = parser.parse_args()
    spec_dict = json.loads(args.spec.read_text()) if args.spec else SPEC
    args.out.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {
        "command": "python benchmarks/replan_h200.py " + " ".join(sys.argv[1:]),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "versions": versions(),
        "spec": spec_dict,
    }
    path = args.out / "replan_h200.json"

    def save() -> None:
        path.write_text(json.dumps(record, indent=2) + "\n")

    spec = BlackwellTrainingJobSpec.model_validate(spec_dict)
    planned = plan_job(spec, job_name="replan-h200")
    big = planned.chosen.model_copy(update={"micro_batch_size": 2 * planned.chosen.micro_batch_size})
    judged = evaluate(spec, big)
    oversized = planned.model_copy(update={"chosen": judged.candidate, "predicted": judged.prediction})
    record["planner_choice"] = summary(planned)
    record["oversized"] = {**summary(oversized), "planner_says_fits": judged.fits}
    save()

    first = train(runnable(oversized, args.steps), args.out, "oversized", args.timeout_s)
    result = OomResult.find(first["termination_message"])
    record["oversized_run"] = {**first, "oom_result": result.model_dump(mode="json") if result else None}
    save()
    if result is None:
        print("the over-sized plan did not end on an OOM result", file=sys.stderr)
        return 1

    correction = learn(None, result, oversized, generation=1)
    replanned = plan_job(spec, job_name="replan-h200", correction=correction)
    record["correction"] = correction.model_dump(mode="json")
    record["replanned"] = {**summary(replanned), "explanation": replanned.explanation[-1]}
    save()

    second = train(runnable(replanned, args.steps), args.out, "replanned", args.timeout_s)
    record["replanned_run"] = second
    ok = first["exit_code"] == 2 and second["exit_code"] == 0 and len(second["steps"]) == args.steps
    record["result"] = "ok" if ok else "failed"
    save()
    print(json.dumps({k: record[k] for k in ("oversized", "correction", "replanned", "result")}, indent=2))
    return 0 if ok else 1


def summary(plan: Plan) -> dict[str, Any]:
    return {
        "candidate": plan.chosen.model_dump(mode="json"),
        "predicted_peak_reserved_gib": round(plan.predicted.memory.peak_reserved / GIB, 2),
        "predicted_tokens_per_second_per_gpu": plan.predicted.tokens_per_second_per_gpu,
    }


if __name__ == "__main__":
    raise SystemExit(main())
