"""The node labels HyperPod and Kubernetes put on a node, what capacity counts and what trainer pods select,
and the GPU resource the NVIDIA device plugin publishes on it.

The keys and values are those of docs/reference/hyperpod-pytorchjob.md §2.1; the topology layers are in
docs/backends.md.
"""

from __future__ import annotations

# The NVIDIA device plugin's resource: a node's allocatable GPUs, and what a trainer pod requests.
GPU_RESOURCE = "nvidia.com/gpu"
# The instance type, `ml.`-prefixed on HyperPod (e.g. ml.p6-b200.48xlarge).
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
# HyperPod's health agent: a node takes trainer pods only while this is Schedulable.
NODE_HEALTH_LABEL = "sagemaker.amazonaws.com/node-health-status"
SCHEDULABLE = "Schedulable"
# HyperPod's deep health check (InProgress, Passed or Failed): preferred, not required.
DEEP_HEALTH_LABEL = "sagemaker.amazonaws.com/deep-health-check-status"
DEEP_HEALTH_PASSED = "Passed"
# One host: where no two workers of a job go.
HOSTNAME_TOPOLOGY = "kubernetes.io/hostname"
# The closest of the EC2 network-topology levels HyperPod labels its nodes with.
HYPERPOD_CLOSEST_TOPOLOGY = "topology.k8s.aws/network-node-layer-3"
