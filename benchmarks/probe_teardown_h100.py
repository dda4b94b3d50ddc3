"""H100 record of issue 37's probe teardown: after the probe, does training hold the winner's memory alone?

Two steps, so that the GPU machine needs only the trainer (torch 2.11 there, no operator dependencies):

    python benchmarks/probe_teardown_h100.py plan --out benchmarks/results/probe_teardown_h100.plan.json
    python benchmarks/probe_teardown_h100.py run --plan benchmarks/results/probe_teardown_h100.plan.json \
        --out $OUT --budget-s 420                                   # on the GPU machine

`plan` plans the issue's scenario (Llama-3.2-3B, sequence 4096, 24 sequences a step, one H100 of an
ml.p5.48xlarge, the shipped profile, `probe: always`) as the operator would. `run` trains it with the probe
for a few steps, reads the probe's winner from the termination message, then trains that winner alone
(probe off) for the same steps, and records, for both, each step's peak reserved memory (the trainer's own
step line) and tokens/s; the difference is what the probe left behind. Writes OUT/probe_teardown_h100.json
after every run, so a timeout keeps what finished.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.trainer_process import step_figures  # noqa: E402  (after the path fix above)

SCENARIO: dict[str, Any] = {"preset": "llama3.2-3b", "seq": 4096, "sequences": 24}


def make_plan(out: Path) -> None:
    """The scenario planned with the operator's planner (run where the operator's dependencies are)."""
    from blackwell_operator.models.spec import BlackwellTrainingJobSpec
    from blackwell_operator.planner import plan_job

    spec = BlackwellTrainingJobSpec.model_validate(
        {
            "model": {"preset": SCENARIO["preset"]},
            "cluster": {"instanceType": "ml.p5.48xlarge", "nodes": 1, "gpusPerNode": 1},
            "training": {
                "sequenceLength": SCENARIO["seq"],
                "globalBatchTokens": SCENARIO["seq"] * SCENARIO["sequences"],
                "steps": 6,
            },
            "tuning": {"probe": {"policy": "always", "candidates": 3, "budgetSeconds": 240}},
        }
    )
    # Every step's line, so that each step's peak reserved memory is read.
    plan = plan_job(spec, job_name="probe-teardown").model_copy(update={"log_every_steps": 1})
    out.write_text(plan.model_dump_json(by_alias=True, indent=1))
    options = len(plan.probe.options) if plan.probe is not None else 0
    print(f"planned {plan.chosen.model_dump(by_alias=True)}; probe options {options}")


def run(plan_path: Path, out: Path, budget_s: float) -> None:
    import torch

    from benchmarks.trainer_process import run_trainer
    from blackwell_trainer.plan.config import Plan, ProbeResult

    started = time.monotonic()
    plan = Plan.model_validate_json(plan_path.read_text())
    record: dict[str, Any] = {
        "command": " ".join(sys.argv),
        "date": datetime.date.today().isoformat(),
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "scenario": SCENARIO,
        "runs": {},
    }
    path = out / "probe_teardown_h100.json"

    def save() -> None:
        path.write_text(json.dumps(record, indent=1))

    probed = run_trainer(plan, out, "probed", budget_s * 0.6)
    text = probed.stdout + probed.stderr
    result = ProbeResult.find(probed.termination_message)
    record["runs"]["probed"] = {
        "rc": probed.returncode,
        "seconds": probed.seconds,
        "steps": step_figures(text),
    }
    record["probe"] = None if result is None else result.model_dump(mode="json", by_alias=True)
    (out / "probed.log").write_text(text[-200_000:])
    save()
    if result is None or result.winner is None or plan.probe is None:
        print("no probe result: nothing to compare", file=sys.stderr)
        return
    option = plan.probe.options[result.winner]
    record["winner"] = option.candidate.model_dump(by_alias=True)
    record["winner_predicted_peak_reserved_gib"] = option.prediction.memory.peak_reserved / 2**30
    alone_plan = plan.model_copy(
        update={"chosen": option.candidate, "predicted": option.prediction, "probe": None}
    )
    left = budget_s - (time.monotonic() - started)
    alone = run_trainer(alone_plan, out, "alone", max(left - 10, 30))
    record["runs"]["alone"] = {
        "rc": alone.returncode,
        "seconds": alone.seconds,
        "steps": step_figures(alone.stdout + alone.stderr),
    }
    (out / "alone.log").write_text((alone.stdout + alone.stderr)[-200_000:])
    peaks = {k: max((s["reserved_gib"] for s in v["steps"]), default=None) for k, v in record["runs"].items()}
    rates = {
        k: statistics.median([s["tokens_per_second_per_gpu"] for s in v["steps"][2:]])
        if len(v["steps"]) > 2
        else None
        for k, v in record["runs"].items()
    }
    record["training_peak_reserved_gib"] = peaks
    record["training_tokens_per_second_per_gpu"] = rates
    probed_peak, alone_peak = peaks.get("probed"), peaks.get("alone")
    if probed_peak is not None and alone_peak is not None:
        record["left_behind_gib"] = probed_peak - alone_peak
    save()
    print(json.dumps({k: record.get(k) for k in ("winner", "training_peak_reserved_gib", "left_behind_gib")}))


def alone(plan_path: Path, out: Path, configs: list[str], budget_s: float) -> None:
    """Each `ac:mbs` configuration of the plan's recipe trained alone (probe off): the best measured."""
    import torch

    from benchmarks.trainer_process import run_trainer
    from blackwell_trainer.plan.config import Plan

    started = time.monotonic()
    plan = Plan.model_validate_json(plan_path.read_text())
    assert plan.probe is not None
    options = [*plan.probe.candidates, *plan.probe.growth]
    record: dict[str, Any] = {
        "command": " ".join(sys.argv),
        "date": datetime.date.today().isoformat(),
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "scenario": SCENARIO,
        "alone": {},
    }
    for config in configs:
        ac, mbs = config.split(":")
        option = next(
            o
            for o in options
            if o.candidate.activation_checkpointing.value == ac and o.candidate.micro_batch_size == int(mbs)
        )
        left = budget_s - (time.monotonic() - started)
        if left < 60:
            break
        single = plan.model_copy(
            update={"chosen": option.candidate, "predicted": option.prediction, "probe": None}
        )
        result = run_trainer(single, out, f"alone-{ac}-{mbs}", left - 5)
        steps = step_figures(result.stdout + result.stderr)
        rates = [s["tokens_per_second_per_gpu"] for s in steps[2:]]
        record["alone"][config] = {
            "rc": result.returncode,
            "predicted_tokens_per_second_per_gpu": option.prediction.tokens_per_second_per_gpu,
            "predicted_peak_reserved_gib": option.prediction.memory.peak_reserved / 2**30,
            "tokens_per_second_per_gpu": statistics.median(rates) if rates else None,
            "peak_reserved_gib": max((s["reserved_gib"] for s in steps), default=None),
        }
        (out / "probe_alone_h100.json").write_text(json.dumps(record, indent=1))
    print(json.dumps(record["alone"]))


def main() -> int:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("plan")
    p.add_argument("--out", type=Path, required=True)
    r = sub.add_parser("run")
    r.add_argument("--plan", type=Path, required=True)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--budget-s", type=float, default=420)
    a = sub.add_parser("alone")
    a.add_argument("--plan", type=Path, required=True)
    a.add_argument("--out", type=Path, required=True)
    a.add_argument("--configs", default="none:2,none:3,selective:3")
    a.add_argument("--budget-s", type=float, default=420)
    args = parser.parse_args()
    if args.what == "plan":
        make_plan(args.out)
    elif args.what == "alone":
        alone(args.plan, args.out, args.configs.split(","), args.budget_s)
    else:
        run(args.plan, args.out, args.budget_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
