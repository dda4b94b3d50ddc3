"""Initial weights in the plan: how long they take to load, and the node memory and NVMe they need.

The trainer (weights_load) builds the model on the meta device and has each rank read only the slices of
each tensor that it holds from the memory-mapped safetensors files; an s3:// checkpoint is first
downloaded whole into the node's NVMe cache (every rank reads a slice of every tensor, and the tensors are
spread over all the files). The export streams one tensor at a time through the writing rank. So, per node:

- it reads the union of its ranks' slices: the whole checkpoint when a shard group fits in the node
  (hybrid or no sharding), else gpus_per_node / shard_degree of it;
- host memory holds those pages while they are read (the page cache is charged to the pod's memory cgroup),
  plus what the export's writer buffers, by the exporter's own rule (config.export_host_bytes): one
  output file's worth (2 GiB), or the largest tensor in the export dtype when that is larger;
- NVMe holds the whole checkpoint when it comes from S3, nothing otherwise.

Bandwidths (docs/fine-tuning.md has the sources):
- S3: 6.25 GB/s per node. boto3's transfer manager downloads with 10 connections at once, and one
  connection to S3 carries at most 5 Gbit/s (AWS re:Post, "Maximizing Amazon S3 transfer throughput to
  Amazon EC2 instances"): 10 x 5 Gbit/s. S3 itself scales with requests, so nodes do not share it.
- A volume (FSx for Lustre): 300 MB/s shared by every node. FSx throughput is provisioned per TiB of
  storage (125, 250, 500 or 1000 MB/s/TiB on PERSISTENT_2, FSx for Lustre User Guide, "Managing throughput
  capacity"); 300 MB/s is the smallest file system SageMaker HyperPod creates (1.2 TiB) at 250 MB/s/TiB. A
  larger or faster file system loads proportionally faster; the figure is a floor, not a measurement.
- /local (the node's NVMe, staged beforehand): not modelled (no published figure); no load time is given.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from blackwell_operator.catalogs import list_presets, resolve_model
from blackwell_operator.errors import PlanningError, SpecError
from blackwell_operator.models.spec import BlackwellTrainingJobSpec
from blackwell_operator.planner.layout import Hardware
from blackwell_operator.planner.storage import NODE_LOCAL, WEIGHTS_FIELD, on
from blackwell_operator.units import GB
from blackwell_trainer.plan.config import (
    DEFAULT_EXPORT_DTYPE,
    EXPORT_DTYPE_BYTES,
    NODE_DISK_KEEP_FREE_FRACTION,
    Architecture,
    WeightsConfig,
    WeightsLoad,
    WeightsSource,
    architecture_mismatch,
    export_host_bytes,
)

S3_BYTES_PER_SECOND_PER_NODE = 10 * 5e9 / 8
VOLUME_BYTES_PER_SECOND = 1.2 * 250e6
# A bf16 checkpoint (what Llama 3.x, Qwen2.5 and Mistral ship) holds two bytes per parameter.
ESTIMATED_BYTES_PER_PARAMETER = 2


@dataclass(frozen=True)
class CheckpointFacts:
    """What the plan's maker could read of the checkpoint: its architecture, its size and the dtype its
    config.json names (which the export writes; bfloat16 where it names none or was not read)."""

    architecture: Architecture | None = None
    size_bytes: int | None = None
    export_dtype: str = DEFAULT_EXPORT_DTYPE


def with_checkpoint_architecture(
    spec: BlackwellTrainingJobSpec, facts: CheckpointFacts
) -> BlackwellTrainingJobSpec:
    """The spec, checked against the checkpoint where it was read: a named model must be the checkpoint's.

    A spec that names no model is refused whether or not the checkpoint was read here: the operator reads
    no checkpoint, so `btj plan` and `btj render` refuse what it would (issue 39); where config.json was
    read, the fix is the model to name.
    """
    model, read = spec.model, facts.architecture
    if model.preset is None and model.architecture is None:
        uri = model.weights.uri if model.weights else ""
        raise SpecError(
            "spec.model",
            f"neither preset nor architecture is set (weights.uri {uri} alone: the operator reads no "
            "checkpoint)",
            _name_the_model(uri, read),
        )
    if read is not None:
        _, named = resolve_model(model)
        difference = architecture_mismatch(named, read)
        if difference is not None:
            raise SpecError(
                WEIGHTS_FIELD,
                f"{model.weights.uri if model.weights else ''}: {difference}",
                "name the checkpoint's model in spec.model (`btj plan` prints it when spec.model names none)",
            )
    return spec


def _name_the_model(uri: str, read: Architecture | None) -> str:
    """The fix for a spec that names no model: the preset or architecture config.json describes, if read."""
    if read is None:
        return (
            "set spec.model.preset or spec.model.architecture (`btj plan` on a machine that mounts the "
            "folder reads its config.json and prints the one to set)"
        )
    for preset in list_presets():
        if architecture_mismatch(preset.architecture, read) is None:
            return f"set spec.model.preset: {preset.name} (what {uri}/config.json describes)"
    fields = json.dumps(read.model_dump(mode="json", by_alias=True, exclude_none=True))
    return f"set spec.model.architecture: {fields} (what {uri}/config.json describes)"


def largest_tensor_elements(arch: Architecture) -> int:
    """Elements of the checkpoint's largest tensor (the embedding, a projection or an MLP matrix)."""
    h, d = arch.hidden_size, arch.resolved_head_dim
    return max(arch.vocab_size * h, h * arch.intermediate_size, h * arch.num_attention_heads * d)


def export_buffer_bytes(arch: Architecture, facts: CheckpointFacts) -> int:
    """Host memory the export's writing rank holds at most (the exporter's own rule)."""
    return export_host_bytes(EXPORT_DTYPE_BYTES[facts.export_dtype] * largest_tensor_elements(arch))


def source_of(uri: str) -> WeightsSource:
    """Where a weights URI reads from."""
    if uri.startswith("s3://"):
        return WeightsSource.S3
    return WeightsSource.NODE_LOCAL if on(uri, NODE_LOCAL) else WeightsSource.VOLUME


def predict_load(
    uri: str, arch: Architecture, hw: Hardware, shard_degree: int, facts: CheckpointFacts
) -> WeightsLoad:
    """The weights' load time and their memory and NVMe needs on one node of `hw`."""
    source = source_of(uri)
    size = facts.size_bytes
    checkpoint = size if size is not None else ESTIMATED_BYTES_PER_PARAMETER * arch.parameter_count()
    node_read = int(checkpoint * min(1.0, hw.gpus_per_node / shard_degree))
    if source is WeightsSource.S3:
        bandwidth: float | None = S3_BYTES_PER_SECOND_PER_NODE
        seconds: float | None = checkpoint / S3_BYTES_PER_SECOND_PER_NODE  # each node downloads it whole
    elif source is WeightsSource.VOLUME:
        bandwidth = VOLUME_BYTES_PER_SECOND
        seconds = hw.nodes * node_read / VOLUME_BYTES_PER_SECOND  # every node reads through one file system
    else:
        bandwidth = seconds = None
    return WeightsLoad(
        source=source,
        checkpoint_bytes=checkpoint,
        checkpoint_bytes_estimated=size is None,
        node_read_bytes=node_read,
        bandwidth_bytes_per_second=bandwidth,
        load_seconds=None if seconds is None else round(seconds, 1),
        host_memory_bytes=node_read + export_buffer_bytes(arch, facts),
        host_memory_limit_bytes=hw.instance.pod_memory_bytes(hw.gpus_per_node),
        node_disk_bytes=checkpoint if source is WeightsSource.S3 else 0,
        node_disk_limit_bytes=usable_node_disk_bytes(hw),
    )


def usable_node_disk_bytes(hw: Hardware) -> int:
    """What one pod may fill of a node's NVMe: all of it but the share the trainer's cache keeps free,
    above the kubelet's eviction thresholds (config.NODE_DISK_KEEP_FREE_FRACTION)."""
    return int(hw.instance.local_nvme_bytes * (1 - NODE_DISK_KEEP_FREE_FRACTION))


def check_load(load: WeightsLoad, hw: Hardware) -> None:
    """Refuse a checkpoint too large for a node's disk or its pod's memory, with the figures."""
    estimated = " (estimated: 2 bytes per parameter)" if load.checkpoint_bytes_estimated else ""
    size = f"the checkpoint's {load.checkpoint_bytes / GB:,.1f} GB{estimated}"
    if load.node_disk_bytes > load.node_disk_limit_bytes:
        raise PlanningError(
            WEIGHTS_FIELD,
            f"{size} do not fit the S3 cache on one {hw.instance.instance_type} node's NVMe "
            f"({load.node_disk_limit_bytes / GB:,.1f} GB: {100 * (1 - NODE_DISK_KEEP_FREE_FRACTION):.0f}% of "
            f"{hw.instance.local_nvme_bytes / GB:,.0f})",
            "put the checkpoint on a shared volume (spec.volumes, e.g. FSx for Lustre) instead of S3",
        )
    if load.host_memory_bytes > load.host_memory_limit_bytes:
        raise PlanningError(
            WEIGHTS_FIELD,
            f"loading {size} needs {load.host_memory_bytes / GB:,.1f} GB of host memory per node (the "
            f"{load.node_read_bytes / GB:,.1f} GB its ranks read, plus the export's buffer), more "
            f"than the trainer pod's {load.host_memory_limit_bytes / GB:,.1f} GB",
            "shard the model over more GPUs (spec.tuning.sharding: full, or more spec.cluster.nodes)",
        )


def describe_load(uri: str, load: WeightsLoad) -> str:
    """One explanation line: what is read from where, how long it takes, what it needs of a node."""
    estimated = ", estimated from the parameters" if load.checkpoint_bytes_estimated else ""
    when = (
        "load time not modelled (node-local NVMe)"
        if load.load_seconds is None or load.bandwidth_bytes_per_second is None
        else f"~{load.load_seconds:,.0f} s at {load.bandwidth_bytes_per_second / GB:.2f} GB/s "
        f"({load.source.value})"
    )
    return (
        f"initial weights {uri}: {load.checkpoint_bytes / GB:,.1f} GB{estimated}; each node reads "
        f"{load.node_read_bytes / GB:,.1f} GB, {when}; host memory {load.host_memory_bytes / GB:,.1f} of "
        f"{load.host_memory_limit_bytes / GB:,.1f} GB per node, NVMe {load.node_disk_bytes / GB:,.1f} of "
        f"{load.node_disk_limit_bytes / GB:,.0f} GB"
    )


def plan_weights(
    uri: str, arch: Architecture, hw: Hardware, shard_degree: int, facts: CheckpointFacts
) -> WeightsConfig:
    """The plan's weights section: the URI, the known size and the predicted load, checked to fit."""
    load = predict_load(uri, arch, hw, shard_degree, facts)
    check_load(load, hw)
    return WeightsConfig(uri=uri, size_bytes=facts.size_bytes, load=load)
