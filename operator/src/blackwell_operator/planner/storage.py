"""Where the trainer reads and writes files: checkpoint, dataset and weights paths on storage that works.

The trainer container sees its image, the operator's own mounts (/etc/btj plan, /dev/shm, /local = the
pod's own node-local scratch, an emptyDir) and the PersistentVolumeClaims of spec.volumes.
torch.distributed.checkpoint has every rank write its part under one folder that rank 0 creates, so with
more than one node that folder must be on a file system every node shares (FSx for Lustre through a claim
on HyperPod EKS), and writable.
The CRD states the same rules in CEL (render/crd.py), so the API server refuses these specs at admission.
"""

from __future__ import annotations

from blackwell_operator.errors import SpecError
from blackwell_operator.models.spec import OPERATOR_VOLUMES, BlackwellTrainingJobSpec, Volume, path_within
from blackwell_trainer.plan.config import DatasetKind

CHECKPOINT_FIELD = "spec.training.checkpoint.path"
START_FROM_FIELD = "spec.training.checkpoint.startFrom"
DATASET_FIELD = "spec.training.dataset.uri"
WEIGHTS_FIELD = "spec.model.weights.uri"
OUTPUT_FIELD = "spec.training.output.uri"
NODE_LOCAL = OPERATOR_VOLUMES["local"]
FSX_EXAMPLE = "spec.volumes: [{name: fsx, claimName: fsx-claim, mountPath: /fsx}]"


def on(path: str, root: str) -> bool:
    """Whether `path` lies at or under `root`, judged on the string as the CRD's CEL rules judge it.

    A path with a `..` element counts as on no mount ("/fsx/../tmp" is not on /fsx); "/fsx//a/" is on it.
    """
    return ".." not in path.split("/") and path_within(path, root)


def volume_holding(spec: BlackwellTrainingJobSpec, path: str) -> tuple[int, Volume] | None:
    """The spec.volumes entry (index, volume) whose mountPath holds `path`, if any."""
    for index, volume in enumerate(spec.volumes):
        if on(path, volume.mount_path):
            return index, volume
    return None


def _check_checkpoint(spec: BlackwellTrainingJobSpec, path: str) -> None:
    nodes = spec.cluster.most_nodes  # an elastic job may grow to its maxNodes
    held = volume_holding(spec, path)
    if held is not None:
        index, volume = held
        if volume.read_only:
            raise SpecError(
                CHECKPOINT_FIELD,
                f"{path} is on spec.volumes[{index}] ({volume.name}, mounted at {volume.mount_path}), which "
                "is readOnly, so the trainer cannot save",
                f"set readOnly: false on spec.volumes[{index}], or put the checkpoints on a writable volume",
            )
        return
    on_node = on(path, NODE_LOCAL)
    if nodes == 1 and on_node:
        # One node: /local is the pod's node-local scratch (an emptyDir), so checkpoints survive a restart of
        # the container in the pod; they go with the pod, which a single-node job accepts by choosing /local
        # (docs/security.md).
        return
    mount = f"declare the shared file system and put the path under its mountPath ({FSX_EXAMPLE})"
    if nodes > 1:
        where = (
            "on one node's NVMe (/local)" if on_node else "not under the mountPath of any spec.volumes entry"
        )
        raise SpecError(
            CHECKPOINT_FIELD,
            f"{path} is {where}, but the job spans {nodes} nodes: every rank writes its part of a "
            "checkpoint into the step folder rank 0 creates, so ranks on the other nodes fail at the first "
            "save",
            mount,
        )
    # One node, a path in the container's own file system (or /etc/btj, /dev/shm): rejected rather than
    # allowed, because the checkpoints would vanish with the container (a restart, an eviction, auto-resume)
    # while the job claims to resume from them, and /dev/shm is host memory the trainer needs.
    raise SpecError(
        CHECKPOINT_FIELD,
        f"{path} is not on a volume, so the checkpoints would vanish when the pod restarts",
        f"{mount}, or for one node use a folder under {NODE_LOCAL} (the node's NVMe)",
    )


def _check_dataset(spec: BlackwellTrainingJobSpec, uri: str) -> None:
    nodes = spec.cluster.most_nodes  # an elastic job may grow to its maxNodes
    if nodes == 1 or uri.startswith("s3://") or volume_holding(spec, uri) is not None:
        # One node: a local folder may be baked into the image or staged on /local; the trainer checks it.
        return
    where = (
        "on one node's NVMe (/local)"
        if on(uri, NODE_LOCAL)
        else "not under the mountPath of any spec.volumes entry"
    )
    raise SpecError(
        DATASET_FIELD,
        f"{uri} is {where}, but the job spans {nodes} nodes and every node reads the shards",
        f"put the shards on a shared volume ({FSX_EXAMPLE}; readOnly: true is fine) or use an s3:// prefix",
    )


def _check_weights_folder(spec: BlackwellTrainingJobSpec, field: str, uri: str, *, writable: bool) -> None:
    """A weights folder (in or out) must be on a volume (writable for the export): anywhere else it is the
    container's own file system or the pod's scratch /local, both empty at start and lost with the pod (no
    node folder is shared with the pod any more, so nothing can be staged there: docs/security.md)."""
    if uri.startswith("s3://"):
        return
    held = volume_holding(spec, uri)
    if held is not None:
        index, volume = held
        if writable and volume.read_only:
            raise SpecError(
                field,
                f"{uri} is on spec.volumes[{index}] ({volume.name}, mounted at {volume.mount_path}), which "
                "is readOnly, so the trainer cannot write the trained weights",
                f"set readOnly: false on spec.volumes[{index}], or write them to an s3:// prefix",
            )
        return
    if on(uri, NODE_LOCAL):
        where = "in the pod's own scratch (/local)"
        what = (
            "it goes with the pod, so the trained weights would be lost"
            if writable
            else "it starts empty, and no folder of the node can be staged into it"
        )
    else:
        where = "not on a volume"
        what = "the trained weights would vanish with the container" if writable else "no checkpoint is there"
    raise SpecError(
        field,
        f"{uri} is {where}: {what}",
        f"use an s3:// prefix, or a folder under the mountPath of a spec.volumes entry ({FSX_EXAMPLE})",
    )


def check_storage(spec: BlackwellTrainingJobSpec) -> None:
    """Raise SpecError when the checkpoint folder, a local shard folder or a weights folder is where the
    job cannot use it."""
    path = spec.training.checkpoint.path
    if path:  # None or "" disables saving
        _check_checkpoint(spec, path)
    start_from = spec.training.checkpoint.start_from
    if start_from and volume_holding(spec, start_from) is None:
        # Another job's checkpoints are on the shared storage it saved to; nowhere else holds any.
        raise SpecError(
            START_FROM_FIELD,
            f"{start_from} is not on a volume, so no checkpoint of another job is there",
            f"mount the storage that job saved to and give the path under its mountPath ({FSX_EXAMPLE})",
        )
    dataset = spec.training.dataset
    if dataset.kind == DatasetKind.SHARDS and dataset.uri:
        _check_dataset(spec, dataset.uri)
    weights, output = spec.model.weights, spec.training.output
    if weights is not None:
        _check_weights_folder(spec, WEIGHTS_FIELD, weights.uri, writable=False)
    if output is not None:
        _check_weights_folder(spec, OUTPUT_FIELD, output.uri, writable=True)
        if weights is not None and output.uri.rstrip("/") == weights.uri.rstrip("/"):
            raise SpecError(
                OUTPUT_FIELD,
                f"{output.uri} is also {WEIGHTS_FIELD}: the export would overwrite the initial weights",
                "write the trained weights to another folder or prefix",
            )
