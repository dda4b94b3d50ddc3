"""Per-instance resources the pod asks for: EFA interfaces (from the catalog), host memory, hugepages."""

from __future__ import annotations

from blackwell_operator.catalogs import get_instance

# hugepages-2Mi as in the ADT nccl-tests and the SageMaker EKS docs (docs/reference/hyperpod-pytorchjob.md
# §2.5), for libfabric's EFA provider.
HUGEPAGES_2MI = "5120Mi"


def efa_interfaces(instance_type: str) -> int:
    """`vpc.amazonaws.com/efa` devices to request on one node: all of them (requests must equal limits)."""
    return get_instance(instance_type).efa_devices


def memory_request(instance_type: str, gpus: int) -> str:
    """Host memory for a pod that uses `gpus` of the node's GPUs, in whole GiB (a Kubernetes quantity)."""
    # The catalog holds the rule (and the node's RAM): the planner checks the initial weights against it.
    return f"{get_instance(instance_type).pod_memory_bytes(gpus) >> 30}Gi"
