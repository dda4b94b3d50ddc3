"""CPU check of benchmarks/titan_side_by_side.py's torchtitan side: no GPU, nothing trained.

For each configuration, the exact arguments the GPU run passes to `torchtitan.train` go through torchtitan's
own ConfigManager (TOML + overrides, tyro), the custom import registers the flavors, and the model is built
on the meta device the way torchtitan's Trainer builds it (train spec, flavor, `update_from_config`,
default dtype): its parameter count (torchtitan's `get_nparams_and_flops`) must equal this trainer's, from
the Plan and from the model it builds. Then torchtitan's tokenizer and data loader read the carried
tokenizer and text offline and yield one batch of the configured shape. FP8 is checked as far as a CPU
allows: torchtitan's converter refuses to build without an SM89+ GPU, so only its registration is.
Writes OUT/titan_dry_run.json; exits 1 if a count differs or torchtitan would not log at its default cadence.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.titan_shapes import MODELS
from benchmarks.titan_side_by_side import (
    SEQ,
    TITAN_LOG_FREQ,
    TOML,
    Point,
    our_parameters,
    titan_args,
    titan_command,
)


def _titan_model(point: Point, assets: Path, dump: Path) -> dict[str, Any]:
    import torch
    from torchtitan.config import TORCH_DTYPE_MAP, ConfigManager
    from torchtitan.protocols import train_spec
    from torchtitan.protocols.model_converter import _registry_model_converter_cls
    from torchtitan.tools import utils

    config = ConfigManager().parse_args(titan_args(point, assets, dump))
    importlib.import_module(config.experimental.custom_import)  # as torchtitan's Trainer.__init__ does
    spec = train_spec.get_train_spec(config.model.name)
    model_args = spec.model_args[config.model.flavor]
    model_args.update_from_config(config)
    with torch.device("meta"), utils.set_default_dtype(TORCH_DTYPE_MAP[config.training.dtype]):
        model = spec.model_cls(model_args)
    count, _flops = model_args.get_nparams_and_flops(model, config.training.seq_len)
    unknown = [c for c in config.model.converters if c not in _registry_model_converter_cls]
    if unknown:
        raise SystemExit(f"{point.name}: torchtitan has no model converter {unknown}")
    block = model.layers["0"]
    return {
        "config": config,
        "spec": spec,
        "parameters": count,
        "ffn_hidden": block.feed_forward.w1.out_features,
        "settings": {
            "flavor": config.model.flavor, "local_batch_size": config.training.local_batch_size,
            "seq_len": config.training.seq_len, "steps": config.training.steps,
            "dtype": config.training.dtype,
            "mixed_precision_param": config.training.mixed_precision_param,
            "compile": [config.compile.enable, config.compile.components],
            "activation_checkpoint": config.activation_checkpoint.mode, "converters": config.model.converters,
            "float8": [config.quantize.linear.float8.recipe_name, config.quantize.linear.float8.filter_fqns],
            "data_parallel_shard_degree": config.parallelism.data_parallel_shard_degree,
            "log_freq": config.metrics.log_freq,
            "rope_scaling": vars(model_args.rope_scaling_args), "vocab_size": model_args.vocab_size,
        },
    }  # fmt: skip


def _one_batch(built: dict[str, Any]) -> list[int]:
    """torchtitan's tokenizer and data loader on the carried files: one batch's shape and largest id."""
    config, spec = built["config"], built["spec"]
    tokenizer = spec.build_tokenizer_fn(config)
    loader = spec.build_dataloader_fn(dp_world_size=1, dp_rank=0, tokenizer=tokenizer, job_config=config)
    inputs, labels = next(iter(loader))
    return [*inputs["input"].shape, int(labels.max())]


def check(point: Point, assets: Path) -> dict[str, Any]:
    dump = Path(tempfile.mkdtemp(prefix="btj-titan-dry-"))
    built = _titan_model(point, assets, dump)
    plan_count, model_count = our_parameters(point)
    expected = MODELS[point.model].parameters
    batch = _one_batch(built)
    return {
        "name": point.name,
        "command": " ".join(titan_command(point, assets, dump)),
        "torchtitan": built["settings"]
        | {"parameters": built["parameters"], "ffn_hidden": built["ffn_hidden"]},
        "ours": {"plan_parameters": plan_count, "model_parameters": model_count, "mbs": point.our_batch},
        "expected_parameters": expected,
        "equal": built["parameters"] == plan_count == model_count == expected,
        # The harness reads torchtitan's log lines as windows of its default cadence; a config that changed
        # it would change what torchtitan pays for logging and what a window covers.
        "log_freq_default": built["settings"]["log_freq"] == TITAN_LOG_FREQ,
        "one_batch": {"shape": batch[:2], "max_label": batch[2], "ok": batch[:2] == [point.titan_batch, SEQ]},
    }


def dry_run(points: list[Point], assets: Path, out: Path) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    results = [check(p, assets) for p in points]
    (out / "titan_dry_run.json").write_text(json.dumps({"toml": str(TOML), "rows": results}, indent=1))
    for r in results:
        t = r["torchtitan"]
        print(f"{r['name']:16s} torchtitan {t['parameters']:,} (ffn {t['ffn_hidden']}) ours plan "
              f"{r['ours']['plan_parameters']:,} model {r['ours']['model_parameters']:,} "
              f"{'EQUAL' if r['equal'] else 'DIFFER'}; batch {r['one_batch']['shape']} "
              f"max id {r['one_batch']['max_label']}")  # fmt: skip
        print(f"    {r['command']}")
    if not all(r["equal"] and r["one_batch"]["ok"] and r["log_freq_default"] for r in results):
        sys.exit(1)
