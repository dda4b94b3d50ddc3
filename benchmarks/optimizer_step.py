"""The optimizer step's parts on one GPU, at a model's real parameter shapes, each timed on its own.

Issue 38: the fused AdamW kernel took 30 ms a step at 3B on an H200 where its 28 bytes per parameter need
21 ms, and every weight gradient arrives as a bf16 GEMM output cast to fp32 before the optimizer reads it.
This times, on synthetic tensors of the Llama-3.2 shapes (untied), what each step pays and the candidates:

- ``cast``: bf16 gradients cast to fp32 (what the backward pass does for fp32 weights);
- ``norm_fp32`` / ``norm_bf16``: the clip's total norm over fp32 or bf16 gradients;
- ``fused_fp32``: ``torch.optim.AdamW(fused=True)`` with ``grad_scale`` (the trainer today; the kernel
  then also writes each unscaled gradient back);
- ``fused_bf16``: the same kernel on fp32 weights with bf16 gradients (``Tensor.grad_dtype``), if it runs;
- ``compiled_fp32`` / ``compiled_bf16``: the trainer's one-tensor update (``loop.optimizer.adamw_one``)
  over every tensor, compiled by torch.compile as one graph, reading fp32 or bf16 gradients;
- ``trainer_bf16``: the trainer's own ``AdamW`` step over fp32 weights whose gradients are bf16 (the
  ``bf16_gradients`` switch): that update compiled once and called per tensor;
- ``trainer_fp32``: the same step over fp32 gradients (the ``compiled_update`` switch).

and how far the compiled updates' weights are from the fused kernel's after a few steps:

    python3 benchmarks/optimizer_step.py --model 3b --out $OUT

Writes ``OUT/optimizer_step_<model>.json`` with the card, versions, milliseconds per step and GB/s.
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import subprocess
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from blackwell_trainer.loop.optimizer import AdamW, adamw_one, gradient_norm

# (dim, layers, kv_dim, ffn, vocab): Llama-3.2-1B and -3B, output head untied as in the side by side.
SHAPES = {"1b": (2048, 16, 512, 8192, 128256), "3b": (3072, 28, 1024, 8192, 128256)}
LR, BETAS, EPS, WEIGHT_DECAY = 3e-4, (0.9, 0.95), 1e-8, 0.1
REPEATS = 10


def parameter_shapes(model: str) -> list[tuple[int, ...]]:
    """Every parameter's shape, in the model's order."""
    dim, layers, kv, ffn, vocab = SHAPES[model]
    block = [(dim, dim), (kv, dim), (kv, dim), (dim, dim), (ffn, dim), (ffn, dim), (dim, ffn), (dim,), (dim,)]
    return [(vocab, dim), *block * layers, (dim,), (vocab, dim)]


def timed(fn: Callable[[], Any], repeats: int = REPEATS) -> float:
    """Median milliseconds of ``fn`` over ``repeats`` calls after two warm-up calls."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(float(start.elapsed_time(end)))
    return sorted(times)[len(times) // 2]


def each_tensor(
    one: Callable[..., None],
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    exp_avgs: list[torch.Tensor],
    exp_avg_sqs: list[torch.Tensor],
    decays: list[float],
    lr: torch.Tensor,
    step: torch.Tensor,
    grad_scale: torch.Tensor,
) -> None:
    """``one`` (the trainer's ``adamw_one``) over every tensor in turn."""
    for param, grad, exp_avg, exp_avg_sq, decay in zip(
        params, grads, exp_avgs, exp_avg_sqs, decays, strict=True
    ):
        one(param, grad, exp_avg, exp_avg_sq, lr, step, grad_scale, (*BETAS, EPS, decay))


# Compiled whole: one graph over every tensor, Inductor groups the kernels.
adamw_update = functools.partial(each_tensor, adamw_one)


def fused_with_bf16_gradients(
    params: list[torch.Tensor], grads16: list[torch.Tensor], decays: list[float]
) -> float | str:
    """The fused kernel on fp32 weights with bf16 gradients (``Tensor.grad_dtype``), or why not."""
    if not hasattr(torch.Tensor, "grad_dtype"):
        return "this torch has no Tensor.grad_dtype"
    leaves = [p.clone().requires_grad_() for p in params]
    try:
        for leaf, grad in zip(leaves, grads16, strict=True):
            leaf.grad_dtype = grad.dtype
            leaf.grad = grad
        groups = [{"params": [p], "weight_decay": d} for p, d in zip(leaves, decays, strict=True)]
        opt = torch.optim.AdamW(groups, lr=LR, betas=BETAS, eps=EPS, fused=True)
        return timed(opt.step)
    except (RuntimeError, TypeError) as err:
        return f"{type(err).__name__}: {str(err).splitlines()[0]}"


def trainer_step(
    params: list[torch.Tensor],
    grads: list[torch.Tensor],
    decays: list[float],
    fused_params: list[torch.Tensor],
) -> tuple[float, float, float]:
    """The trainer's AdamW over weights with bf16 gradients (``bf16_gradients``) or, given fp32 ones, with
    ``compile_all`` (``compiled_update``): seconds of its first (compiling) step, milliseconds a step
    after it, and its distance from the fused kernel's weights."""
    leaves = [torch.nn.Parameter(p.clone()) for p in params]
    for leaf, grad in zip(leaves, grads, strict=True):
        if grad.dtype != leaf.dtype:
            leaf.grad_dtype = grad.dtype
        leaf.grad = grad
    groups = [
        {"params": [p for p, d in zip(leaves, decays, strict=True) if d], "weight_decay": WEIGHT_DECAY},
        {"params": [p for p, d in zip(leaves, decays, strict=True) if not d], "weight_decay": 0.0},
    ]
    opt = AdamW(groups, lr=LR, betas=BETAS, eps=EPS, fused=True)
    opt.compile_all = grads[0].dtype == params[0].dtype
    opt.grad_scale = torch.tensor(1.0, device=params[0].device)
    begin = time.perf_counter()
    opt.step()
    torch.cuda.synchronize()
    compile_s = round(time.perf_counter() - begin, 1)
    step_ms = timed(opt.step)
    distance = max(
        ((a.detach() - b.detach()).abs().max() / b.detach().abs().max()).item()
        for a, b in zip(leaves, fused_params, strict=True)
    )
    return compile_s, step_ms, distance


def card() -> str:
    """nvidia-smi's name and driver of GPU 0."""
    query = ["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader", "-i", "0"]
    return subprocess.run(query, capture_output=True, text=True, check=False).stdout.strip()


def measure(model: str) -> dict[str, Any]:
    """Every part, timed; the compiled updates' distance from the fused kernel after three steps."""
    device = torch.device("cuda")
    gen = torch.Generator(device=device).manual_seed(0)
    shapes = parameter_shapes(model)
    count = sum(torch.Size(s).numel() for s in shapes)
    params = [torch.randn(s, device=device, generator=gen) * 0.02 for s in shapes]
    grads16 = [(torch.randn(s, device=device, generator=gen) * 1e-3).bfloat16() for s in shapes]
    grads32 = [g.float() for g in grads16]
    decays = [WEIGHT_DECAY if len(s) >= 2 else 0.0 for s in shapes]
    ms: dict[str, float] = {}

    ms["cast"] = timed(lambda: [g.float() for g in grads16])
    ms["norm_fp32"] = timed(lambda: gradient_norm(grads32, foreach=True))
    ms["norm_bf16"] = timed(lambda: gradient_norm(grads16, foreach=True))

    fused_params = [p.clone().requires_grad_() for p in params]
    for p, g in zip(fused_params, grads32, strict=True):
        p.grad = g
    groups = [
        {"params": [p for p, d in zip(fused_params, decays, strict=True) if d], "weight_decay": WEIGHT_DECAY},
        {"params": [p for p, d in zip(fused_params, decays, strict=True) if not d], "weight_decay": 0.0},
    ]
    fused = torch.optim.AdamW(groups, lr=LR, betas=BETAS, eps=EPS, fused=True)
    # A scale of 1 keeps the numbers comparable: the fused kernel divides each gradient in place (one more
    # write of the gradients), so any other scale would shrink the reused gradients step by step.
    fused.grad_scale = torch.tensor(1.0, device=device)  # type: ignore[attr-defined]
    fused.step()  # one step more, so it has made as many (1 + 2 + REPEATS) as each compiled run below
    ms["fused_fp32"] = timed(fused.step)
    del fused, groups
    ms_or_error = fused_with_bf16_gradients(params, grads16, decays)
    if isinstance(ms_or_error, float):
        ms["fused_bf16"] = ms_or_error

    lr = torch.tensor(LR, device=device)
    scale = torch.tensor(1.0, device=device)
    whole = torch.compile(adamw_update, fullgraph=True)
    distances: dict[str, float] = {}
    for name, grads, update in (("compiled_fp32", grads32, whole), ("compiled_bf16", grads16, whole)):
        state = [p.clone() for p in params]
        avgs = [torch.zeros_like(p) for p in params]
        sqs = [torch.zeros_like(p) for p in params]
        step = torch.zeros((), device=device)

        def one_step(
            state: list[torch.Tensor] = state,
            grads: list[torch.Tensor] = grads,
            avgs: list[torch.Tensor] = avgs,
            sqs: list[torch.Tensor] = sqs,
            step: torch.Tensor = step,
            update: Callable[..., None] = update,
        ) -> None:
            step.add_(1)
            update(state, grads, avgs, sqs, decays, lr, step, scale)

        begin = time.perf_counter()
        one_step()
        torch.cuda.synchronize()
        ms[f"{name}_compile_s"] = round(time.perf_counter() - begin, 1)
        ms[name] = timed(one_step, REPEATS)
        distances[name] = max(
            ((a - b.detach()).abs().max() / b.detach().abs().max()).item()
            for a, b in zip(state, fused_params, strict=True)
        )
        del state, avgs, sqs
    for name, grads in (("trainer_bf16", grads16), ("trainer_fp32", grads32)):
        ms[f"{name}_compile_s"], ms[name], distances[name] = trainer_step(params, grads, decays, fused_params)
    bytes_fp32, bytes_bf16 = 28 * count, 26 * count  # read p, g, m, v; write p, m, v
    return {
        "model": model,
        "parameters": count,
        "ms": {k: round(v, 2) for k, v in ms.items()},
        "update_gb_per_s": {
            "fused_fp32": round(bytes_fp32 / ms["fused_fp32"] / 1e6, 0),
            "compiled_fp32": round(bytes_fp32 / ms["compiled_fp32"] / 1e6, 0),
            "compiled_bf16": round(bytes_bf16 / ms["compiled_bf16"] / 1e6, 0),
            "trainer_bf16": round(bytes_bf16 / ms["trainer_bf16"] / 1e6, 0),
            "trainer_fp32": round(bytes_fp32 / ms["trainer_fp32"] / 1e6, 0),
        },
        "note": "distance: after 13 steps on the same gradients each, the largest difference from the fused "
        "kernel's weights per tensor, relative to that tensor's largest weight",
        "max_relative_distance_from_fused": distances,
        "fused_bf16_gradients": ms_or_error,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", choices=sorted(SHAPES), default="3b")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    record = {
        "command": f"python3 benchmarks/optimizer_step.py --model {args.model} --out $OUT",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "card": card(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        **measure(args.model),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"optimizer_step_{args.model}.json"
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
