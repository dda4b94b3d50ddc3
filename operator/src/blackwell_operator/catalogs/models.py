"""Typed catalog records: GPUs, instance types and model presets (loaded from the YAML under data/)."""

from __future__ import annotations

from pydantic import Field

from blackwell_operator.units import GIB
from blackwell_trainer.plan.config import Architecture, Precision, PrecisionRecipe, WireModel

# Share of a node's RAM the trainer pods may request together (see InstanceSpec.pod_memory_bytes).
POD_MEMORY_FRACTION = 0.75
# The tensor-core format whose peak a precision's GEMMs run at (MXFP8 is FP8 with block scales).
_TENSOR_CORE_FORMAT = {
    Precision.BF16: "bf16",
    Precision.FP8: "fp8",
    Precision.MXFP8: "fp8",
    Precision.NVFP4: "fp4",
}


class GpuSpec(WireModel):
    """One GPU type: memory, dense peaks, bandwidths and the precisions its tensor cores train in."""

    name: str = Field(description="Catalog name, e.g. B200.")
    aliases: list[str] = Field(default_factory=list, description="Other names accepted by get_gpu.")
    compute_capability: str = Field(pattern=r"^\d+\.\d+$", description="CUDA compute capability.")
    memory_bytes: int = Field(gt=0, description="Device memory CUDA reports, bytes.")
    peak_flops: dict[str, float] = Field(description="Dense peak FLOP/s by format: bf16, fp8, fp4.")
    hbm_bandwidth: float = Field(gt=0, description="HBM bandwidth, bytes/s.")
    nvlink_bandwidth: float = Field(gt=0, description="NVLink bandwidth per direction, bytes/s.")
    precisions: dict[Precision, list[PrecisionRecipe]] = Field(
        description="Precisions the GPU can train in and the recipes that realise each."
    )
    source: str = Field(min_length=1, description="Where the figures come from.")

    @property
    def memory_gib(self) -> float:
        """Device memory in GiB."""
        return self.memory_bytes / GIB

    @property
    def major(self) -> int:
        """Compute-capability major version (9 Hopper, 10 Blackwell)."""
        return int(self.compute_capability.split(".")[0])

    def peak_for(self, precision: Precision) -> float:
        """Dense peak FLOP/s of the tensor-core format a precision runs its GEMMs in."""
        return self.peak_flops[_TENSOR_CORE_FORMAT[precision]]


class InstanceSpec(WireModel):
    """One instance type: which GPU, how many, and the network between nodes."""

    instance_type: str = Field(description="e.g. ml.p6-b200.48xlarge.")
    gpu: str = Field(description="GPU catalog name.")
    gpus_per_node: int = Field(ge=1, description="GPUs per node.")
    efa_devices: int = Field(ge=0, description="EFA network interfaces per node.")
    inter_node_bandwidth: float = Field(gt=0, description="EFA bandwidth per node per direction, bytes/s.")
    host_memory_bytes: int = Field(gt=0, description="Host RAM of one node, bytes.")
    local_nvme_bytes: float = Field(gt=0, description="Instance-store NVMe of one node, bytes (/local).")
    source: str = Field(min_length=1, description="Where the figures come from.")

    def pod_memory_bytes(self, gpus: int) -> int:
        """Host memory a trainer pod using `gpus` of the node's GPUs requests, in whole GiB.

        Allocatable is below capacity (kubelet reserve, eviction threshold, hugepages, daemonsets) and is
        not published for these instances, so the pod takes POD_MEMORY_FRACTION of its GPUs' share.
        """
        per_gpu = self.host_memory_bytes / self.gpus_per_node
        return int(per_gpu * gpus * POD_MEMORY_FRACTION / GIB) * GIB


class ModelPreset(WireModel):
    """A named, published model shape."""

    name: str = Field(description="Preset name used in spec.model.preset.")
    display_name: str = Field(description="The published model name.")
    parameter_count: int = Field(gt=0, description="Published total parameter count.")
    architecture: Architecture
    source: str = Field(min_length=1, description="Where the shape comes from.")
