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


class ChunkedLinearCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy of ``hidden @ weight.T`` against ``labels``, chunk by chunk (module docstring)."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, chunk_tokens: int
    ) -> torch.Tensor:
        n_tokens = hidden.shape[0]
        valid = labels != IGNORE_INDEX
        # A tensor, not a Python float: no host sync in the step.
        scale = 1.0 / valid.sum().clamp(min=1).to(torch.float32)
        needs_grad = hidden.requires_grad or weight.requires_grad
        grad_hidden = torch.empty_like(hidden) if needs_grad else None
        # fp32 accumulation across chunks; cast to the weight's dtype once at the end.
        grad_weight = (
            torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if needs_grad else None
        )
        loss_sum = torch.zeros((), dtype=torch.float32, device=hidden.device)
        for start in range(0, n_tokens, chunk_tokens):
            end = min(start + chunk_tokens, n_tokens)
            h = hidden[start:end]
            ok = valid[start:end]
            tgt = torch.where(ok, labels[start:end], torch.zeros_like(labels[start:end])).unsqueeze(1)
            logits = (h @ weight.t()).float()
            lse = torch.logsumexp(logits, dim=-1)
            loss_sum += ((lse - logits.gather(1, tgt).squeeze(1)) * ok).sum()
            if grad_hidden is None or grad_weight is None:
                continue
            # d loss / d logits = (softmax - onehot) * scale on valid rows, 0 on ignored rows; in place.
            probs = logits.sub_(lse.unsqueeze(1)).exp_()
            probs.scatter_add_(1, tgt, torch.full_like(tgt, -1, dtype=probs.dtype))
            probs.mul_((ok.to(probs.dtype) * scale).unsqueeze(1))
            dlogits = probs.to(hidden.dtype)
            del probs, logits
            grad_hidden[start:end] = dlogits @ weight
            grad_weight += (dlogits.t() @ h).float()
            del dlogits
        ctx.save_for_backward(grad_hidden, grad_weight.to(weight.dtype) if grad_weight is not None else None)
        return loss_sum * scale

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        grad_hidden, grad_weight = ctx.saved_tensors
        gh = grad_hidden * grad_out.to(grad_hidden.dtype) if ctx.needs_input_grad[0] else None
        gw = grad_weight * grad_out.to(grad_weight.dtype) if ctx.needs_input_grad[1] else None
        return gh, gw, None, None


def plain_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Full fp32 logits, then F.cross_entropy: the reference the chunked version must match."""
    logits = (hidden @ weight.t()).float()
    return F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX)


def chunked_cross_entropy(
    hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, chunk_tokens: int
) -> torch.Tensor:
    """Mean token cross-entropy; ``chunk_tokens == 0`` computes the plain full-logits version."""
    if chunk_tokens <= 0:
        return plain_cross_entropy(hidden, weight, labels)
    out: torch.Tensor = ChunkedLinearCrossEntropy.apply(hidden, weight, labels, chunk_tokens)  # type: ignore[no-untyped-call]
    return out
