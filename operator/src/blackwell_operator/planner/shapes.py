"""Derived shapes of an architecture the memory and time models need (widths, GEMMs, parameter groups)."""

from __future__ import annotations

from dataclasses import dataclass

from blackwell_trainer.plan.config import Architecture


@dataclass(frozen=True)
class Shapes:
    """Widths, per-block GEMM shapes and parameter groups of a Llama-style decoder."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    q_dim: int
    kv_dim: int
    ffn: int
    vocab: int
    tied: bool
    block_params: int
    block_linear_params: int
    root_params: int
    total_params: int
    linears: tuple[tuple[int, int], ...]

    @classmethod
    def of(cls, arch: Architecture) -> Shapes:
        """Compute the shapes of an architecture."""
        h, hd = arch.hidden_size, arch.resolved_head_dim
        q_dim, kv_dim, f = (
            arch.num_attention_heads * hd,
            arch.num_key_value_heads * hd,
            arch.intermediate_size,
        )
        # One block's linears as (K, N): q, k, v, o, gate, up, down.
        linears = ((h, q_dim), (h, kv_dim), (h, kv_dim), (q_dim, h), (h, f), (h, f), (f, h))
        linear_params = sum(k * n for k, n in linears)
        bias = (q_dim + 2 * kv_dim) if arch.attention_bias else 0
        block = linear_params + bias + 2 * h
        total = arch.parameter_count()
        return cls(
            hidden=h,
            layers=arch.num_layers,
            heads=arch.num_attention_heads,
            kv_heads=arch.num_key_value_heads,
            head_dim=hd,
            q_dim=q_dim,
            kv_dim=kv_dim,
            ffn=f,
            vocab=arch.vocab_size,
            tied=arch.tie_word_embeddings,
            block_params=block,
            block_linear_params=linear_params,
            root_params=total - arch.num_layers * block,
            total_params=total,
            linears=linears,
        )

    @property
    def embedding_params(self) -> int:
        """Input embedding table (shared with the head when tied)."""
        return self.vocab * self.hidden

    def model_flops_per_token(self, sequence_length: int) -> float:
        """Training FLOPs per token in the MFU convention of the reference grid (PaLM / torchtitan).

        6 x (non-embedding parameters + the output head) + 12 x layers x query width x sequence.
        """
        dense = self.total_params - (0 if self.tied else self.embedding_params)
        return 6.0 * dense + 12.0 * self.layers * self.q_dim * sequence_length
