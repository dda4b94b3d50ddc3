"""Per-instance resources the pod asks for: EFA interfaces, host memory, hugepages."""

from __future__ import annotations

from blackwell_operator.models.spec import InstanceType

# `vpc.amazonaws.com/efa` devices per node (hyperpod-pytorchjob.md §2.3: HPCLI INSTANCE_RESOURCES,
# ADT efa-cheatsheet.md). Requests must equal limits.
_EFA_INTERFACES: dict[str, int] = {
    InstanceType.P5.value: 32,
    InstanceType.P5E.value: 32,
    InstanceType.P5EN.value: 16,
    InstanceType.P6_B200.value: 8,
}
# Host RAM in GiB (capacity, same sources); all four have 2048 GiB and 8 GPUs.
_HOST_MEMORY_GIB: dict[str, int] = {key: 2048 for key in _EFA_INTERFACES}
_GPUS: dict[str, int] = {key: 8 for key in _EFA_INTERFACES}

# hugepages-2Mi as in the ADT nccl-tests and the SageMaker EKS docs (§2.5), for libfabric's EFA provider.
HUGEPAGES_2MI = "5120Mi"
# Share of the node's RAM the pod may use: allocatable is below capacity (kubelet reserve, eviction
# threshold, hugepages, daemonsets) and is not published for these instances, so leave a wide margin.
HOST_MEMORY_FRACTION = 0.75


def efa_interfaces(instance_type: str) -> int:
    """EFA devices to request on one node of this instance type."""
    try:
        return _EFA_INTERFACES[instance_type]
    except KeyError:
        raise KeyError(f"no EFA count known for instance type {instance_type!r}") from None


def memory_request(instance_type: str, gpus: int) -> str:
    """Host memory for a pod that uses `gpus` of the node's GPUs, in whole GiB (a Kubernetes quantity)."""
    per_gpu = _HOST_MEMORY_GIB[instance_type] / _GPUS[instance_type]
    return f"{int(per_gpu * gpus * HOST_MEMORY_FRACTION)}Gi"
