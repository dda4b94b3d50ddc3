"""A bf16 matmul over an fp32 weight whose weight gradient its GEMM writes in fp32 (no bf16 copy and cast).

The single-device path keeps fp32 weights and computes in bf16 (transformer.Linear casts at use). Autograd
then gets each weight gradient as a bf16 GEMM output and casts it to fp32 for the parameter: a kernel per
weight that reads 2 bytes a parameter and writes 4, after a GEMM that wrote 2. cuBLAS accumulates in fp32
anyway and can write its result in fp32 (``torch.mm(..., out_dtype=torch.float32)``): 4 bytes written, no
cast kernel, and the gradient is no longer rounded to bf16 on the way (more precise, so not bit-equal).

Both are custom ops, opaque to torch.compile: the partitioner cannot trade what is saved for backward, so
``keep`` decides it. ``keep`` true saves the bf16 copy the forward made (what the compiled block saves by
default); false saves the fp32 parameter, alive anyway, and casts again in backward (what
``recast.call_recast`` does where the copies do not fit).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

WIDE = torch.float32


@torch.library.custom_op("btj::linear_wide_grad", mutates_args=())
def linear_wide_grad(x: torch.Tensor, weight: torch.Tensor, keep: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``F.linear`` of ``x`` with ``weight`` cast to ``x``'s dtype; the output and that copy (``keep``:
    what backward saves, see the module's docstring)."""
    copy = weight.to(x.dtype)
    return F.linear(x, copy), copy


@linear_wide_grad.register_fake
def _linear_wide_grad_fake(
    x: torch.Tensor, weight: torch.Tensor, keep: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    return x.new_empty((*x.shape[:-1], weight.shape[0])), weight.new_empty(weight.shape, dtype=x.dtype)


@torch.library.custom_op("btj::weight_grad_wide", mutates_args=())
def weight_grad_wide(grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``grad``ᵀ @ ``x`` over every token, accumulated and written in fp32: the weight's gradient."""
    rows, inputs = grad.reshape(-1, grad.shape[-1]), x.reshape(-1, x.shape[-1])
    if grad.device.type == "cpu":
        # torch has no mixed-dtype mm on the CPU (the tests): the same products, widened first (exact).
        return torch.mm(rows.t().to(WIDE), inputs.to(WIDE))
    return mixed_mm(rows.t(), inputs)


def mixed_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` of bf16 matrices, written in fp32 by the GEMM (CUDA; pytorch/pytorch#150812)."""
    return torch.mm(a, b, out_dtype=WIDE)


@weight_grad_wide.register_fake
def _weight_grad_wide_fake(grad: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return grad.new_empty((grad.shape[-1], x.shape[-1]), dtype=WIDE)


def _setup_context(ctx: Any, inputs: tuple[torch.Tensor, torch.Tensor, bool], output: Any) -> None:
    x, weight, keep = inputs
    _, copy = output
    ctx.keep = keep
    ctx.save_for_backward(x, copy if keep else weight)


def _backward(ctx: Any, grad: torch.Tensor, _copy_grad: Any) -> tuple[torch.Tensor, torch.Tensor, None]:
    x, saved = ctx.saved_tensors
    copy = saved if ctx.keep else saved.to(grad.dtype)
    return grad @ copy, weight_grad_wide(grad, x), None


linear_wide_grad.register_autograd(_backward, setup_context=_setup_context)


def wide_linear(x: torch.Tensor, weight: torch.Tensor, *, keep: bool) -> torch.Tensor:
    """``F.linear(x, weight.to(x.dtype))`` whose weight gradient comes back in fp32 from its GEMM."""
    out: torch.Tensor = linear_wide_grad(x, weight, keep)[0]
    return out


def mixed_mm_available(device: torch.device) -> str | None:
    """Why this torch cannot write a bf16 GEMM's result in fp32 on ``device``, or None."""
    if device.type != "cuda":
        return None
    a = torch.zeros(16, 16, device=device, dtype=torch.bfloat16)
    try:
        out = mixed_mm(a, a)
    except (RuntimeError, TypeError, NotImplementedError) as err:
        return f"torch {torch.__version__} has no bf16 mm with an fp32 output here ({type(err).__name__})"
    return None if out.dtype == WIDE else f"torch {torch.__version__} returned {out.dtype}"
