"""The BlackwellTrainingJob spec: what the user asks for (camelCase on the wire, every field described)."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from blackwell_trainer.config import (
    ActivationCheckpointing,
    Architecture,
    CheckpointConfig,
    DatasetConfig,
    OptimizerConfig,
    Precision,
    Sharding,
    WireModel,
)

API_GROUP = "training.blackwell.dev"
API_VERSION = "v1alpha1"
KIND = "BlackwellTrainingJob"
PLURAL = "blackwelltrainingjobs"

AUTO: Literal["auto"] = "auto"
Auto = Literal["auto"]

DEFAULT_INSTANCE_TYPE = "ml.p6-b200.48xlarge"
DEFAULT_IMAGE = "ghcr.io/blackwell-dev/blackwell-trainer:0.1.0"


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


class ModelSpec(WireModel):
    """The model to train: a named preset or an explicit architecture (exactly one)."""

    preset: str | None = Field(
        default=None,
        description="Catalog preset, e.g. llama3.1-8b, llama3.2-1b, qwen2.5-7b, mistral-7b "
        "(see `btj presets`).",
    )
    architecture: Architecture | None = Field(
        default=None, description="Explicit Llama-style architecture, used when no preset is named."
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> ModelSpec:
        if (self.preset is None) == (self.architecture is None):
            raise ValueError("set exactly one of model.preset or model.architecture")
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


class TrainingSpec(WireModel):
    """What to train on and for how long."""

    sequence_length: int = Field(default=4096, ge=128, le=1_048_576, description="Tokens per sequence.")
    global_batch_tokens: int | None = Field(
        default=None,
        ge=1,
        description="Tokens per optimizer step across all GPUs; the planner picks gradient accumulation "
        "to reach it. Default: one micro-batch per GPU.",
    )
    steps: int = Field(default=1000, ge=1, description="Optimizer steps.")
    dataset: DatasetConfig = Field(default_factory=DatasetConfig, description="Training data source.")
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig, description="Checkpointing.")
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig, description="AdamW settings.")


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


class EnvVar(WireModel):
    """An environment variable for the trainer container (overrides the operator's defaults)."""

    name: str = Field(min_length=1, description="Variable name.")
    value: str = Field(default="", description="Variable value.")


class Toleration(WireModel):
    """A pod toleration, passed through to every worker pod."""

    key: str | None = Field(default=None, description="Taint key; empty matches all keys with Exists.")
    operator: Literal["Exists", "Equal"] = Field(default="Equal", description="Exists or Equal.")
    value: str | None = Field(default=None, description="Taint value for Equal.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect; empty matches all effects."
    )
    toleration_seconds: int | None = Field(default=None, description="For NoExecute: how long to stay.")


class BlackwellTrainingJobSpec(WireModel):
    """A training job: the model, the hardware, the data; everything else the planner decides."""

    model: ModelSpec = Field(description="The model to train.")
    cluster: ClusterSpec = Field(default_factory=ClusterSpec, description="Hardware for the job.")
    training: TrainingSpec = Field(default_factory=TrainingSpec, description="Data, steps and optimizer.")
    tuning: TuningSpec = Field(default_factory=TuningSpec, description="Performance knobs (auto or pinned).")
    image: str = Field(default=DEFAULT_IMAGE, min_length=1, description="Trainer container image.")
    backend: Backend = Field(default=Backend.PYTORCH_JOB, description="PyTorchJob or HyperPodPyTorchJob.")
    queue_name: str | None = Field(default=None, description="Kueue LocalQueue; adds kueue.x-k8s.io labels.")
    priority_class: str | None = Field(default=None, description="Kueue WorkloadPriorityClass name.")
    auto_resume: bool = Field(default=False, description="HyperPod job auto-resume on node faults.")
    max_retries: int = Field(default=3, ge=0, le=100, description="Restarts before the job fails.")
    tolerations: list[Toleration] = Field(default_factory=list, description="Pod tolerations.")
    env: list[EnvVar] = Field(default_factory=list, description="Extra trainer environment.")
    dry_run: bool = Field(default=False, description="Plan and report only; create no child job.")


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
