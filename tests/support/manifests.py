"""The objects the operator tests send and the paths they call: plain dicts, no kopf or kmock import."""

from __future__ import annotations

from typing import Any

NAMESPACE = "hyperpod-ns-team-a"
# The collections spelled out on purpose, not from render.kinds: they are the wire paths the operator must
# call, so a wrong row in the table fails the tests instead of moving with them.
BTJS = f"/apis/training.blackwell.dev/v1alpha1/namespaces/{NAMESPACE}/blackwelltrainingjobs"
PYTORCHJOBS = f"/apis/kubeflow.org/v1/namespaces/{NAMESPACE}/pytorchjobs"
HYPERPODJOBS = f"/apis/sagemaker.amazonaws.com/v1/namespaces/{NAMESPACE}/hyperpodpytorchjobs"
TRAINJOBS = f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{NAMESPACE}/trainjobs"
CONFIGMAPS = f"/api/v1/namespaces/{NAMESPACE}/configmaps"
PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"
HOLD_FINALIZER = "test.blackwell.dev/hold"
B200 = "ml.p6-b200.48xlarge"
# Kopf's diff base on each BTJ (runtime.configure names it).
LAST_HANDLED = "training.blackwell.dev/last-handled-configuration"


def btj(name: str, **spec: Any) -> dict[str, Any]:
    """A BTJ manifest: the embedded example's spec with `spec` overrides (a key set to None is removed)."""
    base: dict[str, Any] = {
        "model": {"preset": "llama3.1-8b"},
        "cluster": {"instanceType": B200, "nodes": 2},
        "training": {"sequenceLength": 8192, "steps": 1000},
        "image": "ghcr.io/blackwell-dev/blackwell-trainer:0.1.0",
    }
    for key, value in spec.items():
        if value is None:
            base.pop(key, None)
        else:
            base[key] = value
    return {
        "apiVersion": "training.blackwell.dev/v1alpha1",
        "kind": "BlackwellTrainingJob",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "labels": {"team": "a", "app.kubernetes.io/instance": "argo-app"},
        },
        "spec": base,
    }


def labelled_node(name: str, instance_type: str = B200, health: str = "Schedulable") -> dict[str, Any]:
    """A Node as HyperPod labels it: its instance type and health label (what capacity and the node clock
    read; the wire keys spelled out, as the paths above are)."""
    labels = {
        "node.kubernetes.io/instance-type": instance_type,
        "sagemaker.amazonaws.com/node-health-status": health,
    }
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}
