"""The BlackwellTrainingJob spec: what the user asks for (camelCase on the wire, every field described)."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from blackwell_operator import __version__
from blackwell_operator.models.pod import (
    ENV_NAME,
    IMAGE,
    LABEL_VALUE,
    MAX_KEY,
    MAX_PULL_SECRETS,
    QUALIFIED_KEY,
    TOLERATION_SECONDS_EFFECT,
    PodAnnotations,
    PodLabels,
    SecretReference,
    ServiceAccountName,
    distinct_secrets,
    key_problem,
)
from blackwell_operator.nodelabels import HYPERPOD_CLOSEST_TOPOLOGY
from blackwell_trainer.plan.config import (
    ActivationCheckpointing,
    Architecture,
    CheckpointConfig,
    DatasetConfig,
    OptimizerConfig,
    Precision,
    ProbePolicy,
    Sharding,
    WireModel,
)
from blackwell_trainer.plan.env_vars import refusal

API_GROUP = "training.blackwell.dev"
API_VERSION = "v1alpha1"
KIND = "BlackwellTrainingJob"
PLURAL = "blackwelltrainingjobs"

AUTO: Literal["auto"] = "auto"
Auto = Literal["auto"]

DEFAULT_INSTANCE_TYPE = "ml.p6-b200.48xlarge"
# The trainer image of this release: its tag is the package version.
MAX_GLOBAL_BATCH_TOKENS = 2**40
DEFAULT_SEQUENCE_LENGTH = 4096
# 1 PiB: far above any node's disk (the planner refuses more than the instance's NVMe holds).
MAX_LOCAL_STORAGE_GIB = 1 << 20
DEFAULT_IMAGE = f"ghcr.io/blackwell-dev/blackwell-trainer:{__version__}"


class InstanceType(StrEnum):
    """SageMaker HyperPod instance types the catalog knows."""

    P5 = "ml.p5.48xlarge"
    P5E = "ml.p5e.48xlarge"
    P5EN = "ml.p5en.48xlarge"
    P6_B200 = "ml.p6-b200.48xlarge"


class Backend(StrEnum):
    """Which job kind the operator creates."""

    PYTORCH_JOB = "PyTorchJob"
    HYPERPOD_PYTORCH_JOB = "HyperPodPyTorchJob"
    TRAIN_JOB = "TrainJob"
    # The operator picks the first of these the cluster serves (lifecycle/backends.py).
    AUTO = "auto"


class ModelSpec(WireModel):
    """The model to train: a named preset or an explicit architecture (at most one), and initial weights.

    The operator reads no checkpoint, so a BTJ names one of them even with weights; `btj plan` on a
    machine that can read the weights' folder prints the one its config.json describes.
    """

    preset: str | None = Field(
        default=None,
        description="Catalog preset, e.g. llama3.1-8b, llama3.2-1b, qwen2.5-7b, mistral-7b "
        "(see `btj presets`).",
    )
    architecture: Architecture | None = Field(
        default=None, description="Explicit Llama-style architecture, used when no preset is named."
    )
    weights: WeightsSpec | None = Field(
        default=None, description="Hugging Face checkpoint to start from; random initialisation if unset."
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> ModelSpec:
        if self.preset is not None and self.architecture is not None:
            raise ValueError("set exactly one of model.preset or model.architecture")
        if self.preset is None and self.architecture is None and self.weights is None:
            raise ValueError("set exactly one of model.preset or model.architecture")
        return self


TOPOLOGY_NEEDS_QUEUE = (
    "spec.cluster.topology needs spec.queueName: Kueue's topology-aware scheduling places only the jobs it "
    "queues. Fix: set spec.queueName to the namespace's LocalQueue, or remove spec.cluster.topology"
)


# SageMaker's own name patterns, or an ARN of that resource type.
HYPERPOD_CLUSTER_PATTERN = (
    r"^([a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}|arn:[a-z-]+:sagemaker:[a-z0-9-]+:[0-9]{12}:cluster/[a-z0-9]+)$"
)
TRAINING_PLAN_PATTERN = (
    r"^([a-zA-Z0-9](-*[a-zA-Z0-9]){0,63}|arn:[a-z-]+:sagemaker:[a-z0-9-]+:[0-9]{12}:training-plan/[^/]+)$"
)


class TopologySpec(WireModel):
    """All nodes of the job within one network-topology domain (Kueue topology-aware scheduling)."""

    level: str = Field(
        max_length=MAX_KEY,
        description="Node label naming the topology domain, e.g. topology.k8s.aws/network-node-layer-3 (the "
        "closest of HyperPod's EC2 network layers; -2 and -1 are wider), or kubernetes.io/hostname.",
        json_schema_extra={"pattern": QUALIFIED_KEY},
    )
    mode: Literal["Required", "Preferred"] = Field(
        default="Preferred",
        description="Required: Kueue admits the job only when all its nodes fit in one domain of that level; "
        "Preferred: it tries, and else places the job across domains.",
    )

    @field_validator("level")
    @classmethod
    def _level(cls, value: str) -> str:
        if key_problem(value):
            raise PydanticCustomError(
                "topology_level",
                f"{value!r} is not a node label key. Fix: name a topology label of the nodes, e.g. "
                f"{HYPERPOD_CLOSEST_TOPOLOGY}",
            )
        return value


ELASTIC_NEEDS_GLOBAL_BATCH = (
    "spec.cluster.elastic needs spec.training.globalBatchTokens: the global batch is what stays the same "
    "when the node count changes (one micro-batch per GPU would change with it). Fix: set "
    "spec.training.globalBatchTokens to a multiple of spec.training.sequenceLength"
)
ELASTIC_WHOLE_SEQUENCES = (
    "spec.training.globalBatchTokens must be a multiple of spec.training.sequenceLength for an elastic "
    "job: every node count must train the same whole sequences per step. Fix: round globalBatchTokens to "
    "a multiple of sequenceLength"
)
ELASTIC_NEEDS_CHECKPOINT = (
    "spec.cluster.elastic needs spec.training.checkpoint.path: every resize re-creates the job, which "
    "resumes from its last checkpoint; without one each resize starts training again from step 0. Fix: set "
    "spec.training.checkpoint.path to a folder on a file system every node shares, under a spec.volumes "
    "entry's mountPath (e.g. /fsx/checkpoints/JOB with {name: fsx, claimName: fsx-claim, mountPath: /fsx})"
)
ELASTIC_RANGE = (
    "spec.cluster.elastic must have minNodes <= spec.cluster.nodes <= maxNodes. Fix: widen the range or "
    "set spec.cluster.nodes inside it"
)


class ElasticSpec(WireModel):
    """A node range: the job may run on any count in it, re-planned when the healthy nodes change."""

    min_nodes: int = Field(
        ge=1, le=1024, description="Fewest nodes the job runs on; with fewer healthy ones it waits."
    )
    max_nodes: int = Field(ge=1, le=1024, description="Most nodes the job runs on.")
    grace_period_seconds: int = Field(
        default=600,
        ge=0,
        le=24 * 3600,
        description="How long a node may stay gone (HyperPod replacing it) before it counts as lost and the "
        "job is re-planned for fewer nodes: each node's own time, continuously not Schedulable, not Ready, "
        "cordoned or deleted; a node back starts its time again, so a node that flaps faster never resizes "
        "the job. With scaleUp, a node counts for growing once up for this long.",
    )
    scale_up: bool = Field(
        default=False,
        description="Re-plan for more nodes (up to maxNodes) when more have each been schedulable for the "
        "whole grace period; off: a running job only shrinks.",
    )
    cooldown_seconds: int = Field(
        default=900,
        ge=0,
        le=7 * 24 * 3600,
        description="Least time between two resizes (rate limit, so a flapping node cannot churn the job).",
    )

    @model_validator(mode="after")
    def _ordered(self) -> ElasticSpec:
        if self.min_nodes > self.max_nodes:
            raise _spec_error(
                "elastic_range",
                f"minNodes {self.min_nodes} is more than maxNodes {self.max_nodes}. Fix: set minNodes <= "
                "maxNodes",
            )
        return self


class ClusterSpec(WireModel):
    """Where the job runs."""

    instance_type: InstanceType = Field(
        default=InstanceType.P6_B200, description="HyperPod instance type of every node."
    )
    nodes: int = Field(default=1, ge=1, le=1024, description="Number of nodes.")
    gpus_per_node: int | None = Field(
        default=None, ge=1, le=8, description="GPUs used per node; defaults to all GPUs of the instance."
    )
    local_storage_gib: int | None = Field(
        default=None,
        alias="localStorageGiB",
        ge=1,
        le=MAX_LOCAL_STORAGE_GIB,
        description="Node-local disk each trainer pod may use, in GiB: its ephemeral-storage request and "
        "limit (/local with the S3 cache, export staging and single-node checkpoints, and the container's "
        "own files). Unset: the plan's estimate (status.plan.localStorage). The S3 cache gets what the rest "
        "leaves; a pod that writes more is evicted alone, not its neighbours (docs/security.md).",
    )
    topology: TopologySpec | None = Field(
        default=None,
        description="Place all nodes within one network-topology domain (Kueue's podset topology "
        "annotations on the pod template; needs spec.queueName).",
    )
    hyperpod_cluster: str | None = Field(
        default=None,
        max_length=256,
        description="The SageMaker HyperPod cluster (name, or ARN for another region): the operator reads "
        "its instance groups and running nodes from AWS into the CapacityAvailable condition (advisory).",
        json_schema_extra={"pattern": HYPERPOD_CLUSTER_PATTERN},
    )
    training_plan: str | None = Field(
        default=None,
        max_length=256,
        description="The Flexible Training Plan (name or ARN) that books the capacity; its status and time "
        "window go into CapacityAvailable. Unset: the plan of the cluster's instance group, if any.",
        json_schema_extra={"pattern": TRAINING_PLAN_PATTERN},
    )
    elastic: ElasticSpec | None = Field(
        default=None,
        description="Run on any node count from minNodes to maxNodes: planned for the largest count the "
        "healthy nodes hold (spec.cluster.nodes when that is unknown) and re-planned when nodes are lost "
        "(or, with scaleUp, added); the global batch and the learning-rate schedule stay the same "
        "(docs/elastic.md).",
    )

    @property
    def most_nodes(self) -> int:
        """The most nodes the job may span: an elastic job's maxNodes, else nodes."""
        return self.elastic.max_nodes if self.elastic is not None else self.nodes

    @model_validator(mode="after")
    def _in_range(self) -> ClusterSpec:
        elastic = self.elastic
        if elastic is not None and not elastic.min_nodes <= self.nodes <= elastic.max_nodes:
            raise _spec_error(
                "elastic_range",
                f"spec.cluster.nodes {self.nodes} is outside spec.cluster.elastic "
                f"[{elastic.min_nodes}, {elastic.max_nodes}]. Fix: set nodes inside the range or widen it",
            )
        return self

    @field_validator("hyperpod_cluster")
    @classmethod
    def _cluster_name(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(HYPERPOD_CLUSTER_PATTERN, value):
            raise PydanticCustomError(
                "hyperpod_cluster",
                f"{value!r} is not a HyperPod cluster name or ARN. Fix: use the name `aws sagemaker "
                "list-clusters` shows, e.g. ml-cluster",
            )
        return value

    @field_validator("training_plan")
    @classmethod
    def _plan_name(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(TRAINING_PLAN_PATTERN, value):
            raise PydanticCustomError(
                "training_plan",
                f"{value!r} is not a training plan name or ARN. Fix: use the name `aws sagemaker "
                "list-training-plans` shows",
            )
        return value


class TrainingSpec(WireModel):
    """What to train on and for how long."""

    sequence_length: int = Field(
        default=DEFAULT_SEQUENCE_LENGTH, ge=128, le=1_048_576, description="Tokens per sequence."
    )
    global_batch_tokens: int | None = Field(
        default=None,
        ge=1,
        # 2^40 tokens: some 65,000 times the 16M-token batches of the largest public pre-training runs.
        le=MAX_GLOBAL_BATCH_TOKENS,
        description="Tokens per optimizer step across all GPUs; the planner picks gradient accumulation "
        "to reach it. Default: one micro-batch per GPU.",
    )
    steps: int = Field(default=1000, ge=1, le=100_000_000, description="Optimizer steps.")
    dataset: DatasetSpec = Field(default_factory=lambda: DatasetSpec(), description="Training data source.")
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig, description="Checkpointing.")
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig, description="AdamW settings.")
    output: OutputSpec | None = Field(
        default=None, description="Export of the trained weights (Hugging Face format) when training ends."
    )


class ProbeSpec(WireModel):
    """Whether the trainer times the top candidates before training, and within what (docs/probe.md)."""

    policy: ProbePolicy = Field(
        default=ProbePolicy.AUTO,
        description="auto (probe when a candidate's speed or memory is modelled, not measured here or on "
        "this cluster), always or never.",
    )
    budget_seconds: Auto | Annotated[int, Field(ge=30, le=3600)] = Field(
        default=AUTO,
        description="auto (2% of the job's predicted run time, at most 10 minutes), or the most seconds "
        "the probe may take; it stops there and trains with the best measured so far.",
    )
    candidates: int = Field(
        default=3, ge=2, le=6, description="Configurations the probe times, the planner's pick among them."
    )


class TuningSpec(WireModel):
    """Performance knobs: each is `auto` (the planner decides) or pinned (obeyed, or rejected with why)."""

    precision: Auto | Precision = Field(
        default=AUTO, description="auto, bf16, fp8, mxfp8 or nvfp4 (mxfp8/nvfp4 need Blackwell)."
    )
    activation_checkpointing: Auto | ActivationCheckpointing = Field(
        default=AUTO, description="auto, none, selective or full."
    )
    micro_batch_size: Auto | Annotated[int, Field(ge=1, le=1024)] = Field(
        default=AUTO, description="auto, or sequences per GPU per forward pass."
    )
    sharding: Auto | Sharding = Field(
        default=AUTO, description="auto, full (shard over all GPUs), hybrid (shard in a node), none."
    )
    context_parallel: Auto | Annotated[int, Field(ge=1, le=64)] = Field(
        default=AUTO, description="auto, or GPUs each sequence is split over."
    )
    memory_headroom: float = Field(
        default=0.05, ge=0.0, le=0.5, description="Fraction of GPU memory kept free by the plan."
    )
    compile: bool = Field(default=True, description="torch.compile each transformer block.")
    allow_unverified_recipes: bool = Field(
        default=False,
        description="Let precision auto choose a recipe whose trainer path never ran on a GPU here (MXFP8); "
        "auto never chooses NVFP4. A pinned precision is obeyed either way, with a Warning Event.",
    )
    max_replans: int = Field(
        default=2,
        ge=0,
        le=10,
        description="Re-plans with less memory after the trainer runs out of GPU memory, before the job "
        "fails; 0 fails it at the first.",
    )
    probe: ProbeSpec = Field(
        default_factory=ProbeSpec,
        description="Time the best candidates on the job's own GPUs before training, then train with the "
        "fastest.",
    )


class EnvVar(WireModel):
    """An environment variable for the trainer container (overrides the operator's defaults)."""

    name: str = Field(
        min_length=1,
        description="Variable name: printable ASCII characters other than '='.",
        json_schema_extra={"pattern": ENV_NAME},
    )
    value: str = Field(default="", description="Variable value.")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        # The API server refuses such a name on the pods, not on the job that templates them.
        if not re.fullmatch(ENV_NAME, value):
            raise _spec_error(
                "env_name",
                f"{value!r} is not an environment variable name: the API server refuses the pods. Fix: use "
                "printable ASCII characters other than '=', e.g. NCCL_DEBUG (the value goes in value)",
            )
        # A variable the operator sets is the operator's (blackwell_trainer.plan.env_vars.OPERATOR_OWNED).
        refused = refusal(value, "")
        if refused is not None and refused[0] == "name":
            raise _spec_error("env_name", refused[1])
        return value

    @field_validator("value")
    @classmethod
    def _trainer_check(cls, value: str, info: ValidationInfo) -> str:
        # The trainer's own check of the variable (blackwell_trainer.plan.env_vars), here before any pod
        # exists.
        # The message names the variable, never its value.
        refused = refusal(str(info.data.get("name") or ""), value)
        if refused is not None and refused[0] == "value":
            raise _spec_error("env_value", refused[1])
        return value


class Toleration(WireModel):
    """A pod toleration, passed through to every worker pod."""

    key: str | None = Field(default=None, description="Taint key; empty matches all keys with Exists.")
    operator: Literal["Exists", "Equal"] = Field(default="Equal", description="Exists or Equal.")
    value: str | None = Field(default=None, description="Taint value for Equal.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect; empty matches all effects."
    )
    toleration_seconds: int | None = Field(
        default=None, ge=0, le=365 * 24 * 3600, description="For NoExecute: how long to stay."
    )

    @field_validator("key")
    @classmethod
    def _key(cls, value: str | None) -> str | None:
        problem = key_problem(value) if value else None
        if problem:
            why = problem.replace(". Fix:", ": the API server refuses the pods. Fix:", 1)
            raise _spec_error("toleration_key", why)
        return value

    @field_validator("value")
    @classmethod
    def _value(cls, value: str | None) -> str | None:
        if value and not re.fullmatch(LABEL_VALUE, value):
            raise _spec_error(
                "toleration_value",
                f"{value!r} is not a label value: the API server refuses the pods. Fix: up to 63 letters, "
                "digits, '-', '_' or '.' starting and ending with a letter or digit, as the taint's value",
            )
        return value

    @model_validator(mode="after")
    def _seconds_need_no_execute(self) -> Toleration:
        if self.toleration_seconds is not None and self.effect != TOLERATION_SECONDS_EFFECT:
            raise _spec_error(
                "toleration_seconds",
                f"tolerationSeconds is set with effect {self.effect or '(any)'}: the API server refuses the "
                f"pods. Fix: set effect: {TOLERATION_SECONDS_EFFECT}, or remove tolerationSeconds (other "
                "effects never evict, so there is nothing to delay)",
            )
        return self


# The volumes the operator mounts into every trainer container itself (render/pod.py): a user volume may
# not take their names, nor a mountPath equal to, inside or above theirs (it would hide the plan, the
# shared memory or the node's NVMe). render/ mounts them at these paths; tests/render/test_volumes.py checks a
# rendered pod.
OPERATOR_VOLUMES: dict[str, str] = {"plan": "/etc/btj", "shm": "/dev/shm", "local": "/local"}
_OPERATOR_MOUNT_USES = {
    "plan": "the job's plan",
    "shm": "the node's shared memory",
    "local": "the pod's node-local scratch",
}

DNS1123_LABEL = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS1123_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
# One path element that is neither empty, `.` nor `..` (Kubernetes refuses `..` in mount paths).
_ELEMENT = r"([^/.][^/]*|\.[^/.][^/]*|\.\.[^/]+)"
# Absolute and normalised (no trailing or double slash, no `.`/`..`, not `/`), so a string prefix test
# decides whether one path lies inside another, here and in the CRD's CEL rules alike.
MOUNT_PATH_PATTERN = f"^(/{_ELEMENT})+$"
SUB_PATH_PATTERN = f"^{_ELEMENT}(/{_ELEMENT})*$"
MAX_VOLUMES = 16
AUTO_RESUME_TRAINJOB = (
    "spec.autoResume is HyperPod's auto-resume of Kubeflow PyTorchJobs and does not apply to a TrainJob, "
    "which restarts its pods itself (spec.maxRetries). Fix: remove autoResume, or use backend PyTorchJob "
    "or HyperPodPyTorchJob"
)


def path_within(path: str, root: str) -> bool:
    """Whether `path` is `root` or inside it (both normalised absolute paths)."""
    return path == root or path.startswith(root.rstrip("/") + "/")


def _spec_error(code: str, message: str) -> PydanticCustomError:
    """A field error whose message is shown as is (no `Value error,` prefix)."""
    return PydanticCustomError(code, message)


# An S3 bucket name (3-63 lowercase letters, digits, '.' and '-') with an optional key prefix.
_S3_URI = r"s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[^/]+)*/?"
# A checkpoint folder: an s3:// prefix, or a normalised absolute path (checked against spec.volumes).
STORAGE_URI_PATTERN = f"^({_S3_URI}|(/{_ELEMENT})+)$"
MAX_URI_LENGTH = 4096


def _check_storage_uri(value: str, example: str) -> str:
    if not re.fullmatch(STORAGE_URI_PATTERN, value):
        raise _spec_error(
            "storage_uri",
            f"{value!r} is neither an s3://bucket/prefix nor a normalised absolute folder. Fix: write it "
            f"like s3://my-bucket/{example} or /fsx/{example} (a folder: no trailing '/', '//', '.', '..')",
        )
    return value


class WeightsSpec(WireModel):
    """A Hugging Face checkpoint (config.json and *.safetensors) the job starts from."""

    uri: str = Field(
        max_length=MAX_URI_LENGTH,
        description="s3://bucket/prefix, or a folder on a spec.volumes entry, "
        "holding config.json and *.safetensors; the job's own checkpoint takes precedence on resume.",
        json_schema_extra={"pattern": STORAGE_URI_PATTERN},
    )

    @field_validator("uri")
    @classmethod
    def _uri(cls, value: str) -> str:
        return _check_storage_uri(value, "models/Llama-3.1-8B")


class OutputSpec(WireModel):
    """Where the trainer writes the trained weights as a Hugging Face checkpoint when training ends."""

    uri: str = Field(
        max_length=MAX_URI_LENGTH,
        description="s3://bucket/prefix, or a folder on a spec.volumes entry that is not readOnly, "
        "for safetensors, config.json and the tokenizer.",
        json_schema_extra={"pattern": STORAGE_URI_PATTERN},
    )

    @field_validator("uri")
    @classmethod
    def _uri(cls, value: str) -> str:
        return _check_storage_uri(value, "exports/my-job")


class DatasetSpec(DatasetConfig):
    """The training data as a user writes it: the plan's DatasetConfig, its uri checked like the others."""

    uri: str | None = Field(
        default=None,
        max_length=MAX_URI_LENGTH,
        description="s3://bucket/prefix, or a folder on a spec.volumes entry (or /local on one node), "
        "holding *.bin token shards (kind shards or chat).",
        json_schema_extra={"pattern": STORAGE_URI_PATTERN},
    )

    @field_validator("uri")
    @classmethod
    def _uri(cls, value: str | None) -> str | None:
        return None if value is None else _check_storage_uri(value, "datasets/my-corpus")


class Volume(WireModel):
    """A PersistentVolumeClaim mounted into every trainer container (e.g. FSx for Lustre at /fsx)."""

    name: str = Field(
        max_length=63,
        description="Volume name in the pod: a DNS-1123 label, unique, not plan, shm or local.",
        json_schema_extra={"pattern": DNS1123_LABEL},
    )
    claim_name: str = Field(
        max_length=253,
        description="PersistentVolumeClaim in the job's namespace, e.g. fsx-claim on HyperPod EKS.",
        json_schema_extra={"pattern": DNS1123_SUBDOMAIN},
    )
    mount_path: str = Field(
        max_length=512,
        description="Absolute path in the container, e.g. /fsx; unique, not nested in another volume's, "
        "and clear of /etc/btj, /dev/shm and /local.",
        json_schema_extra={"pattern": MOUNT_PATH_PATTERN},
    )
    read_only: bool = Field(default=False, description="Mount read-only (datasets); checkpoints need false.")
    sub_path: str | None = Field(
        default=None,
        max_length=512,
        description="Relative folder of the volume to mount instead of its root.",
        json_schema_extra={"pattern": SUB_PATH_PATTERN},
    )

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not re.fullmatch(DNS1123_LABEL, value):
            raise _spec_error(
                "volume_name",
                f"{value!r} is not a DNS-1123 label. Fix: use lowercase letters, digits and '-', e.g. fsx",
            )
        if value in OPERATOR_VOLUMES:
            raise _spec_error(
                "volume_name",
                f"{value!r} is a volume the operator mounts itself. Fix: choose another name, e.g. fsx",
            )
        return value

    @field_validator("claim_name")
    @classmethod
    def _claim_name(cls, value: str) -> str:
        if not re.fullmatch(DNS1123_SUBDOMAIN, value):
            raise _spec_error(
                "volume_claim_name",
                f"{value!r} is not a PersistentVolumeClaim name. Fix: name an existing claim in the "
                "job's namespace (`kubectl get pvc`), e.g. fsx-claim",
            )
        return value

    @field_validator("mount_path")
    @classmethod
    def _mount_path(cls, value: str) -> str:
        if not re.fullmatch(MOUNT_PATH_PATTERN, value):
            raise _spec_error(
                "volume_mount_path",
                f"{value!r} is not a normalised absolute path. Fix: write it like /fsx (no trailing '/', "
                "no '//', '.' or '..')",
            )
        for name, own in OPERATOR_VOLUMES.items():
            if path_within(value, own) or path_within(own, value):
                where = "is" if value == own else f"overlaps {own},"
                raise _spec_error(
                    "volume_mount_path",
                    f"{value} {where} where the operator mounts {_OPERATOR_MOUNT_USES[name]}. Fix: mount "
                    "the volume beside it, e.g. at /fsx",
                )
        return value

    @field_validator("sub_path")
    @classmethod
    def _sub_path(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(SUB_PATH_PATTERN, value):
            raise _spec_error(
                "volume_sub_path",
                f"{value!r} is not a relative path inside the volume. Fix: write it like "
                "checkpoints/team-a (no leading '/', no '..'), or leave subPath out",
            )
        return value


class BlackwellTrainingJobSpec(WireModel):
    """A training job: the model, the hardware, the data; everything else the planner decides."""

    model: ModelSpec = Field(description="The model to train.")
    cluster: ClusterSpec = Field(default_factory=ClusterSpec, description="Hardware for the job.")
    training: TrainingSpec = Field(default_factory=TrainingSpec, description="Data, steps and optimizer.")
    tuning: TuningSpec = Field(default_factory=TuningSpec, description="Performance knobs (auto or pinned).")
    image: str | None = Field(
        default=None,
        min_length=1,
        json_schema_extra={"pattern": IMAGE},
        description="Trainer container image (built from the project's trainer_image/Dockerfile). "
        "Unset: the operator's default, the Helm chart's trainerImage value.",
    )
    backend: Backend = Field(
        default=Backend.PYTORCH_JOB,
        description="PyTorchJob (Kubeflow Training Operator v1), HyperPodPyTorchJob (HyperPod's training "
        "operator), TrainJob (Kubeflow Trainer v2, with a TrainingRuntime of the same name), or auto: the "
        "first the cluster serves of TrainJob, PyTorchJob, HyperPodPyTorchJob (PyTorchJob first with "
        "autoResume); the choice is in status.backend.",
    )
    queue_name: str | None = Field(default=None, description="Kueue LocalQueue; adds kueue.x-k8s.io labels.")
    priority_class: str | None = Field(default=None, description="Kueue WorkloadPriorityClass name.")
    auto_resume: bool = Field(default=False, description="HyperPod job auto-resume on node faults.")
    max_retries: int = Field(default=3, ge=0, le=100, description="Restarts before the job fails.")
    ttl_seconds_after_finished: int | None = Field(
        default=None,
        ge=0,
        le=365 * 24 * 3600,
        description="Delete the child job and its pods this many seconds after it succeeds or fails "
        "(runPolicy.ttlSecondsAfterFinished), freeing what they hold; the BlackwellTrainingJob keeps its "
        "status and is not run again. Unset: the child stays until the BlackwellTrainingJob is deleted.",
    )
    tolerations: list[Toleration] = Field(default_factory=list, description="Pod tolerations.")
    env: list[EnvVar] = Field(default_factory=list, description="Extra trainer environment.")
    dry_run: bool = Field(default=False, description="Plan and report only; create no child job.")
    volumes: list[Volume] = Field(
        default_factory=list,
        max_length=MAX_VOLUMES,
        description="PersistentVolumeClaims mounted into every trainer container (shared checkpoints and "
        "datasets); a multi-node checkpoint.path must lie on one that is not readOnly.",
    )

    service_account_name: ServiceAccountName | None = Field(
        default=None,
        description="ServiceAccount of the trainer pods, in the job's namespace. On EKS, one bound to an "
        "IAM role (IRSA annotation or an EKS Pod Identity association) gives the pods AWS credentials "
        "for S3 data and weights. Unset: the namespace's default ServiceAccount.",
    )
    image_pull_secrets: list[SecretReference] = Field(
        default_factory=list,
        max_length=MAX_PULL_SECRETS,
        description="Secrets in the job's namespace for pulling the trainer image from a private registry.",
    )
    pod_labels: PodLabels | None = Field(
        default=None,
        description="Labels on every trainer pod (not on the job), e.g. for cost allocation or network "
        "policies; keys the operator sets itself are refused.",
    )
    pod_annotations: PodAnnotations | None = Field(
        default=None,
        description="Annotations on every trainer pod, e.g. for a sidecar injector or log routing; keys "
        "the operator sets itself are refused.",
    )

    @field_validator("image")
    @classmethod
    def _image(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(IMAGE, value):
            raise _spec_error(
                "image",
                f"{value!r} has leading or trailing whitespace: the API server refuses the pods (not the "
                "job). Fix: write the image reference alone, e.g. "
                "123456789012.dkr.ecr.us-east-1.amazonaws.com/btj-trainer:0.1.0",
            )
        return value

    @field_validator("image_pull_secrets")
    @classmethod
    def _distinct_pull_secrets(cls, secrets: list[SecretReference]) -> list[SecretReference]:
        return distinct_secrets(secrets)

    @field_validator("volumes")
    @classmethod
    def _distinct_volumes(cls, volumes: list[Volume]) -> list[Volume]:
        # Cross-volume rules; each volume's own fields are checked by Volume. The CRD states the same rules
        # in CEL (render/crd.py) so the API server rejects these specs at admission too.
        for index, volume in enumerate(volumes):
            for earlier, other in enumerate(volumes[:index]):
                here, there = f"spec.volumes[{index}]", f"spec.volumes[{earlier}]"
                if volume.name == other.name:
                    raise _spec_error(
                        "volume_duplicate",
                        f"{here}.name {volume.name} is also {there}.name. Fix: give each volume its own name",
                    )
                if volume.mount_path == other.mount_path:
                    raise _spec_error(
                        "volume_duplicate",
                        f"{here}.mountPath {volume.mount_path} is also {there}.mountPath. Fix: give each "
                        "volume its own mountPath (use subPath to mount two folders of one claim)",
                    )
                if path_within(volume.mount_path, other.mount_path) or path_within(
                    other.mount_path, volume.mount_path
                ):
                    raise _spec_error(
                        "volume_nested",
                        f"{here}.mountPath {volume.mount_path} and {there}.mountPath {other.mount_path} are "
                        "nested. Fix: mount volumes side by side, e.g. /fsx and /datasets",
                    )
        return volumes

    @model_validator(mode="after")
    def _auto_resume_backend(self) -> BlackwellTrainingJobSpec:
        if self.auto_resume and self.backend == Backend.TRAIN_JOB:
            raise _spec_error("auto_resume_backend", AUTO_RESUME_TRAINJOB)
        return self

    @model_validator(mode="after")
    def _elastic_batch(self) -> BlackwellTrainingJobSpec:
        if self.cluster.elastic is None:
            return self
        tokens = self.training.global_batch_tokens
        if tokens is None:
            raise _spec_error("elastic_global_batch", ELASTIC_NEEDS_GLOBAL_BATCH)
        if tokens % self.training.sequence_length:
            raise _spec_error("elastic_global_batch", ELASTIC_WHOLE_SEQUENCES)
        if self.training.checkpoint.path is None:
            raise _spec_error("elastic_checkpoint", ELASTIC_NEEDS_CHECKPOINT)
        return self

    @model_validator(mode="after")
    def _topology_queue(self) -> BlackwellTrainingJobSpec:
        if self.cluster.topology is not None and not self.queue_name:
            raise _spec_error("topology_queue", TOPOLOGY_NEEDS_QUEUE)
        return self


class ObjectMeta(WireModel):
    """The metadata fields the operator and CLI read from a manifest."""

    model_config = WireModel.model_config | {"extra": "allow"}

    name: str = Field(default="btj", description="Object name.")
    namespace: str | None = Field(default=None, description="Namespace.")


class BlackwellTrainingJob(WireModel):
    """A whole BTJ manifest as `kubectl apply` sends it."""

    api_version: Literal["training.blackwell.dev/v1alpha1"] = Field(description="API version.")
    kind: Literal["BlackwellTrainingJob"] = Field(description="Kind.")
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: BlackwellTrainingJobSpec
    status: dict[str, Any] | None = Field(default=None, description="Ignored on input.")
