"""Cross-entropy over the output projection that never materialises the full fp32 logits.

With a 128K vocabulary the logits of one micro-batch are huge (mbs 4 x 4096 tokens x 128,256 x 4 bytes
= 8 GiB in fp32, plus the same again for their gradient). ``ChunkedLinearCrossEntropy`` walks the
tokens in chunks: for each chunk it computes the logits, the loss, and at once the gradients with
respect to the hidden states and the output weight, then drops the chunk's logits. The backward pass
only scales the stored gradients, so peak memory holds one chunk of logits instead of all of them, and
no logits are recomputed (the FLOPs equal the plain version's).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100


class LossFn(Protocol):
    """hidden [N, h], weight [V, h], labels [N], chunk tokens -> mean loss over non-ignored labels."""

    def __call__(
        self, hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, chunk_tokens: int
    ) -> torch.Tensor: ...


def _chunk_loss_and_grad(
    logits: torch.Tensor, target: torch.Tensor, valid: torch.Tensor, scale: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed loss of one chunk and d(mean loss)/d(logits) in the logits' dtype.

    Written as plain tensor algebra (no in-place ops) so that torch.compile fuses it into a couple of
    kernels that read the bf16 logits once and write the bf16 gradient once; fp32 inside.
    """
    lf = logits.to(torch.promote_types(logits.dtype, torch.float32))
    lse = torch.logsumexp(lf, dim=-1, keepdim=True)
    target_logit = lf.gather(1, target.unsqueeze(1))
    loss = ((lse - target_logit).squeeze(1) * valid).sum()
    onehot = torch.arange(lf.shape[1], device=lf.device).unsqueeze(0) == target.unsqueeze(1)
    grad = (torch.exp(lf - lse) - onehot.to(lf.dtype)) * (valid.to(lf.dtype) * scale).unsqueeze(1)
    return loss, grad.to(logits.dtype)


_compiled_chunk: Any = None


def _chunk_fn(device: torch.device) -> Any:
    """The compiled chunk kernel on CUDA (compiled once, lazily); eager elsewhere (CPU tests)."""
    global _compiled_chunk
    if device.type != "cuda":
        return _chunk_loss_and_grad
    if _compiled_chunk is None:
        _compiled_chunk = torch.compile(_chunk_loss_and_grad, dynamic=False)
    return _compiled_chunk


class ChunkedLinearCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of ``hidden @ weight.T`` against ``labels``, chunk by chunk (module docstring)."""

    @staticmethod
    def forward(
        ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, chunk_tokens: int
    ) -> torch.Tensor:
        n_tokens = hidden.shape[0]
        valid = labels != IGNORE_INDEX
        # A tensor, not a Python float: no host sync in the step.
        acc_dtype = torch.promote_types(hidden.dtype, torch.float32)
        scale = 1.0 / valid.sum().clamp(min=1).to(acc_dtype)
        chunk_fn = _chunk_fn(hidden.device)
        grad_hidden = torch.empty_like(hidden)
        # Accumulated with addmm in the weight's dtype (bf16 under FSDP, like every other gradient there):
        # no fp32 V x h buffer, no extra casts; cuBLAS accumulates each product in fp32.
        grad_weight = torch.empty_like(weight)
        loss_sum = torch.zeros((), dtype=acc_dtype, device=hidden.device)
        for start in range(0, n_tokens, chunk_tokens):
            end = min(start + chunk_tokens, n_tokens)
            h = hidden[start:end]
            ok = valid[start:end]
            target = torch.where(ok, labels[start:end], torch.zeros_like(labels[start:end]))
            logits = h @ weight.t()
            loss, dlogits = chunk_fn(logits, target, ok, scale)
            del logits
            loss_sum += loss
            torch.mm(dlogits, weight, out=grad_hidden[start:end])
            if start == 0:
                torch.mm(dlogits.t(), h, out=grad_weight)
            else:
                grad_weight.addmm_(dlogits.t(), h)
            del dlogits
        ctx.save_for_backward(grad_hidden, grad_weight)
        return loss_sum * scale

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        grad_hidden, grad_weight = ctx.saved_tensors
        gh = grad_hidden * grad_out.to(grad_hidden.dtype) if ctx.needs_input_grad[0] else None
        gw = grad_weight * grad_out.to(grad_weight.dtype) if ctx.needs_input_grad[1] else None
        return gh, gw, None, None


def plain_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Full fp32 logits, then F.cross_entropy: the reference the chunked version must match.

    Summed, then divided by the number of trained labels (at least 1), as the chunked version does: a
    micro-batch whose labels are all ignored (a packed chat row of user text only) has loss 0, not NaN.
    """
    logits = hidden @ weight.t()
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    total = F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX, reduction="sum")
    return total / (labels != IGNORE_INDEX).sum().clamp(min=1).to(total.dtype)


def chunked_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, chunk_tokens: int
) -> torch.Tensor:
    """Mean token cross-entropy; ``chunk_tokens == 0`` computes the plain full-logits version."""
    if chunk_tokens <= 0:
        return plain_cross_entropy(hidden, weight, labels)
    out: torch.Tensor = ChunkedLinearCrossEntropy.apply(hidden, weight, labels, chunk_tokens)  # type: ignore[no-untyped-call]
    return out
