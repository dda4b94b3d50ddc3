"""torchtitan `--experimental.custom_import` module: registers this benchmark's two flavors.

torchtitan 0.2.2's llama3 flavors are a dict in its code, with no Llama-3.2 shapes. Its own hook for code
from outside the package is `--experimental.custom_import MODULE`, which its Trainer imports before it
looks up the train spec; this module, imported there, registers (public `register_train_spec`) a train
spec named benchmarks.titan_shapes.TRAIN_SPEC: torchtitan's own llama3 spec (model, parallelize, loss,
optimizer, data loader: unchanged), its flavors plus "3B_untied" and "1B_untied". So torchtitan still runs
as its users run it, `torchrun ... -m torchtitan.train --job.config_file ...`, with
`--model.name btj_llama3 --model.flavor 3B_untied`.
"""

from __future__ import annotations

from dataclasses import replace

from torchtitan.models.llama3 import TransformerModelArgs, get_train_spec, llama3_args
from torchtitan.models.llama3.model.args import RoPEScalingArgs
from torchtitan.protocols.train_spec import register_train_spec

from benchmarks.titan_shapes import MODELS, ROPE_SCALING_TITAN, TRAIN_SPEC


def flavors() -> dict[str, TransformerModelArgs]:
    """torchtitan's llama3 flavors and this benchmark's."""
    ours = {
        m.flavor: TransformerModelArgs(
            **m.titan_args, rope_scaling_args=RoPEScalingArgs(**ROPE_SCALING_TITAN)
        )
        for m in MODELS.values()
    }
    return {**llama3_args, **ours}


register_train_spec(TRAIN_SPEC, replace(get_train_spec(), model_args=flavors()))
