"""A kubeconfig that points the operator's clients at an emulated API server (tests, demo, benchmarks)."""

from __future__ import annotations

from pathlib import Path

import yaml


def write_kubeconfig(path: Path, server: str, *, namespace: str | None = None, name: str = "kmock") -> Path:
    """Write a one-context kubeconfig for `server` with a static bearer token; returns the path."""
    context: dict[str, str] = {"cluster": name, "user": name}
    if namespace:
        context["namespace"] = namespace
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": name,
        "clusters": [{"name": name, "cluster": {"server": server}}],
        "users": [{"name": name, "user": {"token": "test-token"}}],
        "contexts": [{"name": name, "context": context}],
    }
    path.write_text(yaml.safe_dump(config))
    return path
