"""The Kubeflow training operator's PyTorchJob webhook rules, restated (the CRD schemas do not check them).

Source: kubeflow/training-operator pkg/webhooks/pytorch/pytorchjob_webhook.go
(docs/reference/hyperpod-pytorchjob.md §1.1).
"""

from __future__ import annotations

import re
from typing import Any

DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def webhook_errors(job: dict[str, Any]) -> list[str]:
    """Every rule of the validating webhook that the job breaks."""
    errors: list[str] = []
    name = job["metadata"]["name"]
    if not DNS1035.match(name) or len(name) > 63:
        errors.append(f"metadata.name {name!r} is not a DNS-1035 label")
    spec = job["spec"]
    replicas = spec.get("pytorchReplicaSpecs") or {}
    if not replicas:
        errors.append("spec.pytorchReplicaSpecs is empty")
    for replica_type, replica in replicas.items():
        where = f"spec.pytorchReplicaSpecs.{replica_type}"
        if replica_type not in ("Master", "Worker"):
            errors.append(f"{where}: only Master and Worker are allowed")
        containers = replica.get("template", {}).get("spec", {}).get("containers", [])
        named = [c for c in containers if c.get("name") == "pytorch"]
        if len(named) != 1:
            errors.append(f"{where}: needs exactly one container named pytorch, has {len(named)}")
        errors += [
            f"{where}: container {c.get('name')} has no image" for c in containers if not c.get("image")
        ]
        count = replica.get("replicas", 1)
        if replica_type == "Master" and count != 1:
            errors.append(f"{where}.replicas must be 1")
        if replica_type == "Worker" and count < 1:
            errors.append(f"{where}.replicas must be at least 1")
    if "elasticPolicy" in spec and "Worker" not in replicas:
        errors.append("spec.elasticPolicy needs a Worker replica spec")
    return errors
