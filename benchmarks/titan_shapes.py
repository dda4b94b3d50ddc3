"""The two models benchmarks/titan_h200.py trains in both trainers, as each trainer spells them.

Plain data (no torch, no torchtitan), so a test reads it on any machine. Each entry pairs this trainer's
shape (a key of benchmarks/trainer_h200.SHAPES) with the torchtitan llama3 `TransformerModelArgs`
keywords of the flavor that benchmarks/titan_flavors.py registers. torchtitan's llama3 has no weight
tying, so both models are untied in both trainers; both use Llama 3.2's RoPE scaling (factor 32).
torchtitan derives the SwiGLU width from `dim`: int(2 * 4 * dim / 3), times `ffn_dim_multiplier`, rounded
up to `multiple_of`; the keywords below give 8192 for both (checked by the dry run, which builds the model).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Llama 3.2's RoPE frequency scaling in torchtitan's field names (trainer_h200.LLAMA32_ROPE_SCALING: ours).
ROPE_SCALING_TITAN: dict[str, Any] = dict(
    scaling_factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192
)


@dataclass(frozen=True)
class BenchModel:
    """One model in both trainers' words."""

    ours: str  # key of benchmarks/trainer_h200.SHAPES
    flavor: str  # the torchtitan flavor name titan_flavors.py registers
    titan_args: dict[str, Any]  # TransformerModelArgs keywords (rope scaling added by titan_flavors)
    parameters: int  # the exact count both trainers must report


MODELS: dict[str, BenchModel] = {
    # Llama-3.2-3B's shape with an untied output head: 3,606,752,256 parameters.
    "3b": BenchModel(
        ours="3b-untied",
        flavor="3B_untied",
        titan_args=dict(dim=3072, n_layers=28, n_heads=24, n_kv_heads=8, vocab_size=128256,
                        multiple_of=256, ffn_dim_multiplier=None, norm_eps=1e-5, rope_theta=500000.0),
        parameters=3_606_752_256,
    ),
    # Llama-3.2-1B's shape, untied: 1,498,482,688 parameters (1,235,814,400 tied).
    "1b": BenchModel(
        ours="1b-untied",
        flavor="1B_untied",
        titan_args=dict(dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, vocab_size=128256,
                        multiple_of=256, ffn_dim_multiplier=1.5, norm_eps=1e-5, rope_theta=500000.0),
        parameters=1_498_482_688,
    ),
}  # fmt: skip
# The train spec titan_flavors.py registers: torchtitan's llama3 spec with these flavors added.
TRAIN_SPEC = "btj_llama3"
