"""A preset is the model its name says: the trainer accepts the published checkpoint for a preset plan.

The trainer refuses weights whose config.json differs from the plan's architecture in any field (RoPE
scaling included), so a preset that left a field out would refuse its own model's checkpoint. The dicts
below are the architecture keys of each model's config.json as published on the Hugging Face Hub.
"""

from __future__ import annotations

from typing import Any

import pytest

from blackwell_operator.catalogs import get_preset
from blackwell_trainer.plan.config import architecture_from_hf_config, architecture_mismatch

LLAMA3_SCALING = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
HUB_CONFIGS: dict[str, dict[str, Any]] = {
    # huggingface.co/meta-llama/Llama-3.2-1B/blob/main/config.json
    "llama3.2-1b": {
        "model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192, "num_attention_heads": 32,
        "num_key_value_heads": 8, "num_hidden_layers": 16, "head_dim": 64, "rms_norm_eps": 1e-05,
        "rope_theta": 500000.0, "tie_word_embeddings": True, "vocab_size": 128256, "hidden_act": "silu",
        "rope_scaling": {"rope_type": "llama3", "factor": 32.0, **LLAMA3_SCALING},
    },
    # huggingface.co/meta-llama/Llama-3.1-8B/blob/main/config.json
    "llama3.1-8b": {
        "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
        "num_key_value_heads": 8, "num_hidden_layers": 32, "rms_norm_eps": 1e-05, "rope_theta": 500000.0,
        "tie_word_embeddings": False, "vocab_size": 128256, "hidden_act": "silu", "pretraining_tp": 1,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, **LLAMA3_SCALING},
    },
    # huggingface.co/Qwen/Qwen2.5-7B/blob/main/config.json
    "qwen2.5-7b": {
        "model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_attention_heads": 28,
        "num_key_value_heads": 4, "num_hidden_layers": 28, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
        "tie_word_embeddings": False, "vocab_size": 152064, "hidden_act": "silu",
        "use_sliding_window": False, "sliding_window": 131072, "max_window_layers": 28,
    },
    # huggingface.co/mistralai/Mistral-7B-v0.3/blob/main/config.json
    "mistral-7b": {
        "model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
        "num_key_value_heads": 8, "num_hidden_layers": 32, "head_dim": 128, "rms_norm_eps": 1e-05,
        "rope_theta": 1000000.0, "tie_word_embeddings": False, "vocab_size": 32768, "hidden_act": "silu",
        "sliding_window": None,
    },
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(HUB_CONFIGS))
def test_the_published_config_is_the_presets_architecture(name: str) -> None:
    published = architecture_from_hf_config(HUB_CONFIGS[name], sequence_length=8192)
    assert architecture_mismatch(get_preset(name).architecture, published) is None


def test_a_preset_without_rope_scaling_would_refuse_llama_3_1() -> None:
    preset = get_preset("llama3.1-8b").architecture.model_copy(update={"rope_scaling": None})
    published = architecture_from_hf_config(HUB_CONFIGS["llama3.1-8b"])
    assert "rope_scaling" in str(architecture_mismatch(preset, published))
