"""Where each trainer's step goes, on one GPU: kernel time by category and the GPU's idle time, both trainers.

    python3 benchmarks/profile_side_by_side.py --card h100 \
        --configs 3b-bf16-b2,ours-3b-bf16-b2+batched_update=true --out $OUT --budget-s 300

Configurations as benchmarks/titan_side_by_side.py names them (`ours-` in front: this trainer alone). This
trainer runs its side-by-side configuration with trainer_h200.py's profile (two steps under torch.profiler
after its timed steps); torchtitan its own launch with its profiler on (two active steps in each 10-step
cycle; the last cycle's Chrome trace is read). For each run: the kernel time by category (trainer_h200's
categories), the 40 largest kernels, and the idle gaps with the host operations behind them
(benchmarks/gpu_gaps.py). The tokens/s of a profiled run are not the side by side's figures: the profiler
slows torchtitan (every step of a cycle is traced) and this trainer's timed steps run before its profile.
torchtitan's host runs ahead of its GPU, so its two traced steps may hold kernels of a third: divide by the
launches of a kernel that runs once a layer a step (attention's backward) to compare per step.

Writes OUT/profile_side_by_side_<card>.json after every run (the traces themselves are not kept).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks import titan_side_by_side as side
from benchmarks import trainer_h200
from benchmarks.gpu_gaps import summarise

PROFILED_STEPS = 2
TOP_KERNELS = 40
# torchtitan 0.2.2's profiler (its Profiling config): a cycle of profile_freq steps ends in `active` traced
# steps after `warmup` ones; the trace of each cycle goes to <dump>/profile_traces/iteration_<step>/.
TITAN_PROFILE_ARGS = [
    "--profiling.enable_profiling",
    "--profiling.profile_freq", str(side.TITAN_LOG_FREQ),
    "--profiling.profiler_active", str(PROFILED_STEPS),
    "--profiling.profiler_warmup", "1",
]  # fmt: skip
GPU_EVENTS = ("kernel", "gpu_memcpy", "gpu_memset")


def kernel_summary(kernels: list[tuple[str, float, int]]) -> dict[str, Any]:
    """(name, microseconds, launches) of each kernel -> the total, milliseconds by category, the largest."""
    categories: dict[str, float] = {}
    for name, us, _ in kernels:
        category = trainer_h200._categorise(name)
        categories[category] = categories.get(category, 0.0) + us
    largest = sorted(kernels, key=lambda k: -k[1])[:TOP_KERNELS]
    return {
        "total_ms": round(sum(us for _, us, _ in kernels) / 1e3, 2),
        "categories_ms": {
            c: round(us / 1e3, 2) for c, us in sorted(categories.items(), key=lambda kv: -kv[1])
        },
        "largest": [
            {"ms": round(us / 1e3, 3), "launches": n, "kernel": name[:160]} for name, us, n in largest
        ],
    }


def trace_kernels(events: list[dict[str, Any]]) -> list[tuple[str, float, int]]:
    """A Chrome trace's GPU events summed by name: (name, microseconds, launches)."""
    totals: dict[str, list[float]] = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in GPU_EVENTS:
            entry = totals.setdefault(str(e["name"]), [0.0, 0])
            entry[0] += float(e.get("dur", 0.0))
            entry[1] += 1
    return [(name, us, int(n)) for name, (us, n) in totals.items()]


def last_trace(dump: Path) -> Path | None:
    """The trace of torchtitan's last profiling cycle (its folders are named by step, not zero-padded)."""
    traces = list(dump.glob("profile_traces/iteration_*/rank0_trace.json"))
    return max(traces, key=lambda p: int(p.parent.name.split("_")[1]), default=None)


def profile_titan(point: side.Point, assets: Path, deadline: float) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="btj-titan-profile-"))
    try:
        cmd = side.titan_command(point, assets, tmp / "dump") + TITAN_PROFILE_ARGS
        text, rc = side.launch(cmd, side.titan_env(tmp), min(deadline - time.time(), 300))
        log = side.parse_titan_log(text)
        record: dict[str, Any] = {
            "who": "titan",
            "status": log.status,
            "exit": rc,
            "detail": log.detail,
            "tokens_per_s_profiled": log.tokens_per_s_per_gpu,
            "peak_reserved_gib": log.peak_reserved_gib,
            "command": " ".join(cmd),
        }
        trace = last_trace(tmp / "dump")
        if trace is None:
            record["status"] = "no trace" if log.status == "ok" else log.status
            return record
        events = json.loads(trace.read_text()).get("traceEvents", [])
        kernels = kernel_summary(trace_kernels(events))
        return {**record, "trace": trace.parent.name, "kernels": kernels, "gaps": summarise(events)}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def profile_ours(point: side.Point, out: Path, deadline: float) -> dict[str, Any]:
    cfg = side.our_config(point)
    cfg.profile = True
    rec = trainer_h200.Grid(out, deadline, gpus=1).run_one(cfg, [0])
    record: dict[str, Any] = {
        "who": "ours",
        "status": rec.status,
        "detail": rec.detail[:500],
        "tokens_per_s_timed": rec.tokens_per_s_per_gpu,  # its timed steps, before the profile
        "peak_reserved_gib": rec.peak_reserved_gib,
        "losses": rec.losses,
    }
    kernels, gaps = out / f"kernels_{cfg.name}.json", out / f"gaps_{cfg.name}.json"
    if kernels.exists():
        listed = [(k["kernel"], float(k["us"]), int(k["count"])) for k in json.loads(kernels.read_text())]
        record["kernels"] = kernel_summary(listed)
    if gaps.exists():
        record["gaps"] = json.loads(gaps.read_text())
    return record


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--configs", required=True, help="comma-separated, as titan_side_by_side.py names them"
    )
    parser.add_argument("--card", choices=side.CARDS, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--budget-s", type=float, default=300.0)
    parser.add_argument("--assets", type=Path, default=side.ASSETS)
    args = parser.parse_args()
    try:
        points = side.expand(args.configs)
    except ValueError as err:
        parser.error(str(err))
    deadline = time.time() + args.budget_s
    args.out.mkdir(parents=True, exist_ok=True)
    meta = side.environment(sys.argv, args.card)
    if wrong := side.check_card(args.card, meta["device"]):
        raise SystemExit(wrong)
    side.ensure_assets(args.assets)
    runs: list[dict[str, Any]] = []
    path = args.out / f"profile_side_by_side_{args.card}.json"
    for point in points:
        for who in ("ours",) if point.ours_only else ("ours", "titan"):  # side.LAUNCH_SECONDS' keys
            if deadline - time.time() < side.LAUNCH_SECONDS[(who, point.model)]:
                runs.append({"config": point.name, "who": who, "status": "skipped (budget)"})
                continue
            if who == "ours":
                result = profile_ours(point, args.out, deadline)
            else:
                result = profile_titan(point, args.assets, deadline)
            runs.append({"config": point.name, **result})
            path.write_text(json.dumps({"meta": meta, "runs": runs}, indent=1) + "\n")
            kernel_ms = (result.get("kernels") or {}).get("total_ms")
            idle_ms = (result.get("gaps") or {}).get("idle_us", 0.0) / 1e3
            print(
                f"{point.name} {who}: {result['status']}, kernels {kernel_ms} ms, idle {idle_ms:.1f} ms",
                flush=True,
            )
    path.write_text(json.dumps({"meta": meta, "runs": runs}, indent=1) + "\n")


if __name__ == "__main__":
    main()
