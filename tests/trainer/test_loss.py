"""Chunked linear cross-entropy equals plain cross-entropy: values and gradients, any chunking."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from blackwell_trainer.model.loss import IGNORE_INDEX, chunked_cross_entropy
from blackwell_trainer.model.transformer import build_model
from blackwell_trainer.plan.config import Architecture


def _reference(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(hidden @ weight.t(), labels, ignore_index=IGNORE_INDEX)


def _inputs(n: int = 50, h: int = 12, v: int = 40, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(v, h, generator=g, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, v, (n,), generator=g)
    labels[::6] = IGNORE_INDEX
    return hidden, weight, labels


@pytest.mark.parametrize("chunk", [1, 7, 16, 50, 1000])
def test_chunked_matches_plain_values_and_grads(chunk: int) -> None:
    hidden, weight, labels = _inputs()
    ref = _reference(hidden, weight, labels)
    ref_grads = torch.autograd.grad(ref, (hidden, weight))
    got = chunked_cross_entropy(hidden, weight, labels, chunk)
    got_grads = torch.autograd.grad(got, (hidden, weight))
    torch.testing.assert_close(got, ref, rtol=1e-12, atol=1e-12)
    for g, r in zip(got_grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-12)


def test_upstream_gradient_scales_the_stored_gradients() -> None:
    hidden, weight, labels = _inputs(seed=1)
    (gh_ref,) = torch.autograd.grad(_reference(hidden, weight, labels) * 0.25, (hidden,))
    (gh,) = torch.autograd.grad(chunked_cross_entropy(hidden, weight, labels, 8) * 0.25, (hidden,))
    torch.testing.assert_close(gh, gh_ref)


def test_zero_chunk_is_the_plain_loss_and_matches() -> None:
    hidden, weight, labels = _inputs(seed=2)
    torch.testing.assert_close(
        chunked_cross_entropy(hidden.float(), weight.float(), labels, 0),
        _reference(hidden.float(), weight.float(), labels),
    )


def test_all_ignored_labels_give_zero_loss_and_zero_grads_not_nan() -> None:
    hidden, weight, labels = _inputs(seed=3)
    labels[:] = IGNORE_INDEX
    loss = chunked_cross_entropy(hidden, weight, labels, 7)
    gh, gw = torch.autograd.grad(loss, (hidden, weight))
    assert loss.item() == 0.0
    assert not gh.isnan().any() and gh.abs().max() == 0 and gw.abs().max() == 0


def test_model_with_chunked_loss_matches_full_logits_including_tied_embedding_grads() -> None:
    arch = Architecture(
        hidden_size=64, num_layers=1, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=96, vocab_size=50, tie_word_embeddings=True,
    )  # fmt: skip
    grads = []
    tokens = torch.randint(0, 50, (2, 12))
    for chunk in (0, 5):
        model = build_model(arch, max_seq_len=12, loss_chunk_tokens=chunk).to(torch.float64)
        model.to_empty(device="cpu")
        torch.manual_seed(0)
        model.init_weights()
        model.rope = model.rope.double()
        model(tokens, tokens).backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=1e-9, atol=1e-12, msg=name)
