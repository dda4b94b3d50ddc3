"""H200 record of the probe (issue 29): does it train with the fastest of the planner's top candidates?

Usage (on the GPU machine, from the repository root, both packages' src folders on PYTHONPATH):

    python benchmarks/probe_h200.py --out $OUT [--steps 8] [--only fitted,base] [--scenarios 3b-seq3072]
    python benchmarks/probe_h200.py --out /tmp/p --plan-only     # on CPU: rankings, growth, launches

Three profiles plan each scenario (one H200, ml.p5en.48xlarge with gpusPerNode 1; every scenario is
outside the issue-6 calibration grid's model/sequence points), each with one GPU planned, and run, as FSDP2
on one rank (``ONE_GPU_TUNING``: the trainer's default when the record was made):

- ``fitted``: the shipped btj-trainer calibration (fitted to the issue-6 H200 grid): the reference pick.
- ``base``: the unfitted base calibration (docs/calibration/h200-issue6/base-btj-trainer.yaml: constants
  from spec ratios and published figures, the state every B200 constant is in).
- ``skewed``: the fitted profile with its throughput constants deliberately skewed (SKEW below: how it was
  made) so that the planner's own ranking of its top candidates is wrong; the script checks, before any
  GPU time is spent, that the skewed ranking differs from the fitted one for at least two scenarios.

For each scenario and profile it plans with ``spec.tuning.probe.policy: always``, runs the real trainer
(``python -m blackwell_trainer``) with the probe for a few steps where the probe is on, then runs every
distinct configuration of the scenario on its own (probe off) for ``--steps`` steps, once however many
profiles planned or probed it (grown candidates the probe tried included), to learn what each really
measures (the median steady tokens/s). It prints the number of trainer launches before it starts, and
writes the record after every run, so a timeout keeps what finished.

Must show (issue 29): with ``base``, the probe's winner measures >= 99% of the fitted pick's figure, where
the base pick alone is 2-5% slower; with ``skewed``, the winner is within 2% of the best candidate where the
skewed pick alone is >= 5% slower; with ``fitted`` ("true"), the probe confirms the planner's pick.

Writes ``OUT/probe_h200.json``: command, date, device, versions, the skew, and per scenario and profile
each candidate's predicted and measured figures, the probe's winner and wall time, and its overhead as a
share of a 24-hour run. Run on one H200 on 2026-12-01: docs/benchmarks/probe_h200.md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import re
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from blackwell_operator.calibrate.importers import TRAINER_LOSS_CHUNK
from blackwell_operator.calibration import Calibration, load_calibration
from blackwell_operator.models.spec import BlackwellTrainingJobSpec
from blackwell_operator.planner import plan_job
from blackwell_trainer.plan.config import Candidate, Plan, ProbeResult

ROOT = Path(__file__).resolve().parents[1]
# Run as a script, benchmarks/ is on the path, not the root that holds it.
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.trainer_process import candidate_label, run_trainer  # noqa: E402

BASE = ROOT / "docs" / "calibration" / "h200-issue6" / "base-btj-trainer.yaml"
STEP = re.compile(r"step (\d+)/\d+ loss \S+ .* tokens/s/gpu (\d+)")
DAY_SECONDS = 24 * 3600.0
# Scenarios outside the issue-6 grid (its sequences were 2048, 4096 and 8192 at fixed micro-batches).
SCENARIOS: dict[str, dict[str, Any]] = {
    "3b-seq3072": {"preset": "llama3.2-3b", "seq": 3072, "global": 3072 * 24},
    "3b-seq6144": {"preset": "llama3.2-3b", "seq": 6144, "global": 6144 * 8},
    "1b-seq5120": {"preset": "llama3.2-1b", "seq": 5120, "global": 5120 * 32},
    "1b-seq12288": {"preset": "llama3.2-1b", "seq": 12288, "global": 12288 * 8},
    # Two more where the base calibration picks a smaller micro-batch than the fitted one (found offline).
    "1b-seq7168": {"preset": "llama3.2-1b", "seq": 7168, "global": 7168 * 16},
    "3b-seq6144-g24": {"preset": "llama3.2-3b", "seq": 6144, "global": 6144 * 24},
}
# How the skewed profile is made from the fitted one: multiply these throughput constants. The FP8 GEMM
# efficiency on Hopper is underrated (torchao tensorwise x0.6, the other FP8 recipes x0.5), the mistake a
# modelled profile for a new GPU or format can make (MXFP8 against BF16 on a B200 has no measurement yet).
# Offline this puts BF16 first, with FP8 tensorwise within 2% behind it, in 3b-seq6144, 1b-seq5120 and
# 1b-seq12288 (check_skew refuses to spend GPU time unless the pick flips in at least two), while the H200
# runs FP8 tensorwise 15-25% faster than BF16 at these shapes (docs/benchmarks/trainer_h200.md): the
# skewed pick alone is slower by far more than the 5%, and the right answer is among the
# candidates the probe times.
SKEW: dict[str, float] = {
    "throughput.recipes.9.torchao-tensorwise.efficiency": 0.6,
    "throughput.recipes.9.torchao-rowwise.efficiency": 0.5,
    "throughput.recipes.9.delayed.efficiency": 0.5,
    "throughput.recipes.9.current.efficiency": 0.5,
    "throughput.recipes.9.block.efficiency": 0.5,
}


def skewed(cal: Calibration) -> Calibration:
    """The calibration with SKEW applied (a copy; its name says so)."""
    raw = cal.model_dump(mode="json")
    for path, factor in SKEW.items():
        node = raw
        *parents, leaf = path.split(".")
        for key in parents:
            node = node[key]
        node[leaf] = node[leaf] * factor
    raw["name"] = f"{cal.name}-skewed"
    return Calibration.model_validate(raw)


def base_calibration(fitted: Calibration) -> tuple[Calibration, list[str]]:
    """The unfitted base file; constants it predates (added to the model after it) taken from the fitted
    profile and listed, so that the comparison is of the fitted constants only."""
    raw = yaml.safe_load(BASE.read_text())
    ref = fitted.model_dump(mode="json")
    filled = []
    for section in ("trainer", "memory", "throughput"):
        for key, value in ref[section].items():
            if key not in raw[section]:
                raw[section][key] = value
                raw["sources"][f"{section}.{key}"] = f"taken from {fitted.name} (the base file predates it)"
                filled.append(f"{section}.{key}")
    return Calibration.model_validate(raw), filled


# The record (2026-12-01) ran FSDP2 on one rank, the trainer's default then (the single-device path is since
# 2026-12-02): every profile plans it so and every launch asks the trainer for it, so that a run measures
# what its plans predict and the record's plans are reproduced.
ONE_GPU_TUNING = "single_device=fsdp"


def as_recorded(cal: Calibration) -> Calibration:
    """The profile as the record planned with: one GPU as FSDP2 on one rank (ONE_GPU_TUNING), FP8 selective
    AC scored as a family of its own, and the loss chunk of then. The profile said nothing of selective
    running as AC none then (trainer.selective_recomputes_nothing, shipped 2026-12-07), and the record's
    probes timed FP8 selective beside FP8 none (docs/benchmarks/probe_h200.md: they measured the same)."""
    trainer = cal.trainer.model_copy(
        update={
            "single_device_path": False,
            "selective_recomputes_nothing": [],
            "loss_chunk_tokens": TRAINER_LOSS_CHUNK,  # the profile's chunk then
        }
    )
    return cal.model_copy(update={"trainer": trainer})


def profiles() -> tuple[dict[str, Calibration], list[str]]:
    fitted = as_recorded(load_calibration("btj-trainer"))
    base, filled = base_calibration(fitted)
    return {"fitted": fitted, "base": as_recorded(base), "skewed": skewed(fitted)}, filled


def spec_for(scenario: dict[str, Any], steps: int) -> BlackwellTrainingJobSpec:
    return BlackwellTrainingJobSpec.model_validate(
        {
            "model": {"preset": scenario["preset"]},
            "cluster": {"instanceType": "ml.p5en.48xlarge", "nodes": 1, "gpusPerNode": 1},
            "training": {
                "sequenceLength": scenario["seq"],
                "globalBatchTokens": scenario["global"],
                "steps": steps,
            },
            # The probe's own cap (600 s): a budget cut-off is not what this record measures.
            "tuning": {"probe": {"policy": "always", "candidates": 3, "budgetSeconds": 600}},
        }
    )


def ranking(plan: Plan) -> list[str]:
    assert plan.probe is not None
    return [candidate_label(c.candidate) for c in plan.probe.candidates]


def check_skew(plans: dict[str, dict[str, Plan]]) -> list[str]:
    """The scenarios whose skewed pick differs from the fitted pick (at least two are needed)."""
    return [s for s, p in plans.items() if ranking(p["skewed"])[0] != ranking(p["fitted"])[0]]


def train(plan: Plan, out: Path, name: str, timeout_s: float) -> dict[str, Any]:
    """One trainer process on `plan`: exit code, seconds, steady tokens/s, the probe's result."""
    run = run_trainer(plan, out, name, timeout_s, tuning=ONE_GPU_TUNING)
    rates = [int(m[2]) for m in map(STEP.search, (run.stdout + run.stderr).splitlines()) if m]
    result = ProbeResult.find(run.termination_message)
    return {
        "rc": run.returncode,
        "seconds": run.seconds,
        "tokens_per_second_per_gpu": statistics.median(rates[2:]) if len(rates) > 2 else None,
        "probe": None if result is None else result.model_dump(mode="json", by_alias=True),
    }


def config_key(candidate: Candidate) -> str:
    """One configuration, whichever profile planned it (the same scenario fixes everything else)."""
    return candidate.model_dump_json(by_alias=True)


def tried(plan: Plan, probe: dict[str, Any] | None) -> list[Candidate]:
    """The configurations a probed run timed: its candidates and any grown one (by measurement index)."""
    assert plan.probe is not None
    if probe is None:
        return [c.candidate for c in plan.probe.candidates]
    options = plan.probe.options
    return [options[m["index"]].candidate for m in probe["measurements"] if m["index"] < len(options)]


def winner(plan: Plan, probe: dict[str, Any] | None) -> list[Candidate]:
    """The configuration a probed run trained with (none without a probe result)."""
    if probe is None or plan.probe is None or probe.get("winner") is None:
        return []
    return [plan.probe.options[probe["winner"]].candidate]


def launches(plans: dict[str, Plan]) -> tuple[int, int, int]:
    """(probed runs, distinct configurations alone, grown ones that may add to them) for one scenario."""
    probed = sum(1 for p in plans.values() if p.probe is not None and p.probe.enabled)
    distinct = {config_key(p.chosen) for p in plans.values()}
    distinct |= {config_key(c.candidate) for p in plans.values() if p.probe for c in p.probe.candidates}
    grown = {
        config_key(g.candidate)
        for p in plans.values()
        if p.probe is not None and p.probe.enabled
        for g in p.probe.growth
    }
    extra = sum(
        min(p.probe.max_grown, len(p.probe.growth)) for p in plans.values() if p.probe and p.probe.enabled
    )
    return probed, len(distinct), min(extra, len(grown - distinct))


def measure_scenario(
    scenario: str,
    plans: dict[str, Plan],
    out: Path,
    steps: int,
    record: dict[str, Any],
    save: Callable[[], None],
    every_tried: bool = True,
) -> None:
    """The probed run of each profile whose probe is on, then every distinct configuration any profile
    planned or probed (grown ones included) alone, once; the issue's figures, saved after each run.
    With `every_tried` off, only each profile's pick and each probe's winner run alone (the probe's own
    measurement stands for the rest: a shorter call)."""
    results: dict[str, Any] = record["results"].setdefault(scenario, {"alone": {}, "profiles": {}})
    configs: dict[str, tuple[Plan, Candidate, Any]] = {}
    for profile, plan in plans.items():
        assert plan.probe is not None
        probe = None
        kept = results["profiles"].get(profile, {}).get("probe")
        if plan.probe.enabled and kept is not None:
            probe = kept  # measured by an earlier call (--resume)
        elif plan.probe.enabled:
            probed = train(plan.model_copy(update={"steps": 3}), out, f"{scenario}.{profile}.probed", 1800)
            probe = probed["probe"]
            results["profiles"][profile] = {"probed_rc": probed["rc"], "probe": probe}
            save()
        else:
            results["profiles"][profile] = {"probe": None, "reason": plan.probe.reason}
        others = tried(plan, probe) if every_tried else winner(plan, probe)
        for c in [plan.chosen, *others]:
            configs.setdefault(config_key(c), (plan, c, None))
    for key, (plan, c, _) in configs.items():
        if key in results["alone"]:
            continue
        option = next((o for o in (plan.probe.options if plan.probe else []) if o.candidate == c), None)
        prediction = option.prediction if option else plan.predicted
        single = plan.model_copy(update={"chosen": c, "predicted": prediction, "probe": None, "steps": steps})
        run = train(single, out, f"{scenario}.alone.{candidate_label(c)}", 1800)
        results["alone"][key] = {
            "candidate": candidate_label(c),
            "measured_tokens_per_second_per_gpu": run["tokens_per_second_per_gpu"],
            "rc": run["rc"],
            "seconds": run["seconds"],
        }
        save()
    for profile, plan in plans.items():
        results["profiles"][profile].update(
            summarise(plan, results["profiles"][profile]["probe"], results["alone"])
        )
    save()


def summarise(plan: Plan, probe: dict[str, Any] | None, alone: dict[str, Any]) -> dict[str, Any]:
    """Per profile: each configuration's prediction and alone figure, the winner's and the pick's share
    of the best measured, the probe's wall time and its share of a 24-hour run."""
    assert plan.probe is not None
    rate = {k: (v["measured_tokens_per_second_per_gpu"] or 0.0) for k, v in alone.items()}
    best = max(rate.values(), default=0.0)
    won = plan.chosen if probe is None else plan.probe.options[probe["winner"]].candidate
    seconds = probe["seconds"] if probe else None
    rows = [
        {
            "candidate": candidate_label(o.candidate),
            "grows": getattr(o, "grows", None),
            "predicted_tokens_per_second_per_gpu": o.prediction.tokens_per_second_per_gpu,
            "predicted_peak_reserved_bytes": o.prediction.memory.peak_reserved,
            "measured_alone_tokens_per_second_per_gpu": rate.get(config_key(o.candidate)),
        }
        for o in plan.probe.options
        if config_key(o.candidate) in rate
    ]
    return {
        "pick": candidate_label(plan.chosen),
        "winner": candidate_label(won),
        "candidates": rows,
        "winner_share_of_best": rate.get(config_key(won), 0.0) / best if best else None,
        "pick_share_of_best": rate.get(config_key(plan.chosen), 0.0) / best if best else None,
        "probe_seconds": seconds,
        "overhead_share_of_24h": seconds / DAY_SECONDS if seconds else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--only", default="fitted,base,skewed", help="profiles to run, comma-separated")
    parser.add_argument(
        "--scenarios",
        default=",".join(SCENARIOS),
        help=f"scenarios to run, comma-separated: {', '.join(SCENARIOS)}",
    )
    parser.add_argument(
        "--runs",
        default="",
        help="scenario:profile+profile,... (overrides --scenarios and --only), e.g. 1b-seq5120:fitted+skewed",
    )
    parser.add_argument(
        "--alone",
        choices=("all", "picks"),
        default="all",
        help="run alone every configuration a probe tried, or only the picks and the probes' winners",
    )
    parser.add_argument(
        "--resume",
        type=Path,
        default=None,
        help="an earlier call's probe_h200.json: its probed runs and alone figures are kept, not run again",
    )
    parser.add_argument("--plan-only", action="store_true", help="plan, print rankings and launches, no GPU")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    cals, filled = profiles()
    runs = {
        name: [p for p in profiles_of.split("+") if p]
        for name, _, profiles_of in (r.partition(":") for r in args.runs.split(",") if r)
    }
    chosen = list(runs) if runs else [s for s in args.scenarios.split(",") if s]
    unknown = [s for s in chosen if s not in SCENARIOS]
    if unknown:
        parser.error(f"--scenarios: unknown {unknown}; choose from {', '.join(SCENARIOS)}")
    plans = {
        name: {p: plan_job(spec_for(s, 1000), calibration=cal) for p, cal in cals.items()}
        for name, s in SCENARIOS.items()
    }
    flipped = check_skew(plans)
    only = [p for p in args.only.split(",") if p]
    run_profiles = {name: runs.get(name, only) for name in chosen}
    record: dict[str, Any] = {
        "command": " ".join([sys.executable, *sys.argv]),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "device": _device(),
        "host": platform.node(),
        "skew": SKEW,
        "base_constants_taken_from_fitted": filled,
        "skew_flips_the_pick_in": flipped,
        "rankings": {s: {p: ranking(plan) for p, plan in ps.items()} for s, ps in plans.items()},
        "growth": {s: {p: growth(plan) for p, plan in ps.items()} for s, ps in plans.items()},
        "results": json.loads(args.resume.read_text())["results"] if args.resume else {},
    }
    path = args.out / "probe_h200.json"

    def save() -> None:
        path.write_text(json.dumps(record, indent=2))

    total = [0, 0, 0]
    for name in chosen:
        counts = launches({p: plans[name][p] for p in run_profiles[name]})
        total = [a + b for a, b in zip(total, counts, strict=True)]
        print(f"{name}: {counts[0]} probed runs, {counts[1]} configurations alone, up to {counts[2]} grown")
    record["launches"] = {"probed": total[0], "alone": total[1], "grown_at_most": total[2]}
    print(f"launches: {total[0] + total[1]} trainer processes, up to {total[2]} more for grown candidates")
    save()
    if args.plan_only:
        print(json.dumps({"rankings": record["rankings"], "growth": record["growth"]}, indent=2))
        return 0
    if any("skewed" in ps for ps in run_profiles.values()) and len(flipped) < 2:
        print(f"the skew flips the pick in {flipped} only; adjust SKEW", file=sys.stderr)
        return 1
    for name in chosen:
        wanted = {p: plans[name][p] for p in run_profiles[name]}
        measure_scenario(name, wanted, args.out, args.steps, record, save, args.alone == "all")
    return 0


def growth(plan: Plan) -> list[str]:
    """The larger micro-batches a probe may grow to, as 'candidate -> configuration'."""
    if plan.probe is None:
        return []
    return [f"{g.grows} -> {candidate_label(g.candidate)}" for g in plan.probe.growth]


def _device() -> str:
    try:
        import torch

        return f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}"
    except (ImportError, RuntimeError, AssertionError):
        return "no CUDA device"


if __name__ == "__main__":
    raise SystemExit(main())
