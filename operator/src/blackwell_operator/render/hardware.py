"""Per-instance resources the pod asks for: EFA interfaces (from the catalog), host memory, hugepages."""

from __future__ import annotations

from blackwell_operator.catalogs import get_instance

# Host RAM capacity in GiB: 2048 on p5, p5e, p5en and p6-b200 (docs/reference/hyperpod-pytorchjob.md §2.3,
# from the HyperPod CLI's INSTANCE_RESOURCES). Not in the instance catalog, which models what the planner
# needs.
HOST_MEMORY_GIB = 2048
# hugepages-2Mi as in the ADT nccl-tests and the SageMaker EKS docs (docs/reference/hyperpod-pytorchjob.md
# §2.5), for libfabric's EFA provider.
HUGEPAGES_2MI = "5120Mi"
# Share of the node's RAM the pod may use: allocatable is below capacity (kubelet reserve, eviction
# threshold, hugepages, daemonsets) and is not published for these instances, so leave a wide margin.
HOST_MEMORY_FRACTION = 0.75


def efa_interfaces(instance_type: str) -> int:
    """`vpc.amazonaws.com/efa` devices to request on one node: all of them (requests must equal limits)."""
    return get_instance(instance_type).efa_devices


def memory_request(instance_type: str, gpus: int) -> str:
    """Host memory for a pod that uses `gpus` of the node's GPUs, in whole GiB (a Kubernetes quantity)."""
    per_gpu = HOST_MEMORY_GIB / get_instance(instance_type).gpus_per_node
    return f"{int(per_gpu * gpus * HOST_MEMORY_FRACTION)}Gi"
