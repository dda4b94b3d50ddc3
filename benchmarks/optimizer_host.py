"""The host's time in one AdamW step: torch's fused kernel, the compiled update per tensor, and batched.

    python benchmarks/optimizer_host.py --model 3b --out $OUT          # any machine; CUDA when present

The profile of 2026-12-07 (docs/benchmarks/titan_h100.md, "night, last") found the 3B step 21 ms longer
than its kernels, and the compiled update (``compiled_update``) makes one compiled call per tensor (255 at
3B). This times what the host spends in ``AdamW.step()`` for the model's real number of parameter tensors,
each cut to ``--elements`` elements so that the kernels themselves cost next to nothing: the time from the
call until it returns (on CUDA the kernels are then queued, not run), the median of ``--steps`` steps after
the first (which compiles). Variants:

- ``fused``: torch's ``AdamW(fused=True)`` with the clip's ``grad_scale`` (one multi-tensor launch per
  chunk of tensors; on the CPU torch's fused CPU kernel);
- ``per_tensor``: the trainer's ``AdamW`` with ``compile_all`` (the default since 2026-12-07);
- ``batched``: the same with ``batch_all`` (the ``batched_update`` switch): runs of up to 28 tensors of one
  size per compiled call.

Writes ``OUT/optimizer_host_<model>_<device>.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

# Run as a script, benchmarks/ and not the repository is on the path.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.optimizer_step import BETAS, EPS, LR, WEIGHT_DECAY, card, parameter_shapes
from blackwell_trainer.loop.optimizer import AdamW

HYPER: dict[str, Any] = {"lr": LR, "betas": BETAS, "eps": EPS, "weight_decay": WEIGHT_DECAY}


def _optimizer(variant: str, leaves: list[torch.nn.Parameter], device: torch.device) -> torch.optim.Optimizer:
    if variant == "fused":
        return torch.optim.AdamW(leaves, fused=True, **HYPER)
    opt = AdamW(leaves, fused=device.type == "cuda", **HYPER)
    opt.compile_all, opt.compile_on_cpu, opt.batch_all = True, True, variant == "batched"
    return opt


def host_ms(variant: str, count: int, elements: int, steps: int, device: torch.device) -> dict[str, float]:
    """(first step's seconds, median host milliseconds of the steps after it) for one variant."""
    leaves = [torch.nn.Parameter(torch.randn(elements, device=device)) for _ in range(count)]
    grads = [torch.randn(elements, device=device) for _ in range(count)]
    opt = _optimizer(variant, leaves, device)
    scale = torch.tensor(1.25, device=device)
    times = []
    for _ in range(steps + 1):
        for leaf, grad in zip(leaves, grads, strict=True):
            leaf.grad = grad.clone()
        opt.grad_scale = scale  # type: ignore[attr-defined]
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - start)
        if device.type == "cuda":
            torch.cuda.synchronize()
    return {"first_step_s": round(times[0], 2), "host_ms": round(statistics.median(times[1:]) * 1e3, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="3b", choices=("1b", "3b"))
    parser.add_argument("--elements", type=int, default=16)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    count = len(parameter_shapes(args.model))
    record: dict[str, Any] = {
        "command": f"python3 benchmarks/optimizer_host.py --model {args.model} --out $OUT",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "device": card() if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__,
        "tensors": count,
        "elements_per_tensor": args.elements,
        "variants": {
            v: host_ms(v, count, args.elements, args.steps, device)
            for v in ("fused", "per_tensor", "batched")
        },
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"optimizer_host_{args.model}_{device.type}.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
