"""Single-device Llama-style decoder (RMSNorm, RoPE, GQA via SDPA, SwiGLU) built from an `Architecture`.

Numerically the Hugging Face Llama 3.x, Qwen2.5 and Mistral decoders (tests/trainer/test_hf_parity.py).

The model knows nothing about distribution: parallelize.py wraps, compiles, converts and shards it.
It is built on the meta device and gets real storage later (``to_empty``), so ``init_weights()`` is
explicit and also rebuilds the non-persistent RoPE tables.
"""

from __future__ import annotations

import math
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from blackwell_trainer.model.document_mask import (
    DocumentMask,
    build_document_mask,
    document_attention,
    document_positions,
)
from blackwell_trainer.model.loss import LossFn, chunked_cross_entropy
from blackwell_trainer.model.recast import call_cast, call_recast, cast_copy
from blackwell_trainer.model.wide_grad import wide_linear
from blackwell_trainer.plan.config import Architecture, RopeScaling


class RMSNorm(nn.Module):
    """Root-mean-square layer norm with a learned scale (no bias, no mean subtraction)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # fp32 weights (the single-device path) are cast to the activations' dtype; a no-op under FSDP2.
        return F.rms_norm(x, (x.shape[-1],), self.weight.to(x.dtype), self.eps)

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)


def llama3_scaled(inv_freq: torch.Tensor, scaling: RopeScaling) -> torch.Tensor:
    """Llama 3.1's RoPE frequency rule (Hugging Face rope_type "llama3").

    Frequencies whose wavelength exceeds original_context / low_freq_factor are divided by `factor`
    (they must stretch to the longer context), those shorter than original_context / high_freq_factor
    are kept (they resolve local order), and the band between blends the two linearly in
    original_context / wavelength.
    """
    original = scaling.original_max_position_embeddings
    wavelength = 2 * math.pi / inv_freq
    low_wavelength = original / scaling.low_freq_factor
    high_wavelength = original / scaling.high_freq_factor
    scaled = torch.where(wavelength > low_wavelength, inv_freq / scaling.factor, inv_freq)
    blend = (original / wavelength - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    blended = (1 - blend) * scaled / scaling.factor + blend * scaled
    in_band = (wavelength >= high_wavelength) & (wavelength <= low_wavelength)
    return torch.where(in_band, blended, scaled)


def rope_tables(
    head_dim: int,
    max_len: int,
    theta: float,
    device: torch.device | None = None,
    scaling: RopeScaling | None = None,
) -> torch.Tensor:
    """cos and sin of the rotary angles, stacked as [2, max_len, head_dim] in fp32 (rotate-half layout)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim))
    if scaling is not None:
        inv_freq = llama3_scaled(inv_freq, scaling)
    t = torch.arange(max_len, dtype=torch.float32, device=device)
    angles = torch.outer(t, inv_freq)
    angles = torch.cat((angles, angles), dim=-1)
    return torch.stack((angles.cos(), angles.sin()))


def apply_rope(x: torch.Tensor, rope: torch.Tensor) -> torch.Tensor:
    """Rotate [batch, heads, seq, head_dim] by the first `seq` rows of the tables [2, rows, head_dim], or
    by per-row tables [2, batch, seq, head_dim] (packed documents, each with its own positions)."""
    if rope.dim() == 4:
        cos, sin = rope[0].unsqueeze(1).to(x.dtype), rope[1].unsqueeze(1).to(x.dtype)
    else:
        seq = x.shape[-2]
        cos = rope[0, :seq].to(x.dtype)
        sin = rope[1, :seq].to(x.dtype)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class Linear(nn.Linear):
    """nn.Linear whose weights are cast to the input's dtype at use (no-op when they match).

    The single-device path (parallelize.py) keeps fp32 weights in the module and computes in bf16, as
    FSDP2's mixed precision does: bf16 copies in the matmul, bf16 gradients cast back to fp32 by autograd.
    Under torch.compile the cast is part of the block's graph.
    """

    # Set by parallelize.apply_fp32_weight_gradients: None, autograd's cast of the bf16 weight gradient;
    # else the weight gradient comes from its GEMM in fp32 (wide_grad.py), and this says whether the bf16
    # copy is kept for backward (true) or the fp32 parameter is cast again there.
    wide_keep: bool | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.wide_keep is not None and self.bias is None and self.weight.dtype != x.dtype:
            return wide_linear(x, self.weight, keep=self.wide_keep)
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return F.linear(x, self.weight.to(x.dtype), bias)


def fused_linear(x: torch.Tensor, linears: tuple[nn.Linear, ...]) -> tuple[torch.Tensor, ...]:
    """The Linears that read the same input as ONE matmul over their concatenated weights, split after.

    Used where each weight is cast at use anyway (the single-device path under torch.compile): the cast and
    the concatenation are then one copy, and one larger GEMM replaces two or three (Q, K, V; gate and up).
    The same products; only the GEMM's blocking may round differently in the last bit.
    """
    weight = torch.cat([lin.weight.to(x.dtype) for lin in linears])
    biases = [lin.bias for lin in linears]
    bias = None if any(b is None for b in biases) else torch.cat([b.to(x.dtype) for b in biases])
    out = F.linear(x, weight, bias)
    return tuple(torch.split(out, [lin.out_features for lin in linears], dim=-1))


def can_fuse(*linears: nn.Module) -> bool:
    """Only this module's own Linear (not a float8 or TE replacement, whose scaling is per weight)."""
    return all(type(lin) is Linear for lin in linears)


class AttentionFn(Protocol):
    """q [b, heads, s, d], k and v [b, kv_heads, s, d], RoPE applied -> causal attention [b, heads, s, d]."""

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor: ...


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The whole sequence on this device: one SDPA call (context parallelism swaps in its own)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=k.shape[1] != q.shape[1])


# SDPA kernels in the order each attention backend tries them (tuning.ATTENTION_BACKENDS; "default" is
# torch's own order). Math last, so CPU runs (tests) and shapes the fused kernels refuse still work.
_SDPA_ORDER: dict[str, tuple[SDPBackend, ...]] = {
    "cudnn": (SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
              SDPBackend.MATH),
    "flash": (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH),
}  # fmt: skip


def ordered_attention(backend: str) -> AttentionFn:
    """``causal_attention`` with SDPA's kernels tried in ``backend``'s order (torch's own for "default").

    The order is set inside the call, so a compiled block traces it (torchtitan does the same for cuDNN).
    """
    if backend == "default":
        return causal_attention
    order = list(_SDPA_ORDER[backend])

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        with sdpa_kernel(order, set_priority=True):
            return causal_attention(q, k, v)

    return attend


class Attention(nn.Module):
    """Grouped-query causal self-attention through SDPA (flash / cuDNN kernels on GPU)."""

    def __init__(self, arch: Architecture) -> None:
        super().__init__()
        h, d = arch.hidden_size, arch.resolved_head_dim
        self.n_heads = arch.num_attention_heads
        self.n_kv_heads = arch.num_key_value_heads
        self.head_dim = d
        self.wq = Linear(h, self.n_heads * d, bias=arch.attention_bias)
        self.wk = Linear(h, self.n_kv_heads * d, bias=arch.attention_bias)
        self.wv = Linear(h, self.n_kv_heads * d, bias=arch.attention_bias)
        self.wo = Linear(self.n_heads * d, h, bias=False)
        self.attend: AttentionFn = causal_attention
        self.fuse = False  # Q, K and V as one matmul (fused_linear; parallelize.py sets it)

    def forward(self, x: torch.Tensor, rope: torch.Tensor, documents: DocumentMask = None) -> torch.Tensor:
        bsz, seq, _ = x.shape
        if self.fuse:
            q, k, v = fused_linear(x, (self.wq, self.wk, self.wv))
        else:
            q, k, v = self.wq(x), self.wk(x), self.wv(x)
        q = q.view(bsz, seq, self.n_heads, self.head_dim).transpose(1, 2)
        k = k.view(bsz, seq, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(bsz, seq, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, rope), apply_rope(k, rope)
        out = self.attend(q, k, v) if documents is None else document_attention(q, k, v, documents)
        projected: torch.Tensor = self.wo(out.transpose(1, 2).reshape(bsz, seq, self.n_heads * self.head_dim))
        return projected


class FeedForward(nn.Module):
    """SwiGLU MLP: w2(silu(w1 x) * w3 x)."""

    def __init__(self, arch: Architecture) -> None:
        super().__init__()
        self.w1 = Linear(arch.hidden_size, arch.intermediate_size, bias=False)
        self.w3 = Linear(arch.hidden_size, arch.intermediate_size, bias=False)
        self.w2 = Linear(arch.intermediate_size, arch.hidden_size, bias=False)
        self.fuse = False  # gate and up as one matmul (fused_linear; parallelize.py sets it)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = fused_linear(x, (self.w1, self.w3)) if self.fuse else (self.w1(x), self.w3(x))
        out: torch.Tensor = self.w2(F.silu(gate) * up)
        return out


class TransformerBlock(nn.Module):
    """Pre-norm residual block: x + attn(norm(x)), then + mlp(norm(x))."""

    def __init__(self, arch: Architecture) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(arch.hidden_size, arch.norm_eps)
        self.attention = Attention(arch)
        self.ffn_norm = RMSNorm(arch.hidden_size, arch.norm_eps)
        self.feed_forward = FeedForward(arch)

    def forward(self, x: torch.Tensor, rope: torch.Tensor, documents: DocumentMask = None) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), rope, documents)
        out: torch.Tensor = x + self.feed_forward(self.ffn_norm(x))
        return out


class Transformer(nn.Module):
    """The decoder: ``forward(tokens, labels)`` is the mean token loss; without labels, the final states.

    The loss lives inside ``forward`` so the output head's weight is used while FSDP holds it unsharded,
    and so a chunked loss never needs the full logits tensor.
    """

    def __init__(self, arch: Architecture, *, max_seq_len: int, loss_chunk_tokens: int = 8192) -> None:
        super().__init__()
        self.arch = arch
        self.max_seq_len = max_seq_len
        self.loss_chunk_tokens = loss_chunk_tokens
        self.tok_embeddings = nn.Embedding(arch.vocab_size, arch.hidden_size)
        # A ModuleDict keyed by layer index keeps FQNs stable ("layers.3.attention.wq.weight") and lets
        # parallelize.py replace a block with its wrapped / compiled form in place.
        self.layers = nn.ModuleDict({str(i): TransformerBlock(arch) for i in range(arch.num_layers)})
        self.norm = RMSNorm(arch.hidden_size, arch.norm_eps)
        self.output: nn.Linear | None = (
            None if arch.tie_word_embeddings else Linear(arch.hidden_size, arch.vocab_size, bias=False)
        )
        # The dtype the model computes in when its parameters are fp32 (the single-device path sets
        # bf16 on GPUs); None: the parameters' own dtype (FSDP2 hands the blocks bf16 copies itself).
        self.compute_dtype: torch.dtype | None = None
        # Run each block through recast.call_recast (its bf16 copies freed after forward; tuning.py).
        self.recast_blocks = False
        # Run each block through recast.call_cast: its matrices cast before it, so that their gradients
        # can stay in bf16 (tuning.py's bf16_gradients; parallelize.apply_bf16_gradients sets it).
        self.cast_blocks = False
        self.rope: torch.Tensor
        self.register_buffer("rope", torch.empty(2, max_seq_len, arch.resolved_head_dim), persistent=False)
        self.loss_fn: LossFn = chunked_cross_entropy

    def output_weight(self) -> torch.Tensor:
        """The [vocab, hidden] matrix of the output projection (the embedding when tied)."""
        return self.tok_embeddings.weight if self.output is None else self.output.weight

    def output_copy(self, dtype: torch.dtype) -> torch.Tensor:
        """The untied output projection in ``dtype``: its gradient goes back in its ``grad_dtype``."""
        assert self.output is not None
        weight = self.output.weight
        return weight if weight.dtype == dtype else cast_copy(weight, dtype)

    def embedding_weight(self) -> torch.Tensor:
        """The embedding table in the compute dtype (cast from fp32 in the single-device path).

        The lookup then runs in the compute dtype, so its gradient is a bf16 table cast to fp32, as FSDP2's
        mixed precision gives; a tied output projection uses this same cast (one bf16 copy, one sum).
        """
        weight = self.tok_embeddings.weight
        return weight if self.compute_dtype is None else cast_copy(weight, self.compute_dtype)

    def hidden_states(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor | None = None,
        documents: torch.Tensor | None = None,
        embedding: torch.Tensor | None = None,
    ) -> torch.Tensor:
        h = F.embedding(tokens, self.embedding_weight() if embedding is None else embedding)
        # ``positions``: the global position of each token when this device holds only parts of the
        # sequences (context parallelism); the blocks then get exactly those rows of the RoPE tables.
        # ``documents``: packed rows (document_mask.py); positions restart at each document's start.
        mask: DocumentMask = None
        if documents is not None:
            positions = document_positions(documents)
            mask = build_document_mask(documents)
        rope: torch.Tensor = self.rope if positions is None else self.rope[:, positions]
        extra = () if mask is None else (mask,)
        for block in self.layers.values():
            if self.recast_blocks and self.compute_dtype is not None:
                h = call_recast(block, self.compute_dtype, h, rope, *extra)
            elif self.cast_blocks and self.compute_dtype is not None:
                h = call_cast(block, self.compute_dtype, h, rope, *extra)
            else:
                h = block(h, rope, *extra)
        out: torch.Tensor = self.norm(h)
        return out

    def forward(
        self,
        tokens: torch.Tensor,
        labels: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        documents: torch.Tensor | None = None,
    ) -> torch.Tensor:
        embedding = self.embedding_weight()
        h = self.hidden_states(tokens, positions, documents, embedding)
        if labels is None:
            return h
        head = embedding if self.output is None else self.output_copy(h.dtype)
        return self.loss_fn(h.reshape(-1, h.shape[-1]), head, labels.reshape(-1), self.loss_chunk_tokens)

    @torch.no_grad()
    def init_weights(self, buffer_device: torch.device | None = None) -> None:
        """Initialise every parameter (also DTensor shards) and rebuild the RoPE tables.

        Normal(0, 0.02) for embeddings and input projections; output projections of each block scaled by
        1/sqrt(2 * layers) (GPT-2 / torchtitan style) so the residual stream does not grow with depth.
        """
        std = 0.02
        out_std = std / math.sqrt(2 * self.arch.num_layers)
        nn.init.normal_(self.tok_embeddings.weight, mean=0.0, std=std)
        for block in self.layers.values():
            for name, module in block.named_modules():
                if isinstance(module, RMSNorm):
                    module.reset_parameters()
                    continue
                weight = getattr(module, "weight", None)
                if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
                    continue
                is_out = name.endswith("wo") or name.endswith("w2")
                nn.init.trunc_normal_(weight, mean=0.0, std=out_std if is_out else std, a=-3 * std, b=3 * std)
                bias = getattr(module, "bias", None)
                if isinstance(bias, torch.Tensor):
                    nn.init.zeros_(bias)
        self.norm.reset_parameters()
        if self.output is not None:
            nn.init.trunc_normal_(self.output.weight, mean=0.0, std=std, a=-3 * std, b=3 * std)
        device = buffer_device if buffer_device is not None else self.rope.device
        self.rope = rope_tables(
            self.arch.resolved_head_dim,
            self.max_seq_len,
            self.arch.rope_theta,
            device,
            scaling=self.arch.rope_scaling,
        )


def build_model(
    arch: Architecture,
    *,
    max_seq_len: int,
    loss_chunk_tokens: int = 8192,
    device: str | torch.device = "meta",
) -> Transformer:
    """Construct the model (on the meta device by default: no memory, no init)."""
    with torch.device(device):
        return Transformer(arch, max_seq_len=max_seq_len, loss_chunk_tokens=loss_chunk_tokens)


def flops_per_token(arch: Architecture, seq_len: int) -> float:
    """Training FLOPs per token: 6 * (non-embedding params + output head) + 12 * L * h * s (attention).

    The output head counts whether tied or not (it is a matmul either way); the input embedding lookup
    does not. Same convention as the H200 reference grid.
    """
    head = 0 if arch.tie_word_embeddings else arch.vocab_size * arch.hidden_size
    # parameter_count() holds the embedding once plus an untied head: drop the head so it counts once.
    matmul_params = arch.parameter_count() - head
    return 6.0 * matmul_params + 12.0 * arch.num_layers * arch.hidden_size * seq_len
