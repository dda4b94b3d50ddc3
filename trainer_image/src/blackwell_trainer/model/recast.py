"""Blocks run on bf16 copies of their fp32 weights made before them: freed after forward and cast again in
backward (``call_recast``), or kept with their gradients left in bf16 (``call_cast``).

The single-device path casts each weight at use. Under torch.compile the partitioner then saves the bf16
copy for the backward pass (2 bytes a parameter, every block at once), because it does not know the fp32
parameter is alive anyway. Here the copies are made before the block (one autograd node casts them, and
casts their gradients back to fp32), handed to it with ``functional_call``, and every saved tensor that is
one of them is packed as its fp32 parameter and cast again when the backward pass unpacks it: FSDP2's
reshard-after-forward, without the all-gather. The values are the same casts, so the numerics are too.

``call_cast`` makes the same copies and keeps them for the backward pass as the compiled block would. Its
gradients go back in each parameter's ``grad_dtype``: a weight whose gradient is kept in bf16 (the
``bf16_gradients`` switch) gets the bf16 gradient the matmul produced, without a cast to fp32 and back.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.func import functional_call


class _Cast(torch.autograd.Function):
    """fp32 parameters -> copies in ``dtype``; gradients of the copies -> each parameter's ``grad_dtype``
    (its own dtype unless set: autograd's rule for a cast)."""

    @staticmethod
    def forward(ctx: Any, dtype: torch.dtype, *params: torch.Tensor) -> tuple[torch.Tensor, ...]:
        # grad_dtype: torch 2.10 and later; unset, it is the parameter's dtype.
        ctx.dtypes = [getattr(p, "grad_dtype", None) or p.dtype for p in params]
        return tuple(p.to(dtype) for p in params)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        return (None, *(None if g is None else g.to(d) for g, d in zip(grads, ctx.dtypes, strict=True)))


class _Recast:
    """A saved copy (or a view of one: eager matmuls save the transpose), held as its parameter and the
    view's geometry: cast again when the backward pass needs it."""

    __slots__ = ("dtype", "offset", "param", "size", "stride")

    def __init__(self, param: torch.Tensor, dtype: torch.dtype, view: torch.Tensor) -> None:
        self.param, self.dtype = param, dtype
        self.size, self.stride, self.offset = view.size(), view.stride(), view.storage_offset()

    def tensor(self) -> torch.Tensor:
        return self.param.detach().to(self.dtype).as_strided(self.size, self.stride, self.offset)


def cast_copy(param: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """One parameter's copy in ``dtype`` whose gradient goes back in the parameter's ``grad_dtype``."""
    (copy,) = _Cast.apply(dtype, param)  # type: ignore[no-untyped-call]
    return copy  # type: ignore[no-any-return]


def call_cast(block: nn.Module, dtype: torch.dtype, *args: Any) -> Any:
    """``block(*args)`` on ``dtype`` copies of its matrices (norm scales keep their cast inside the block)."""
    named = [(n, p) for n, p in block.named_parameters() if p.dim() >= 2 and p.dtype != dtype]
    copies = _Cast.apply(dtype, *(p for _, p in named))  # type: ignore[no-untyped-call]
    return functional_call(block, {n: c for (n, _), c in zip(named, copies, strict=True)}, args)


def call_recast(block: nn.Module, dtype: torch.dtype, *args: Any) -> Any:
    """``block(*args)`` on ``dtype`` copies of its floating-point parameters, none kept for backward."""
    named = [(n, p) for n, p in block.named_parameters() if p.is_floating_point() and p.dtype != dtype]
    copies = _Cast.apply(dtype, *(p for _, p in named))  # type: ignore[no-untyped-call]
    # Each copy is its own contiguous storage (``to`` of a contiguous parameter): found by its address.
    by_storage = {c.untyped_storage().data_ptr(): p for c, (_, p) in zip(copies, named, strict=True)}

    def pack(tensor: torch.Tensor) -> Any:
        if tensor.dtype != dtype or tensor.layout != torch.strided:
            return tensor
        param = by_storage.get(tensor.untyped_storage().data_ptr())
        return tensor if param is None else _Recast(param, dtype, tensor)

    def unpack(packed: Any) -> torch.Tensor:
        if isinstance(packed, _Recast):
            return packed.tensor()
        tensor: torch.Tensor = packed
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        return functional_call(block, {n: c for (n, _), c in zip(named, copies, strict=True)}, args)
