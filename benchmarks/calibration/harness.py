"""Calibration harness: run this project's trainer over a grid of configurations and write one record each.

On the GPU machine, from the repository root, with the project installed (`pip install --no-deps -e .`,
pydantic carried as wheels, see docs/calibration/README.md):

    python -m benchmarks.calibration.harness --grid issue6 --out $OUT --budget-s 560
    python -m benchmarks.calibration.harness --grid issue7 --out $OUT --budget-s 560     # 8 GPUs
    python -m benchmarks.calibration.harness --cpu-smoke --out /tmp/smoke                # CPU, gloo

The parts: grid.py (families, grids, Plans), worker.py (one configuration), scheduler.py (lanes,
subprocesses, records), prewarm.py (workers started early), and this command line.

Every configuration is a family (model, sequence, GPUs, precision/recipe, AC, sharding) at one micro-batch
size; a family's micro-batch sizes run in doubling order until the first OOM. Each configuration runs in its
own process (torchrun for several GPUs), so an OOM or a crash becomes a record instead of ending the grid.
Its Plan is built with the planner (`evaluate`), so the record carries the prediction next to the
measurement. One-GPU families run in parallel lanes, one per visible GPU; multi-GPU families take as many
GPUs as they need. Records are appended to OUT/records.jsonl (one JSON CalibrationRecord per line) as
each configuration ends; configurations already in --resume files are skipped, so a grid larger than one
call finishes over several calls. Tokens/s per GPU = tokens per step per GPU / the median timed step.
A one-GPU configuration starts in a worker its lane started while the previous configuration trained, its
imports done (`--no-prewarm`: each cold); its record says so ("prewarmed").
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.calibration.grid import GRIDS, H200_INSTANCE
from benchmarks.calibration.prewarm import WarmPool
from benchmarks.calibration.scheduler import REPO, WORKER, Harness, environment, summary
from blackwell_operator.calibrate.coverage import LADDER_TOP
from blackwell_operator.calibrate.records import read_records


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--grid", default="issue6", choices=sorted(GRIDS))
    parser.add_argument(
        "--cpu-smoke",
        "--dry-run",
        action="store_true",
        help="2 configurations of a tiny model on CPU (gloo), for tests",
    )
    parser.add_argument("--out", default=os.environ.get("OUT", "calibration-out"))
    parser.add_argument("--models", default="", help="keep only these grid models (e.g. 1b,8b,custom-13b)")
    parser.add_argument("--seqs", default="", help="keep only these sequence lengths")
    parser.add_argument("--gpus", default="", help="keep only families of these GPU counts")
    parser.add_argument("--precisions", default="", help="keep only bf16 and/or fp8")
    parser.add_argument("--acs", default="", help="keep only these AC modes")
    parser.add_argument("--max-mbs", type=int, default=None, help=f"default {LADDER_TOP} (--cpu-smoke: 1)")
    parser.add_argument(
        "--full-ladder",
        action="store_true",
        help="start every ladder at mbs 1 (default: see --below)",
    )
    parser.add_argument(
        "--below",
        type=int,
        default=2,
        help="start each ladder this many doublings under the largest size the planner predicts to fit",
    )
    parser.add_argument(
        "--fine",
        action="store_true",
        help="sizes near the predicted limit: a quarter of it (at least 1) under it, then up in that step",
    )
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps (the first compiles)")
    parser.add_argument("--timed", type=int, default=3)
    parser.add_argument("--budget-s", type=float, default=540.0, help="start nothing after this many seconds")
    parser.add_argument("--config-timeout", type=float, default=240.0)
    parser.add_argument("--resume", nargs="*", default=[], help="record files whose configurations to skip")
    parser.add_argument("--calibration", default="btj-trainer", help="calibration for the plans' predictions")
    parser.add_argument("--instance-type", default=H200_INSTANCE)
    parser.add_argument(
        "--no-prewarm",
        action="store_true",
        help="start every one-GPU configuration cold (default: its worker imports during the previous one)",
    )
    args = parser.parse_args(argv)

    import torch

    from blackwell_operator.calibrate.predict import load_any_calibration

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    families = GRIDS["cpu-smoke" if args.cpu_smoke else args.grid]
    if args.cpu_smoke:
        args.warmup, args.timed, args.full_ladder = 1, 2, True
    args.max_mbs = args.max_mbs or (1 if args.cpu_smoke else LADDER_TOP)
    keep: dict[str, list[Any]] = {
        "model": _csv(args.models),
        "sequence_length": [int(s) for s in _csv(args.seqs)],
        "gpus": [int(g) for g in _csv(args.gpus)],
        "precision": _csv(args.precisions),
        "ac": _csv(args.acs),
    }
    families = [f for f in families if all(not v or getattr(f, k) in v for k, v in keep.items())]
    # Earlier calls' records (files or folders; missing ones are fine on the first call).
    done = {r.key: r for r in read_records([p for p in args.resume if Path(p).exists()])}
    # On CPU (smoke) three "lanes" let the one- and two-process configurations run at once.
    gpus = torch.cuda.device_count() or (3 if args.cpu_smoke else 1)
    harness = Harness(
        out=out,
        cal=load_any_calibration(args.calibration),
        instance=args.instance_type,
        deadline=time.time() + args.budget_s,
        gpus=gpus,
        warmup=args.warmup,
        timed=args.timed,
        max_mbs=args.max_mbs,
        config_timeout=args.config_timeout,
        start_from_prediction=not args.full_ladder,
        below=args.below,
        fine=args.fine,
        done=done,
        env=environment(),
        warm=None if args.no_prewarm else WarmPool(WORKER, REPO),
    )
    print(json.dumps({"families": len(families), "gpus": gpus, **harness.env}), flush=True)
    harness.run(families)
    text = summary(harness.records)
    (out / "summary.txt").write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
