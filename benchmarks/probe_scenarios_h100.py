"""Issue 37's must-show on one H100: jobs planned as users get them (`probe: auto`) against their neighbours.

Two steps, so that the GPU machine needs only the trainer:

    python benchmarks/probe_scenarios_h100.py plan --out benchmarks/results/probe_scenarios_h100   # CPU
    python3 benchmarks/probe_scenarios_h100.py run --plans benchmarks/results/probe_scenarios_h100 \
        --out $OUT --budget-s 540                                                                  # GPU

`plan` plans each scenario (outside the H100 calibration grid: other sequence lengths, a global batch
that makes the job accumulate) once per profile: the shipped profile as it stands before the H100 refit
(`shipped`), the unfitted base profile the H200 fit started from (`base`), and, where given, a refitted
one. Each is the plan the operator would make, `probe: auto` (a real run's step count sets the probe's
budget); only the steps trained here are cut. It also plans every configuration a probe should be judged
against, trained alone with the probe off: the pick's recipe at each AC mode and at the micro-batch sizes
one step below and above the probe's candidates (sizes that divide the global batch, as the planner
allows). `run` trains the probed jobs first, then each configuration alone, and writes
OUT/probe_scenarios_h100.json after every run, so a timeout keeps what finished.
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

from benchmarks.trainer_process import candidate_label, step_figures  # noqa: E402  (after the path fix)

INSTANCE = "ml.p5.48xlarge"
# Steps a user's job would run: they set the probe's time budget (a share of the predicted run).
USER_STEPS = 3000
# Steps trained here after the probe, and alone; tokens/s is the median from the third step on.
RUN_STEPS = 6
# Lines of each run's log kept in the JSON: enough for an OOM's traceback and the probe's lines.
LOG_TAIL_LINES = 40
PROFILES = {
    "shipped": "btj-trainer",
    "base": "docs/calibration/h200-issue6/base-btj-trainer.yaml",
}
SCENARIOS: dict[str, dict[str, Any]] = {
    "3b-s2560-b24": {"preset": "llama3.2-3b", "seq": 2560, "sequences": 24},
    "1b-s3072-b48": {"preset": "llama3.2-1b", "seq": 3072, "sequences": 48},
}


def _spec(scenario: dict[str, Any], tuning: dict[str, Any]) -> Any:
    from blackwell_operator.models.spec import BlackwellTrainingJobSpec

    return BlackwellTrainingJobSpec.model_validate(
        {
            "model": {"preset": scenario["preset"]},
            "cluster": {"instanceType": INSTANCE, "nodes": 1, "gpusPerNode": 1},
            "training": {
                "sequenceLength": scenario["seq"],
                "globalBatchTokens": scenario["seq"] * scenario["sequences"],
                "steps": USER_STEPS,
            },
            "tuning": tuning,
        }
    )


def make_plans(out: Path, profiles: dict[str, str]) -> None:
    """Every scenario's probed plan per profile, and the alone configurations (planned with the shipped
    profile: only their own measurement is used)."""
    from blackwell_operator.calibrate.predict import load_any_calibration
    from blackwell_operator.errors import PlanningError
    from blackwell_operator.planner import plan_job

    out.mkdir(parents=True, exist_ok=True)
    index: dict[str, Any] = {"profiles": profiles, "scenarios": SCENARIOS, "probed": [], "alone": []}
    for name, scenario in SCENARIOS.items():
        sizes: set[int] = set()
        recipe = None
        for profile, source in profiles.items():
            plan = plan_job(
                _spec(scenario, {"probe": {"policy": "auto"}}),
                job_name=f"{name}-{profile}",
                calibration=load_any_calibration(source),
            )
            plan = plan.model_copy(update={"steps": RUN_STEPS, "log_every_steps": 1})
            path = out / f"{name}.{profile}.plan.json"
            path.write_text(plan.model_dump_json(by_alias=True, indent=1))
            options = [*plan.probe.candidates, *plan.probe.growth] if plan.probe else []
            index["probed"].append(
                {
                    "scenario": name,
                    "profile": profile,
                    "plan": path.name,
                    "pick": candidate_label(plan.chosen),
                    "probe_enabled": plan.probe.enabled if plan.probe else False,
                    "probe_reason": plan.probe.reason if plan.probe else "",
                    "options": [candidate_label(o.candidate) for o in options],
                }
            )
            recipe = recipe or plan.chosen.precision_recipe
            sizes |= {o.candidate.micro_batch_size for o in options} | {plan.chosen.micro_batch_size}
        divisors = [m for m in range(1, scenario["sequences"] + 1) if scenario["sequences"] % m == 0]
        # One size below the smallest and above the largest any probe looked at, without and with selective
        # AC; full AC (never the fastest on one GPU here) at the size the planner gives it. Alone plans keep
        # no memory headroom, so that a size the model wrongly rules out still runs: whether it stays inside
        # the job's budget is read from its measurement.
        low, high = min(sizes), max(sizes)
        wanted = sizes | {
            max([m for m in divisors if m < low], default=low),
            min([m for m in divisors if m > high], default=high),
        }
        configs: list[tuple[str, int | str]] = [
            (ac, m) for ac in ("none", "selective") for m in sorted(wanted)
        ]
        configs.append(("full", "auto"))
        for ac, mbs in configs:
            pins = {
                "precision": "bf16" if recipe is None or recipe.value == "none" else "fp8",
                "activationCheckpointing": ac,
                "microBatchSize": mbs,
                "memoryHeadroom": 0.0,
                "probe": {"policy": "never"},
            }
            try:
                plan = plan_job(_spec(scenario, pins), job_name=f"{name}-alone")
            except PlanningError:
                continue  # predicted over the card itself, or no global batch at that size
            if plan.chosen.precision_recipe != recipe:
                continue
            plan = plan.model_copy(update={"steps": RUN_STEPS, "log_every_steps": 1})
            path = out / f"{name}.alone-{ac}-{plan.chosen.micro_batch_size}.plan.json"
            path.write_text(plan.model_dump_json(by_alias=True, indent=1))
            index["alone"].append(
                {
                    "scenario": name,
                    "config": candidate_label(plan.chosen),
                    "plan": path.name,
                    "predicted_tokens_per_second_per_gpu": plan.predicted.tokens_per_second_per_gpu,
                    "predicted_peak_reserved_gib": plan.predicted.memory.peak_reserved / 2**30,
                }
            )
    # Most promising first in each scenario, so that a call cut short has measured the likely best.
    order = list(SCENARIOS)
    index["alone"].sort(key=lambda a: (order.index(a["scenario"]), -a["predicted_tokens_per_second_per_gpu"]))
    (out / "index.json").write_text(json.dumps(index, indent=1))
    for p in index["probed"]:
        print(p["scenario"], p["profile"], p["pick"], p["probe_enabled"], p["options"])
    print(len(index["alone"]), "alone:", [a["config"] for a in index["alone"]])


def _figures(text: str) -> dict[str, Any]:
    steps = step_figures(text)
    rates = [s["tokens_per_second_per_gpu"] for s in steps[2:]]
    return {
        "steps": steps,
        "tokens_per_second_per_gpu": statistics.median(rates) if rates else None,
        "peak_reserved_gib": max((s["reserved_gib"] for s in steps), default=None),
    }


def run(plans: Path, out: Path, budget_s: float, only: str) -> None:
    """Train each plan; `out` gets the record and one file of the runs' output (the device returns 8)."""
    import torch

    from benchmarks.trainer_process import run_trainer
    from blackwell_trainer.plan.config import Plan, ProbeResult

    started = time.monotonic()
    index = json.loads((plans / "index.json").read_text())
    record: dict[str, Any] = {
        "command": " ".join(sys.argv),
        "date": datetime.date.today().isoformat(),
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "torch": torch.__version__,
        "scenarios": index["scenarios"],
        "profiles": index["profiles"],
        "probed": {},
        "alone": {},
    }
    path = out / "probe_scenarios_h100.json"
    # Scenario by scenario: its probed jobs, then its configurations alone.
    jobs = [
        (kind, item)
        for scenario in index["scenarios"]
        for kind in ("probed", "alone")
        for item in index[kind]
        if item["scenario"] == scenario
    ]
    for kind, item in jobs:
        if only and not any(part in item["plan"] for part in only.split(",")):
            continue
        left = budget_s - (time.monotonic() - started)
        if left < 75:
            record.setdefault("not_run", []).append(item["plan"])
            continue
        plan = Plan.model_validate_json((plans / item["plan"]).read_text())
        name = item["plan"].removesuffix(".plan.json")
        result = run_trainer(plan, out, name, left - 5)
        text = result.stdout + result.stderr
        entry = {
            **item,
            "rc": result.returncode,
            "seconds": result.seconds,
            **_figures(text),
            "log_tail": text.splitlines()[-LOG_TAIL_LINES:],
        }
        if kind == "probed":
            probe = ProbeResult.find(result.termination_message)
            entry["probe"] = None if probe is None else probe.model_dump(mode="json", by_alias=True)
            if probe is not None and probe.chosen is not None:
                entry["winner"] = candidate_label(probe.chosen)
        record[kind][name] = entry
        path.write_text(json.dumps(record, indent=1))
        print(
            f"{name}: rc {result.returncode} {entry['tokens_per_second_per_gpu']} tok/s "
            f"peak {entry['peak_reserved_gib']} GiB {entry.get('winner', '')} ({result.seconds} s)",
            flush=True,
        )


def _shown(value: float | None, spec: str) -> str:
    """A figure for the table, "-" where a run left none (it failed or ran out of memory)."""
    return "-" if value is None else format(value, spec)


def report(result_path: Path, plans: Path) -> str:
    """The must-show table from a run's JSON: each probed job against the best configuration alone.

    The best alone is the fastest that stayed inside the job's memory budget (the card less
    spec.tuning.memoryHeadroom): a faster one above it is a size the job may not take, and is listed."""
    data = json.loads(result_path.read_text())
    rows = [
        "| scenario | profile | planned pick | probe winner | trained tok/s | best alone (within budget) | "
        "share | trained peak GiB | winner alone GiB | left behind | OOM |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for job in data["probed"].values():
        scenario = job["scenario"]
        plan = json.loads((plans / job["plan"]).read_text())
        budget = (plan.get("probe") or {}).get("memoryBudgetBytes") or 0
        alone = [a for a in data["alone"].values() if a["scenario"] == scenario and a["rc"] == 0]
        within = [
            a
            for a in alone
            if a["peak_reserved_gib"] is not None and a["peak_reserved_gib"] * 2**30 <= budget
        ]
        best = max(within, key=lambda a: a["tokens_per_second_per_gpu"] or 0, default=None)
        winner = job.get("winner") or job["pick"]
        twin = next((a for a in alone if a["config"] == winner), None)
        trained = job["tokens_per_second_per_gpu"]
        share = trained / best["tokens_per_second_per_gpu"] if best and trained else None
        ooms = sum(m["outcome"] == "oom" for m in ((job.get("probe") or {}).get("measurements") or []))
        left = (
            job["peak_reserved_gib"] - twin["peak_reserved_gib"]
            if twin and job["peak_reserved_gib"]
            else None
        )
        best_text = f"{best['config']} {best['tokens_per_second_per_gpu']:,.0f}" if best else "-"
        rows.append(
            f"| {scenario} | {job['profile']} | {job['pick']} | {winner} | {_shown(trained, ',.0f')} | "
            f"{best_text} | {_shown(share, '.3f')} | {_shown(job['peak_reserved_gib'], '.1f')} | "
            f"{_shown(twin['peak_reserved_gib'] if twin else None, '.1f')} | {_shown(left, '+.1f')} | "
            f"{ooms} probe, rc {job['rc']} |"
        )
    rows += [
        "",
        "| configuration alone | predicted tok/s | measured | predicted peak GiB | measured |",
        "|---|---|---|---|---|",
    ]
    for a in data["alone"].values():
        rows.append(
            f"| {a['scenario']} {a['config']} | {a['predicted_tokens_per_second_per_gpu']:,.0f} | "
            f"{a['tokens_per_second_per_gpu'] or 0:,.0f} | {a['predicted_peak_reserved_gib']:.1f} | "
            f"{a['peak_reserved_gib'] or 0:.1f} (rc {a['rc']}) |"
        )
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("plan")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--refit", default="", help="a refitted profile to plan with too (name or YAML path)")
    r = sub.add_parser("run")
    r.add_argument("--plans", type=Path, required=True)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--budget-s", type=float, default=540)
    r.add_argument("--only", default="", help="run only plans whose file name contains one of these")
    t = sub.add_parser("report")
    t.add_argument("result", type=Path, help="a run's probe_scenarios_h100.json")
    t.add_argument("--plans", type=Path, default=ROOT / "benchmarks/results/probe_scenarios_h100")
    args = parser.parse_args()
    if args.what == "report":
        print(report(args.result, args.plans))
    elif args.what == "plan":
        profiles = dict(PROFILES)
        if args.refit:
            profiles["refit"] = args.refit
        make_plans(args.out, profiles)
    else:
        run(args.plans, args.out, args.budget_s, args.only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
