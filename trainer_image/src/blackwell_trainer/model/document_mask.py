"""Packed rows: attention that never crosses a document boundary, positions that restart per document.

A packed row holds several documents (conversations) side by side; `documents` [batch, seq] gives each
token's document number within its row (non-decreasing; padding is a document of its own). A token attends
causally to the tokens of its own document only, and its RoPE position counts from its document's first
token, so each document is computed exactly as if it were alone in the row (tests/trainer/test_packing.py
checks this against Hugging Face transformers run on each document separately).

On CUDA the mask is a FlexAttention block mask: whole blocks between two documents are skipped, and the
kernel is compiled (torch.compile), not materialised. Elsewhere (the CPU tests) it is a boolean
[batch, 1, seq, seq] mask for SDPA, which computes the same function exactly.
"""

from __future__ import annotations

from typing import Any, TypeAlias

import torch
import torch.nn.functional as F

# A BlockMask on CUDA (torch.nn.attention.flex_attention), a boolean tensor elsewhere.
DocumentMask: TypeAlias = Any


def document_positions(documents: torch.Tensor) -> torch.Tensor:
    """Each token's position inside its own document: 0 at every document's first token, int64 [b, s]."""
    index = torch.arange(documents.shape[1], device=documents.device).expand_as(documents)
    first = torch.ones_like(documents, dtype=torch.bool)
    first[:, 1:] = documents[:, 1:] != documents[:, :-1]
    start = torch.where(first, index, torch.zeros_like(index)).cummax(dim=1).values
    return index - start


def build_document_mask(documents: torch.Tensor, *, flex: bool | None = None) -> DocumentMask:
    """The causal, same-document attention mask of a packed batch, built once per forward pass.

    `flex` (default: on CUDA) builds a FlexAttention block mask; the tests also build one on the CPU.
    """
    batch, seq = documents.shape
    if not (documents.device.type == "cuda" if flex is None else flex):
        causal = torch.ones(seq, seq, dtype=torch.bool, device=documents.device).tril()
        same = documents.unsqueeze(2) == documents.unsqueeze(1)
        return (causal & same).unsqueeze(1)
    from torch.nn.attention.flex_attention import create_block_mask

    def same_document_causal(b: Any, h: Any, q: Any, k: Any) -> Any:
        return (q >= k) & (documents[b, q] == documents[b, k])

    return create_block_mask(same_document_causal, batch, None, seq, seq, device=documents.device)


_compiled_flex: Any = None


def _flex() -> Any:
    """FlexAttention compiled once (eager FlexAttention materialises the scores; compiled it is fused)."""
    global _compiled_flex
    if _compiled_flex is None:
        from torch.nn.attention.flex_attention import flex_attention

        _compiled_flex = torch.compile(flex_attention, dynamic=False)
    return _compiled_flex


def document_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: DocumentMask) -> torch.Tensor:
    """Attention of q [b, heads, s, d] over k, v [b, kv_heads, s, d] within each token's own document."""
    gqa = k.shape[1] != q.shape[1]
    if isinstance(mask, torch.Tensor):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
    from torch.nn.attention.flex_attention import flex_attention

    if torch.compiler.is_compiling():
        # Inside a compiled block Dynamo traces FlexAttention into the block's graph and fuses it. Going
        # through `_flex()` there would mutate this module's global during tracing, which activation
        # checkpointing's higher-order op refuses ("Unsafe side effect", seen on the H200 with full AC).
        traced: torch.Tensor = flex_attention(q, k, v, block_mask=mask, enable_gqa=gqa)
        return traced
    if q.device.type == "cuda":
        out: torch.Tensor = _flex()(q, k, v, block_mask=mask, enable_gqa=gqa)
        return out

    # Eager FlexAttention (the CPU tests of the block mask): unfused, the same function.
    eager: torch.Tensor = flex_attention(q, k, v, block_mask=mask, enable_gqa=gqa)
    return eager
