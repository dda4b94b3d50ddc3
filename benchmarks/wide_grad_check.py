"""``fp32_weight_gradients`` on one GPU: the op of ``model/wide_grad.py`` against ``F.linear`` on a 3B shape.

For each of ``keep`` true and false, eager and compiled: whether the output and the input gradient equal
autograd's cast path bit for bit, and how far each weight gradient is from the float64 product (the
fp32-output GEMM's against the bf16 one's):

    python3 benchmarks/wide_grad_check.py --out $OUT

Writes ``OUT/wide_grad_check.json``.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from blackwell_trainer.model.wide_grad import mixed_mm_available, wide_linear

TOKENS, IN, OUT = 2 * 4096, 3072, 8192  # Llama-3.2-3B's gate projection at batch 2, sequence 4096
Step = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _run(fn: Step, x0: torch.Tensor, w0: torch.Tensor, g0: torch.Tensor) -> tuple[torch.Tensor, ...]:
    x = x0.clone().requires_grad_()
    w = torch.nn.Parameter(w0.clone())
    y = fn(x, w)
    y.backward(g0)
    assert x.grad is not None and w.grad is not None
    return y.detach(), x.grad, w.grad


def _relative(a: torch.Tensor, exact: torch.Tensor) -> float:
    return float((a.double() - exact).abs().max() / exact.abs().max())


def check(device: torch.device) -> dict[str, Any]:
    """Every combination, against autograd's cast of ``F.linear``."""
    generator = torch.Generator(device=device).manual_seed(0)
    x0 = torch.randn(TOKENS, IN, device=device, generator=generator).bfloat16()
    w0 = torch.randn(OUT, IN, device=device, generator=generator) * 0.02
    g0 = torch.randn(TOKENS, OUT, device=device, generator=generator).bfloat16()
    exact = g0.t().double() @ x0.double()
    plain = _run(lambda x, w: F.linear(x, w.to(x.dtype)), x0, w0, g0)
    rows = []
    for keep in (True, False):
        for compiled in (False, True):

            def wide(x: torch.Tensor, w: torch.Tensor, keep: bool = keep) -> torch.Tensor:
                return wide_linear(x, w, keep=keep)

            fn: Step = torch.compile(wide, fullgraph=True) if compiled else wide
            out, grad_x, grad_w = _run(fn, x0, w0, g0)
            rows.append(
                {
                    "keep": keep,
                    "compiled": compiled,
                    "out_equal": bool(torch.equal(out, plain[0])),
                    "grad_x_equal": bool(torch.equal(grad_x, plain[1])),
                    "grad_w_dtype": str(grad_w.dtype),
                    "wide_err": _relative(grad_w, exact),
                    "plain_err": _relative(plain[2], exact),
                }
            )
    return {"available": mixed_mm_available(device), "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    card = torch.cuda.get_device_name(0)
    record = {"torch": torch.__version__, "card": card, **check(torch.device("cuda"))}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "wide_grad_check.json").write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
