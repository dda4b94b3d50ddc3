"""The single-device decoder: exact parameter count, meta-device build, causal attention, FLOPs formula."""

from __future__ import annotations

import math

import pytest
import torch

from blackwell_trainer.model.transformer import apply_rope, build_model, flops_per_token, rope_tables
from blackwell_trainer.plan.config import Architecture

TINY = dict(
    hidden_size=64,
    num_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=128,
    vocab_size=96,
)


def _cpu_model(arch: Architecture, seq: int = 16, chunk: int = 0, seed: int = 0) -> torch.nn.Module:
    model = build_model(arch, max_seq_len=seq, loss_chunk_tokens=chunk)
    model.to_empty(device="cpu")
    torch.manual_seed(seed)
    model.init_weights()
    return model


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"tie_word_embeddings": True},
        {"attention_bias": True},
        {"num_key_value_heads": 4},
        {"head_dim": 32},
    ],
    ids=["untied", "tied", "qkv-bias", "mha", "explicit-head-dim"],
)
def test_parameter_count_equals_the_architecture_count(overrides: dict[str, object]) -> None:
    arch = Architecture(**{**TINY, **overrides})
    model = build_model(arch, max_seq_len=16)
    assert all(p.is_meta for p in model.parameters())
    assert sum(p.numel() for p in model.parameters()) == arch.parameter_count()


def test_llama_3_1_8b_shape_builds_on_meta_with_the_exact_count() -> None:
    arch = Architecture(
        hidden_size=4096, num_layers=32, num_attention_heads=32, num_key_value_heads=8,
        intermediate_size=14336, vocab_size=128256,
    )  # fmt: skip
    model = build_model(arch, max_seq_len=4096)
    assert sum(p.numel() for p in model.parameters()) == arch.parameter_count() == 8_030_261_248
    assert list(model.layers.keys())[:2] == ["0", "1"]


def test_initial_loss_is_near_log_vocab_and_finite() -> None:
    arch = Architecture(**TINY)
    model = _cpu_model(arch)
    tokens = torch.randint(0, arch.vocab_size, (2, 16))
    loss = model(tokens, tokens)
    assert math.isfinite(loss.item())
    assert abs(loss.item() - math.log(arch.vocab_size)) < 0.5
    assert model(tokens).shape == (2, 16, arch.hidden_size)


def test_attention_is_causal() -> None:
    arch = Architecture(**TINY)
    model = _cpu_model(arch)
    tokens = torch.randint(0, arch.vocab_size, (1, 16))
    changed = tokens.clone()
    changed[0, 10:] = (changed[0, 10:] + 1) % arch.vocab_size
    with torch.no_grad():
        a, b = model(tokens), model(changed)
    torch.testing.assert_close(a[:, :10], b[:, :10])
    assert not torch.allclose(a[:, 10:], b[:, 10:])


def test_tied_model_uses_the_embedding_as_output_head() -> None:
    arch = Architecture(**{**TINY, "tie_word_embeddings": True})
    model = _cpu_model(arch)
    assert model.output is None
    assert model.output_weight() is model.tok_embeddings.weight


def test_rope_is_identity_at_position_zero_and_preserves_norm() -> None:
    rope = rope_tables(head_dim=8, max_len=5, theta=10000.0)
    x = torch.randn(1, 2, 5, 8)
    y = apply_rope(x, rope)
    torch.testing.assert_close(y[..., 0, :], x[..., 0, :])
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))


def test_init_weights_rebuilds_rope_tables_after_to_empty() -> None:
    arch = Architecture(**TINY)
    model = _cpu_model(arch)
    torch.testing.assert_close(model.rope, rope_tables(arch.resolved_head_dim, 16, arch.rope_theta))


def test_flops_per_token_follows_the_reference_formula() -> None:
    arch = Architecture(
        hidden_size=4096, num_layers=32, num_attention_heads=32, num_key_value_heads=8,
        intermediate_size=14336, vocab_size=128256,
    )  # fmt: skip
    embed = arch.vocab_size * arch.hidden_size
    non_embedding = arch.parameter_count() - 2 * embed
    expected = 6 * (non_embedding + embed) + 12 * 32 * 4096 * 4096
    assert flops_per_token(arch, 4096) == pytest.approx(expected)
