"""The Hugging Face checkpoint layout: tensor names, the config.json the trainer writes, file names."""

from __future__ import annotations

import re
from typing import Any

import torch

from blackwell_trainer.plan.config import Architecture, export_dtype_name

CONFIG_FILE = "config.json"
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
# Files a tokenizer may consist of (fast and slow), copied from the input checkpoint to the export.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "generation_config.json",
)
# Module names wrappers insert into parameter names: activation checkpointing, torch.compile, FSDP1.
_WRAPPER_PARTS = frozenset({"_checkpoint_wrapped_module", "_orig_mod", "_fsdp_wrapped_module"})

# (our name inside a block, the Hugging Face name inside a decoder layer)
_BLOCK_NAMES = (
    ("attention.wq", "self_attn.q_proj"),
    ("attention.wk", "self_attn.k_proj"),
    ("attention.wv", "self_attn.v_proj"),
    ("attention.wo", "self_attn.o_proj"),
    ("feed_forward.w1", "mlp.gate_proj"),
    ("feed_forward.w3", "mlp.up_proj"),
    ("feed_forward.w2", "mlp.down_proj"),
    ("attention_norm", "input_layernorm"),
    ("ffn_norm", "post_attention_layernorm"),
)
_TOP_NAMES = (
    ("tok_embeddings.weight", "model.embed_tokens.weight"),
    ("norm.weight", "model.norm.weight"),
    ("output.weight", "lm_head.weight"),
)
_OURS_TO_HF = {ours: hf for ours, hf in _BLOCK_NAMES}
_HF_TO_OURS = {hf: ours for ours, hf in _BLOCK_NAMES}
_OUR_BLOCK = re.compile(r"^layers\.(\d+)\.(.+)\.(weight|bias)$")
_HF_BLOCK = re.compile(r"^model\.layers\.(\d+)\.(.+)\.(weight|bias)$")
# Buffers some older checkpoints carry; the trainer recomputes them from config.json.
IGNORED_HF_SUFFIXES = ("rotary_emb.inv_freq",)

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


def clean_fqn(fqn: str) -> str:
    """A parameter's name without the wrapper modules (the name state_dict() reports)."""
    return ".".join(part for part in fqn.split(".") if part not in _WRAPPER_PARTS)


def hf_name(fqn: str) -> str:
    """The Hugging Face tensor name of one of the trainer's parameters (clean names)."""
    for ours, hf in _TOP_NAMES:
        if fqn == ours:
            return hf
    match = _OUR_BLOCK.match(fqn)
    if match and match.group(2) in _OURS_TO_HF:
        return f"model.layers.{match.group(1)}.{_OURS_TO_HF[match.group(2)]}.{match.group(3)}"
    raise KeyError(f"no Hugging Face name for parameter {fqn}")


def our_name(name: str) -> str | None:
    """The trainer's parameter name for a Hugging Face tensor name, or None when it has none."""
    for ours, hf in _TOP_NAMES:
        if name == hf:
            return ours
    match = _HF_BLOCK.match(name)
    if match and match.group(2) in _HF_TO_OURS:
        return f"layers.{match.group(1)}.{_HF_TO_OURS[match.group(2)]}.{match.group(3)}"
    return None


def export_dtype(config: dict[str, Any] | None) -> torch.dtype:
    """The dtype an export of a checkpoint with this config.json (None: random init) is written in."""
    return DTYPES[export_dtype_name(config)]


def dtype_name(dtype: torch.dtype) -> str:
    """The config.json spelling of a dtype."""
    for name, known in DTYPES.items():
        if known == dtype:
            return name
    raise ValueError(f"dtype {dtype} cannot be exported (float32, bfloat16 or float16)")


def export_config(
    arch: Architecture, *, dtype: torch.dtype, max_positions: int, base: dict[str, Any] | None
) -> dict[str, Any]:
    """The config.json of an export: the input checkpoint's (keeping its token ids and other keys) with
    the architecture and dtype set, or a fresh Llama / Qwen2 one when training started from random init.

    RoPE goes in the top-level rope_theta / rope_scaling form, which transformers 4 and 5 both read.
    """
    config: dict[str, Any] = dict(base or {})
    if not config:
        qwen = arch.attention_bias
        config.update(
            model_type="qwen2" if qwen else "llama",
            architectures=["Qwen2ForCausalLM" if qwen else "LlamaForCausalLM"],
            hidden_act="silu",
            max_position_embeddings=max_positions,
        )
    config.pop("rope_parameters", None)
    config.pop("dtype", None)
    config.update(
        hidden_size=arch.hidden_size,
        num_hidden_layers=arch.num_layers,
        num_attention_heads=arch.num_attention_heads,
        num_key_value_heads=arch.num_key_value_heads,
        intermediate_size=arch.intermediate_size,
        vocab_size=arch.vocab_size,
        tie_word_embeddings=arch.tie_word_embeddings,
        head_dim=arch.resolved_head_dim,
        rope_theta=arch.rope_theta,
        rms_norm_eps=arch.norm_eps,
        rope_scaling=(
            None
            if arch.rope_scaling is None
            else {"rope_type": "llama3", **arch.rope_scaling.model_dump(exclude={"rope_type"})}
        ),
        torch_dtype=dtype_name(dtype),
    )
    return config
