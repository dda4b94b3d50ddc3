"""The trainer pod's node-local disk: what the job writes there, and the ephemeral storage the pod declares.

Issue 24: the pod's /local (an emptyDir) and the container's writable layer live on the kubelet's disk,
which every pod of the node shares. A pod that declares nothing is neither counted by the scheduler nor
bounded: a full S3 cache could push the node into DiskPressure and have other namespaces' pods evicted.
So the pod declares what the plan expects it to write (render/pod.py puts it in the container's
ephemeral-storage request and limit and the emptyDir's sizeLimit), and the trainer's S3 cache is capped
to its share of it (BTJ_CACHE_MAX_BYTES). Writing past the declaration gets this pod evicted, alone.

What goes on the disk, per node:
- S3 initial weights: the whole checkpoint (planner/weights.py), never evicted while the job runs;
- S3 token shards: a cache that evicts least recently used shards beyond its share;
- single-node checkpoints under /local: `keepLatest`, the newest known good one and the one being written,
  each the fp32 weights and both fp32 Adam moments (12 bytes per parameter; gradients are not saved);
- an s3:// export: one output file staged at a time (the exporter's own rule, config.export_host_bytes);
- NCCL flight-recorder dumps, and the container's own files (/tmp, torch.compile's Inductor and Triton
  caches, the log): allowances, not measured here.
"""

from __future__ import annotations

from blackwell_operator.errors import PlanningError
from blackwell_operator.models.spec import BlackwellTrainingJobSpec
from blackwell_operator.planner.layout import Hardware
from blackwell_operator.planner.storage import CHECKPOINT_FIELD, DATASET_FIELD, NODE_LOCAL, WEIGHTS_FIELD, on
from blackwell_operator.planner.weights import CheckpointFacts, export_buffer_bytes, usable_node_disk_bytes
from blackwell_operator.units import GB, GIB
from blackwell_trainer.plan.config import (
    NODE_DISK_KEEP_FREE_FRACTION,
    Architecture,
    DatasetKind,
    LocalStorage,
    WeightsConfig,
)

LOCAL_STORAGE_FIELD = "spec.cluster.localStorageGiB"
# The S3 shard cache's share without spec.cluster.localStorageGiB: about a thousand shards of the prepare
# tool's default size (256 MiB of text, some 240 MB of uint32 tokens), so most data sets are read from S3
# once per pod, and small beside any instance's NVMe (30 TB on the catalog's nodes).
DEFAULT_SHARD_CACHE_BYTES = 256 * GIB
# The least the shard cache works with: every rank holds the shard it reads and may fetch the next, so 8
# ranks with two shards four times the prepare tool's size.
MIN_SHARD_CACHE_BYTES = 16 * GIB
# A checkpoint on disk: fp32 weights and the two fp32 Adam moments per parameter.
CHECKPOINT_BYTES_PER_PARAMETER = 12
# NCCL flight-recorder dumps (TORCH_NCCL_DEBUG_INFO_TEMP_FILE under /local, one per rank, a few MB each at
# the render's TORCH_NCCL_TRACE_BUFFER_SIZE) and the trainer's smaller files there.
SCRATCH_BYTES = 1 * GIB
# The container's writable layer and log: torch.compile's Inductor and Triton caches under /tmp (hundreds of
# MB per rank), Python's and the libraries' caches in HOME, the log the kubelet rotates.
CONTAINER_BYTES = 20 * GIB


def _whole_gib(size: int) -> int:
    """`size` rounded up to whole GiB, so the pod's quantities read as e.g. 300Gi."""
    return -(-size // GIB) * GIB


def _s3_data(spec: BlackwellTrainingJobSpec) -> bool:
    dataset = spec.training.dataset
    return dataset.kind in (DatasetKind.SHARDS, DatasetKind.CHAT) and (dataset.uri or "").startswith("s3://")


def _checkpoint_bytes(spec: BlackwellTrainingJobSpec, parameter_count: int) -> int:
    path = spec.training.checkpoint.path
    if not path or not on(path, NODE_LOCAL):
        return 0  # on a volume (or none): not this node's disk
    kept = spec.training.checkpoint.keep_latest + 2  # the newest known good one, and the one being written
    return kept * CHECKPOINT_BYTES_PER_PARAMETER * parameter_count


def _export_bytes(spec: BlackwellTrainingJobSpec, arch: Architecture, facts: CheckpointFacts) -> int:
    output = spec.training.output
    if output is None or not output.uri.startswith("s3://"):
        return 0  # a folder export is written on its volume (storage.py refuses /local)
    return export_buffer_bytes(arch, facts)


def plan_local_storage(
    spec: BlackwellTrainingJobSpec,
    hw: Hardware,
    *,
    arch: Architecture,
    parameter_count: int,
    weights: WeightsConfig | None,
    facts: CheckpointFacts,
) -> LocalStorage:
    """What one trainer pod writes on its node, and what it declares; PlanningError when it cannot fit."""
    weights_bytes = weights.load.node_disk_bytes if weights is not None and weights.load is not None else 0
    fixed = LocalStorage(
        weights_cache_bytes=weights_bytes,
        shard_cache_bytes=DEFAULT_SHARD_CACHE_BYTES if _s3_data(spec) else 0,
        checkpoint_bytes=_checkpoint_bytes(spec, parameter_count),
        export_staging_bytes=_export_bytes(spec, arch, facts),
        scratch_bytes=SCRATCH_BYTES,
        container_bytes=CONTAINER_BYTES,
        volume_bytes=0,
        limit_bytes=0,
        cache_max_bytes=0,
    )
    requested = spec.cluster.local_storage_gib
    if requested is None:
        storage = _totalled(fixed, fixed.shard_cache_bytes, from_spec=False)
    else:
        storage = _totalled(fixed, _shard_share(fixed, requested * GIB, _s3_data(spec)), from_spec=True)
    _check_node(storage, hw)
    return storage


def _fixed_volume_bytes(parts: LocalStorage) -> int:
    """What /local holds beside the shard cache, whose share is what the rest leaves."""
    held = parts.weights_cache_bytes + parts.checkpoint_bytes
    return held + parts.export_staging_bytes + parts.scratch_bytes


def _totalled(parts: LocalStorage, shard_bytes: int, *, from_spec: bool) -> LocalStorage:
    limit = _whole_gib(_fixed_volume_bytes(parts) + shard_bytes + parts.container_bytes)
    return parts.model_copy(
        update={
            "shard_cache_bytes": shard_bytes,
            # The rounding to whole GiB goes to the volume: the container's own files get their allowance.
            "volume_bytes": limit - parts.container_bytes,
            "limit_bytes": limit,
            "cache_max_bytes": parts.weights_cache_bytes + shard_bytes,
            "from_spec": from_spec,
        }
    )


def _shard_share(parts: LocalStorage, requested: int, s3_data: bool) -> int:
    """The shard cache's share of a limit the spec sets: whatever the rest leaves, at least its minimum."""
    rest = _fixed_volume_bytes(parts) + parts.container_bytes
    least = _whole_gib(rest + (MIN_SHARD_CACHE_BYTES if s3_data else 0))
    if requested < least:
        shards = f", and at least {MIN_SHARD_CACHE_BYTES // GIB} GiB for the S3 shard cache" * s3_data
        raise PlanningError(
            LOCAL_STORAGE_FIELD,
            f"{requested // GIB} GiB is less than this job writes on its node: {_breakdown(parts)}{shards}",
            f"set {LOCAL_STORAGE_FIELD} to at least {least // GIB}, or leave it out for the plan's estimate",
            remedies=[{LOCAL_STORAGE_FIELD: least // GIB}, {LOCAL_STORAGE_FIELD: None}],
        )
    return requested - rest


def _breakdown(parts: LocalStorage) -> str:
    named = [
        ("S3 weights", parts.weights_cache_bytes),
        ("checkpoints under /local", parts.checkpoint_bytes),
        ("export staging", parts.export_staging_bytes),
        ("NCCL dumps", parts.scratch_bytes),
        ("the container's own files", parts.container_bytes),
    ]
    return ", ".join(f"{what} {size / GIB:,.1f} GiB" for what, size in named if size)


def _check_node(storage: LocalStorage, hw: Hardware) -> None:
    """Refuse a declaration the node's disk cannot hold above the kubelet's eviction thresholds, naming
    what takes the most."""
    disk = hw.instance.local_nvme_bytes
    usable = usable_node_disk_bytes(hw)
    if storage.limit_bytes <= usable:
        return
    figures = (
        f"{storage.limit_bytes / GB:,.0f} GB of node-local disk per pod, more than the "
        f"{usable / GB:,.0f} GB a {hw.instance.instance_type} node can give one pod "
        f"({100 * (1 - NODE_DISK_KEEP_FREE_FRACTION):.0f}% of its {disk / GB:,.0f} GB of NVMe)"
    )
    if storage.from_spec:
        raise PlanningError(
            LOCAL_STORAGE_FIELD,
            figures,
            f"set {LOCAL_STORAGE_FIELD} to at most {usable // GIB}, or leave it out for the plan's estimate",
        )
    largest = max(
        (
            storage.checkpoint_bytes,
            CHECKPOINT_FIELD,
            "put the checkpoints on a volume, or keep fewer (spec.training.checkpoint.keepLatest)",
        ),
        (storage.weights_cache_bytes, WEIGHTS_FIELD, "put the checkpoint on a shared volume (spec.volumes)"),
        (storage.shard_cache_bytes, DATASET_FIELD, f"set {LOCAL_STORAGE_FIELD} smaller"),
    )
    raise PlanningError(largest[1], figures, largest[2])


def describe_local_storage(storage: LocalStorage) -> str:
    """One explanation line: what the pod declares, and what of it goes where."""
    source = LOCAL_STORAGE_FIELD if storage.from_spec else "the estimate"
    parts = [
        ("S3 weights", storage.weights_cache_bytes),
        ("S3 shard cache", storage.shard_cache_bytes),
        ("checkpoints", storage.checkpoint_bytes),
        ("export staging", storage.export_staging_bytes),
        ("other /local files", storage.scratch_bytes),
        ("container", storage.container_bytes),
    ]
    held = ", ".join(f"{what} {size / GIB:,.1f}" for what, size in parts if size)
    cap = storage.cache_max_bytes
    capped = f"; the S3 cache is capped at {cap / GIB:,.1f} GiB" if cap else ""
    return (
        f"node-local disk: each pod declares {storage.limit_bytes // GIB:,} GiB of ephemeral storage "
        f"({source}; GiB: {held}){capped}"
    )
