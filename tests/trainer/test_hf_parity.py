"""The trainer's model is the Hugging Face model: logits equal transformers' for every supported family.

Each case builds a small random model with transformers, saves it (safetensors), loads it through the
trainer's loader and compares float32 logits. The negative cases change one thing the families differ
in (RoPE, norm eps, bias, tying) and show the comparison then fails.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from blackwell_trainer.model.transformer import RMSNorm, rope_tables
from blackwell_trainer.weights.load import load_pretrained
from tests.support.hf_models import (
    ATOL,
    FAMILIES,
    RTOL,
    SEQ,
    architecture_of,
    empty_trainer_model,
    hf_logits,
    save_hf_model,
    tokens,
    trainer_logits,
)

pytest.importorskip(
    "transformers", reason="transformers (the dev extra) is missing: bash scripts/bootstrap.sh --all"
)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_logits_equal_transformers(family: str, tmp_path: Path) -> None:
    reference = save_hf_model(family, tmp_path)
    arch = architecture_of(tmp_path)
    model = empty_trainer_model(arch)
    report = load_pretrained(model, str(tmp_path), arch, SEQ)
    assert report.tensors == len(list(model.parameters()))
    ids = tokens()
    ours, theirs = trainer_logits(model, ids), hf_logits(reference, ids)
    torch.testing.assert_close(ours, theirs, atol=ATOL, rtol=RTOL)


def _plain_rope(model: torch.nn.Module) -> None:
    arch = model.arch  # type: ignore[attr-defined]
    model.rope = rope_tables(arch.resolved_head_dim, SEQ, arch.rope_theta)  # type: ignore[assignment]


def _other_theta(model: torch.nn.Module) -> None:
    arch = model.arch  # type: ignore[attr-defined]
    model.rope = rope_tables(  # type: ignore[assignment]
        arch.resolved_head_dim, SEQ, arch.rope_theta / 2, scaling=arch.rope_scaling
    )


def _other_eps(model: torch.nn.Module) -> None:
    for module in model.modules():
        if isinstance(module, RMSNorm):
            module.eps = 1e-2


def _no_bias(model: torch.nn.Module) -> None:
    for name, param in model.named_parameters():
        if name.endswith("bias"):
            param.data.zero_()


def _untie(model: torch.nn.Module) -> None:
    # A separate output head (what a loader that missed tie_word_embeddings would leave): a fresh one.
    out = torch.nn.Linear(model.arch.hidden_size, model.arch.vocab_size, bias=False)  # type: ignore[attr-defined]
    model.output = out  # type: ignore[assignment]


def _tie(model: torch.nn.Module) -> None:
    model.output = None  # type: ignore[assignment]


@pytest.mark.parametrize(
    ("family", "change"),
    [
        ("llama3.1", _plain_rope),  # RoPE scaling ignored
        ("mistral", _other_theta),  # another RoPE base
        ("qwen2.5", _other_eps),  # another norm epsilon
        ("qwen2.5-tied", _no_bias),  # Q/K/V bias dropped
        ("qwen2.5-tied", _untie),  # tied head not tied
        ("llama3.1", _tie),  # untied head tied
    ],
    ids=["rope-scaling", "rope-theta", "norm-eps", "qkv-bias", "untied", "tied"],
)
def test_a_deliberate_mismatch_fails_the_comparison(family: str, change: object, tmp_path: Path) -> None:
    reference = save_hf_model(family, tmp_path)
    arch = architecture_of(tmp_path)
    model = empty_trainer_model(arch)
    load_pretrained(model, str(tmp_path), arch, SEQ)
    change(model)  # type: ignore[operator]
    ids = tokens()
    with pytest.raises(AssertionError):
        torch.testing.assert_close(
            trainer_logits(model, ids), hf_logits(reference, ids), atol=ATOL, rtol=RTOL
        )
