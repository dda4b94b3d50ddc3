"""Convert one of the job's torch.distributed.checkpoint folders to a Hugging Face checkpoint, on one CPU.

``python -m blackwell_trainer.export --plan plan.json --checkpoint DIR --output URI``

DIR is a step folder (``step-000100``) or the job's checkpoint.path (its newest complete step). Each
tensor is read from the checkpoint on its own (partial loads), converted and streamed to the output, so
the machine needs memory for one output file, not for the model. The config.json and tokenizer come
from ``--weights`` (default: the plan's weights.uri) when there is one.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from blackwell_trainer.checkpoint.store import CheckpointError, list_complete, read_complete
from blackwell_trainer.model.transformer import build_model
from blackwell_trainer.plan.config import Plan
from blackwell_trainer.weights.export import DEFAULT_MAX_SHARD_BYTES, ExportTensor, input_checkpoint, write_hf
from blackwell_trainer.weights.hf_layout import export_config, export_dtype, hf_name
from blackwell_trainer.weights.store import WeightsError

log = logging.getLogger("blackwell_trainer.export")


def resolve_step(path: Path) -> Path:
    """The complete step folder `path` names, or the newest complete one under it."""
    if read_complete(path) is not None:
        return path
    found = list_complete(path)
    if not found:
        raise CheckpointError(
            f"--checkpoint {path}: no complete checkpoint there (a step-NNNNNN folder with COMPLETE.json)"
        )
    return found[-1].path


def checkpoint_tensors(step_dir: Path, plan: Plan) -> list[ExportTensor]:
    """The model's tensors as stored in a DCP folder, each fetched on its own by a partial load."""
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
    from torch.distributed.checkpoint.filesystem import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

    metadata = FileSystemReader(str(step_dir)).read_metadata().state_dict_metadata
    shapes = build_model(plan.architecture, max_seq_len=16)  # meta device: names and shapes only

    def fetch(fqn: str, stored: TensorStorageMetadata) -> Callable[[], torch.Tensor]:
        def read() -> torch.Tensor:
            tensor = torch.empty(tuple(stored.size), dtype=stored.properties.dtype)
            dcp_load(
                {"model": {fqn: tensor}},
                storage_reader=FileSystemReader(str(step_dir)),
                planner=DefaultLoadPlanner(allow_partial_load=True),
                no_dist=True,
            )
            return tensor

        return read

    tensors = []
    for fqn, param in shapes.named_parameters():
        stored = metadata.get(f"model.{fqn}")
        if not isinstance(stored, TensorStorageMetadata) or tuple(stored.size) != tuple(param.shape):
            raise CheckpointError(
                f"--checkpoint {step_dir} has no model tensor {fqn} of shape {list(param.shape)}: it was not "
                "written for this plan's architecture"
            )
        tensors.append(ExportTensor(hf_name(fqn), tuple(param.shape), fetch(fqn, stored)))
    return tensors


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m blackwell_trainer.export", description=__doc__)
    parser.add_argument("--plan", required=True, help="the job's plan JSON (its architecture)")
    parser.add_argument("--checkpoint", required=True, help="a step folder or the job's checkpoint.path")
    parser.add_argument("--output", required=True, help="folder or s3://bucket/prefix to write")
    parser.add_argument("--weights", default=None, help="input checkpoint for config.json and tokenizer")
    parser.add_argument("--dtype", choices=("bfloat16", "float32", "float16"), default=None)
    parser.add_argument("--max-shard-bytes", type=int, default=DEFAULT_MAX_SHARD_BYTES)
    args = parser.parse_args(list(argv) if argv is not None else None)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        plan = Plan.from_file(args.plan)
        step_dir = resolve_step(Path(args.checkpoint))
        weights_uri = args.weights or (plan.weights.uri if plan.weights else None)
        base, tokenizer = input_checkpoint(weights_uri)
        dtype = getattr(torch, args.dtype) if args.dtype else export_dtype(base)
        config = export_config(plan.architecture, dtype=dtype, max_positions=plan.sequence_length, base=base)
        error = write_hf(
            checkpoint_tensors(step_dir, plan),
            args.output,
            config=config,
            dtype=dtype,
            extra_files=tokenizer,
            max_shard_bytes=args.max_shard_bytes,
        )
    except (OSError, ValueError, CheckpointError, WeightsError) as err:
        error = str(err)
    if error is not None:
        print(f"error: {error}", file=sys.stderr)
        return 2
    log.info("wrote %s from %s", args.output, step_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
