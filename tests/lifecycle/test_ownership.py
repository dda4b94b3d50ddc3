"""Whose pod it is, decided from objects as read (lifecycle/ownership.py): pure, no cluster.

The integration tests (tests/operator/test_forged_pods.py) forge pods against the real operator; these pin
the last step, `of_child`: a chain that does lead to a BTJ's job still speaks only for that very BTJ (by
uid, not by name) and its current child.
"""

from __future__ import annotations

from typing import Any

from blackwell_operator.lifecycle.ownership import Lineage, lineage, of_child
from blackwell_operator.models.spec import API_GROUP, API_VERSION, KIND
from blackwell_operator.render.kinds import ChildKind

FOUND = Lineage(kind="PyTorchJob", name="w", uid="job-1", btj_name="w", btj_uid="btj-1")


def _btj(uid: str = "btj-1", child: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "w", "namespace": "team-a", "uid": uid}, "status": {"child": child or {}}}


def test_a_chain_speaks_only_for_the_btj_with_the_uid_it_ends_in() -> None:
    # A BTJ deleted and applied again under the same name is another BTJ: its predecessor's job's pods
    # (still terminating, say) are not its workers, even before it records a child of its own.
    assert of_child(FOUND, _btj())
    assert not of_child(FOUND, _btj(uid="btj-2"))
    assert not of_child(None, _btj())


def test_once_recorded_only_the_current_child_s_pods_count() -> None:
    current = {"kind": "PyTorchJob", "name": "w", "uid": "job-1"}
    assert of_child(FOUND, _btj(child=current))
    assert not of_child(FOUND, _btj(child={**current, "uid": "job-2"}))  # a replaced child's pods
    assert not of_child(FOUND, _btj(child={**current, "kind": "TrainJob"}))
    assert of_child(FOUND, _btj(child={"kind": "PyTorchJob", "name": "w"}))  # uid not recorded yet
    assert not of_child(FOUND, _btj(child={"kind": "PyTorchJob", "name": "other"}))


def test_a_controller_reference_counts_only_with_the_uid_of_the_object_read() -> None:
    trainer = {"name": "pytorch", "image": "trainer:1", "command": ["torchrun"]}
    job = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "spec": {"pytorchReplicaSpecs": {"Worker": {"template": {"spec": {"containers": [trainer]}}}}},
        "metadata": {
            "name": "w",
            "uid": "job-1",
            "creationTimestamp": "2026-12-01T11:00:00Z",
            "ownerReferences": [
                {
                    "apiVersion": f"{API_GROUP}/{API_VERSION}",
                    "kind": KIND,
                    "name": "w",
                    "uid": "btj-1",
                    "controller": True,
                }
            ],
        },
    }

    def read(kind: ChildKind, namespace: str, name: str) -> dict[str, Any] | None:
        return job if (kind.kind, namespace, name) == ("PyTorchJob", "team-a", "w") else None

    def pod(uid: str) -> dict[str, Any]:
        ref = {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "name": "w",
            "uid": uid,
            "controller": True,
        }
        meta = {"name": "w-worker-0", "namespace": "team-a", "creationTimestamp": "2026-12-01T11:00:05Z"}
        return {"metadata": {**meta, "ownerReferences": [ref]}, "spec": {"containers": [trainer]}}

    assert lineage(pod("job-1"), read) == FOUND
    assert lineage(pod("job-other"), read) is None  # the child's name, another uid: forged or stale
