"""Small random Hugging Face models of each supported family, saved with save_pretrained (the references)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from blackwell_trainer.model.transformer import Transformer, build_model
from blackwell_trainer.plan.config import Architecture, architecture_from_hf_config

# Sequence length of the comparisons; the Llama 3.1 case scales RoPE from an original context of 64.
SEQ = 48
# Logits compared in float32 on both sides differ by summation order only (measured ~1e-6).
ATOL = RTOL = 2e-5
COMMON: dict[str, Any] = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 256,
}
FAMILIES: dict[str, dict[str, Any]] = {
    # Llama 3.1: "llama3" RoPE scaling, untied head, eps 1e-5.
    "llama3.1": {
        "model_type": "llama",
        "rope_theta": 500000.0,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 256,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    },
    # Llama 3.2 1B/3B: tied embeddings (and the same RoPE scaling, factor 32).
    "llama3.2-tied": {
        "model_type": "llama",
        "rope_theta": 500000.0,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True,
        "max_position_embeddings": 256,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    },
    # Qwen2.5 0.5B-3B: Q/K/V bias, tied embeddings, theta 1e6, eps 1e-6, sliding window off.
    "qwen2.5-tied": {
        "model_type": "qwen2",
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
        "use_sliding_window": False,
        "sliding_window": 32,  # ignored by Qwen2 while use_sliding_window is false
    },
    # Qwen2.5 7B and up: Q/K/V bias, untied head.
    "qwen2.5": {"model_type": "qwen2", "rope_theta": 1000000.0, "rms_norm_eps": 1e-6},
    # Mistral v0.1: a 4096-token sliding window (longer than the sequence), an explicit head_dim.
    "mistral": {
        "model_type": "mistral",
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-5,
        "sliding_window": 4096,
        "head_dim": 32,
    },
}


def hf_config(family: str, **changes: Any) -> Any:
    """The transformers config object of a family (float32)."""
    from transformers import AutoConfig

    values = {**COMMON, **FAMILIES[family], **changes}
    model_type = values.pop("model_type")
    return AutoConfig.for_model(model_type, **values)


def save_hf_model(family: str, folder: Path, *, seed: int = 0, **changes: Any) -> nn.Module:
    """A random float32 model of `family`, every weight perturbed (norm scales and biases too, which
    transformers initialises to ones and zeros), saved with save_pretrained. Returns it, in eval mode."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    config = hf_config(family, **changes)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(1.0 + 0.2 * torch.randn_like(param))
            elif name.endswith("bias"):
                param.copy_(0.5 * torch.randn_like(param))
            else:
                param.copy_(0.08 * torch.randn_like(param))
    model.save_pretrained(folder)
    return model.eval()


def architecture_of(folder: Path) -> Architecture:
    """The trainer's Architecture from a saved model's config.json."""
    import json

    return architecture_from_hf_config(json.loads((folder / "config.json").read_text()), sequence_length=SEQ)


def empty_trainer_model(arch: Architecture, seq: int = SEQ) -> Transformer:
    """The trainer's model on the CPU in float32, randomly initialised (what parallelize leaves)."""
    model = build_model(arch, max_seq_len=seq, loss_chunk_tokens=0)
    model.to_empty(device="cpu")
    torch.manual_seed(1)
    model.init_weights(buffer_device=torch.device("cpu"))
    return model.eval()


@torch.no_grad()
def trainer_logits(model: Transformer, tokens: torch.Tensor) -> torch.Tensor:
    """[batch, seq, vocab] float32 logits of the trainer's model."""
    hidden = model(tokens)
    out: torch.Tensor = hidden @ model.output_weight().T
    return out


@torch.no_grad()
def hf_logits(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    out: torch.Tensor = model(input_ids=tokens).logits
    return out


def tokens(batch: int = 2, seq: int = SEQ, vocab: int = 256, seed: int = 3) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(seed))
