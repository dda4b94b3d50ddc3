"""The emulated HyperPod cluster shared by `btj demo` and the operator tests: namespace and nodes.

A node carries the labels HyperPod EKS puts on it (instance type, node health) and, when asked, the
allocatable resources a kubelet with the NVIDIA and EFA device plugins publishes, so the operator's
capacity check and the demo's scheduler stand-in read the same numbers.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from typing import Any

import kmock

from blackwell_operator.catalogs import get_instance
from blackwell_operator.nodelabels import GPU_RESOURCE, INSTANCE_TYPE_LABEL, NODE_HEALTH_LABEL, SCHEDULABLE
from blackwell_operator.render.hardware import HUGEPAGES_2MI
from blackwell_operator.render.pod import EFA_RESOURCE
from blackwell_operator.testing.emulator import HardenedEmulator
from blackwell_operator.units import GIB

# What an emulated kubelet keeps back from the node's RAM (system and kube reserved, eviction threshold):
# a round 5%, enough that the trainer pod's request (75% of the RAM) fits as it does on the real nodes.
_RESERVED_MEMORY_FRACTION = 0.05
# What an emulated kubelet keeps back from its disk (the instance's NVMe, as the EKS AMI's RAID setup places
# the kubelet there): the default hard eviction threshold, nodefs.available<10%.
_RESERVED_DISK_FRACTION = 0.10


def allocatable(instance_type: str) -> dict[str, str]:
    """What a node of `instance_type` publishes as allocatable with both device plugins running."""
    instance = get_instance(instance_type)
    return {
        GPU_RESOURCE: str(instance.gpus_per_node),
        EFA_RESOURCE: str(instance.efa_devices),
        "hugepages-2Mi": HUGEPAGES_2MI,
        "memory": f"{int(instance.host_memory_bytes / GIB * (1 - _RESERVED_MEMORY_FRACTION))}Gi",
        "ephemeral-storage": f"{int(instance.local_nvme_bytes / GIB * (1 - _RESERVED_DISK_FRACTION))}Gi",
        "pods": "110",
    }


def hyperpod_node(
    name: str,
    instance_type: str,
    *,
    health: str = SCHEDULABLE,
    resources: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A HyperPod node: its instance-type and health labels, and `resources` as its allocatable (none:
    a node whose kubelet has not published any yet)."""
    node: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {INSTANCE_TYPE_LABEL: instance_type, NODE_HEALTH_LABEL: health}},
    }
    if resources is not None:
        node["status"] = {"allocatable": dict(resources), "capacity": dict(resources)}
    return node


async def post(emulator: HardenedEmulator, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """POST like kubectl does; an error answer raises with the server's message."""
    response = await emulator.request("POST", path, json=dict(body))
    payload: dict[str, Any] = await response.json()
    if response.status >= 400:
        raise RuntimeError(f"POST {path}: HTTP {response.status}: {payload.get('message')}")
    return payload


@contextlib.asynccontextmanager
async def emulated_cluster(
    namespace: str, nodes: Sequence[Mapping[str, Any]] = (), job_resources: Collection[str] | None = None
) -> AsyncIterator[HardenedEmulator]:
    """The hardened emulator serving over HTTP, with the operator's resources, `namespace` and `nodes`;
    of the job CRDs, `job_resources` only when given (HardenedEmulator.declare_resources)."""
    async with HardenedEmulator() as emulator, kmock.Server(emulator):
        emulator.declare_resources(only=job_resources)
        await post(emulator, "/api/v1/namespaces", {"metadata": {"name": namespace}})
        for node in nodes:
            await post(emulator, "/api/v1/nodes", node)
            if "status" in node:  # the server keeps status only through /status, as the kubelet writes it
                path = f"/api/v1/nodes/{node['metadata']['name']}/status"
                response = await emulator.request(
                    "PATCH",
                    path,
                    json={"status": node["status"]},
                    headers={"Content-Type": "application/merge-patch+json"},
                )
                if response.status >= 400:
                    raise RuntimeError(f"PATCH {path}: HTTP {response.status}")
        yield emulator
