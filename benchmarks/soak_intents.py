"""The operator soak's intents: a resize, an out-of-memory re-plan and a probe adoption, started under faults.

Each is one BTJ of its own, left alone by the soak's hand deletions. A stand-in starts its intent as soon
as its first child runs, so that its requests (status write, DELETE, finalizer release, plan copy, create,
the write that records the child) meet the soak's faults, lost answers and operator kills: the resize
loses a node of its own pool, the re-plan's worker reports the trainer's out-of-memory line, the probe's
worker completes with its probe line. After calm each must end on the child it intends (issue 35).
"""

from __future__ import annotations

import datetime
import time
from dataclasses import dataclass, field
from typing import Any

from tests.support.oom import oom_message
from tests.support.pods import pod as trainer_pod
from tests.support.probe_results import measured_probe

from blackwell_operator.nodelabels import INSTANCE_TYPE_LABEL, NODE_HEALTH_LABEL, SCHEDULABLE
from blackwell_operator.render.environment import PLAN_FILE
from blackwell_operator.testing.emulator import BTJ_RESOURCE, PYTORCHJOB_RESOURCE, HardenedEmulator
from blackwell_trainer.plan.config import (
    Plan,
    ProbeResult,
)

RESIZE, OOM, PROBE = "soak-resize", "soak-oom", "soak-probe"
NAMES = (RESIZE, OOM, PROBE)
# The resizing job's pool: an instance type none of the soak's other jobs uses, so losing one of its
# nodes moves that job alone (from 4 to 3 nodes).
POOL_TYPE, POOL = "ml.p5en.48xlarge", 4
MERGE = {"Content-Type": "application/merge-patch+json"}
B200 = "ml.p6-b200.48xlarge"


def pool_nodes() -> list[dict[str, Any]]:
    labels = {INSTANCE_TYPE_LABEL: POOL_TYPE, NODE_HEALTH_LABEL: SCHEDULABLE}
    return [{"metadata": {"name": f"pool-node-{n}", "labels": labels}} for n in range(POOL)]


def manifests(namespace: str) -> list[dict[str, Any]]:
    """The three BTJs: an elastic one on the pool, one that will run out of memory, one that probes (long
    enough that a probe pays for itself)."""
    elastic = {"minNodes": 2, "maxNodes": POOL, "gracePeriodSeconds": 1, "cooldownSeconds": 0}
    specs = {
        RESIZE: {
            "model": {"preset": "llama3.2-1b"},
            "volumes": [{"name": "fsx", "claimName": "fsx-claim", "mountPath": "/fsx"}],
            "cluster": {"instanceType": POOL_TYPE, "nodes": POOL, "elastic": elastic},
            "training": {
                "sequenceLength": 4096,
                # 768 sequences divide over 16, 24 and 32 GPUs: every node count of the range keeps it.
                "globalBatchTokens": 768 * 4096,
                "steps": 100,
                "checkpoint": {"path": f"/fsx/checkpoints/{RESIZE}"},
            },
        },
        OOM: {
            "model": {"preset": "llama3.1-8b"},
            "cluster": {"instanceType": B200, "nodes": 1},
            "training": {"sequenceLength": 8192, "steps": 100},
        },
        PROBE: {
            "model": {"preset": "llama3.1-8b"},
            "cluster": {"instanceType": B200, "nodes": 2},
            "training": {"sequenceLength": 8192, "steps": 20_000},
            # BF16, so that the probe compares two AC modes: under FP8 the pick (AC none) has no neighbour
            # within reach since the 4,096-token loss chunk, and probes alone for its growth.
            "tuning": {"precision": "bf16"},
        },
    }
    return [
        {
            "apiVersion": "training.blackwell.dev/v1alpha1",
            "kind": "BlackwellTrainingJob",
            "metadata": {"name": name, "namespace": namespace},
            "spec": spec,
        }
        for name, spec in specs.items()
    ]


def probe_result(plan: Plan) -> ProbeResult:
    """What the probe reports: the runner-up measured faster than the first choice."""
    return measured_probe(
        plan,
        speed=[0.92, 0.97],
        peak=lambda c: 0.92 * c.prediction.memory.peak_reserved,
        winner=1,
        seconds_each=50.0,
        seconds=104.0,
    )


def worker(
    namespace: str, job: dict[str, Any], code: int, message: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Worker 0 of `job` as the training operator makes it (from the job's pod template: the operator
    counts no other), and its status as the kubelet writes it once the trainer has ended with `code` and
    `message` (now: the operator judges a failure by its time)."""
    name = job["metadata"]["name"]
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    made = trainer_pod(f"{name}-worker-0", name, owner=job, namespace=namespace)
    reason = "Completed" if code == 0 else "Error"
    ended = {"exitCode": code, "reason": reason, "startedAt": now, "finishedAt": now, "message": message}
    container = {"name": "pytorch", "ready": False, "restartCount": 0, "state": {"terminated": ended}}
    phase = "Succeeded" if code == 0 else "Failed"
    return made, {"phase": phase, "containerStatuses": [container]}


@dataclass
class Intents:
    """The stand-in that starts each intent, and what it saw: when, and the child each started on."""

    k: HardenedEmulator
    namespace: str
    started_at: dict[str, float] = field(default_factory=dict)  # name -> monotonic time it was started
    first_child: dict[str, str] = field(default_factory=dict)  # name -> the uid of the child it started on
    winner: int | None = None  # the probe's winner, as reported

    def _plan(self, name: str) -> Plan | None:
        status = (self.k.get_object(BTJ_RESOURCE, self.namespace, name) or {}).get("status") or {}
        return Plan.model_validate(status["plan"]) if status.get("plan") else None

    async def step(self) -> None:
        """Start each intent whose first child runs (the soak's training operator marked it)."""
        for name in NAMES:
            job = self.k.get_object(PYTORCHJOB_RESOURCE, self.namespace, name)
            plan = self._plan(name)
            if name in self.started_at or job is None or plan is None or not (job.get("status") or {}):
                continue
            if name == RESIZE:
                node = f"pool-node-{POOL - 1}"
                labels = {"metadata": {"labels": {NODE_HEALTH_LABEL: "Unschedulable"}}}
                await self.k.patch(f"/api/v1/nodes/{node}", json=labels, headers=MERGE)
            elif name == OOM:
                await self._end_worker(job, 1, oom_message(plan))
            elif plan.probe is not None and plan.probe.enabled:
                result = probe_result(plan)
                self.winner = result.winner
                await self._end_worker(job, 0, f"done\n{result.to_line()}\n")
            self.first_child[name] = job["metadata"]["uid"]
            self.started_at[name] = time.monotonic()

    async def _end_worker(self, job: dict[str, Any], code: int, message: str) -> None:
        pods = f"/api/v1/namespaces/{self.namespace}/pods"
        pod, status = worker(self.namespace, job, code, message)
        created = await self.k.post(pods, json=pod)
        assert created.status == 201, await created.text()
        await self.k.patch(f"{pods}/{pod['metadata']['name']}/status", json={"status": status}, headers=MERGE)

    def all_started(self) -> bool:
        return all(name in self.started_at for name in NAMES)

    def replacements(self, name: str) -> int:
        """Children the intent replaces: one for a resize and a re-plan, none for a probe."""
        return 1 if name in (RESIZE, OOM) and name in self.started_at else 0

    def converged(self, name: str, job: dict[str, Any] | None, status: dict[str, Any]) -> bool:
        """The intent is done: for a resize and a re-plan, a child other than the first, of the planned
        node count, mounting the planned plan, the change in planHistory; for a probe, the result in
        status.probe and in the plan's copy, on the child it started on."""
        if name not in self.started_at or job is None:
            return False
        plan, copy = self._plan(name), self._copy(name)
        if plan is None or copy is None:
            return False
        uid, first = job["metadata"]["uid"], self.first_child[name]
        if name == PROBE:
            copied = copy.probe.result if copy.probe is not None else None
            winners = ((status.get("probe") or {}).get("winner"), copied.winner if copied else None)
            return uid == first and winners == (self.winner, self.winner)
        reason = "Resized" if name == RESIZE else "OutOfMemory"
        history = [c.get("reason") for c in status.get("planHistory") or []]
        replicas = job["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"]
        wanted = POOL - 1 if name == RESIZE else plan.nodes
        return bool(
            uid != first
            and reason in history
            and replicas == wanted == plan.nodes == status.get("nodes")
            and (copy.nodes, copy.chosen) == (plan.nodes, plan.chosen)
        )

    def _copy(self, name: str) -> Plan | None:
        found = self.k.get_object("v1/configmaps", self.namespace, f"{name}-plan")
        return None if found is None else Plan.model_validate_json(found["data"][PLAN_FILE])


def faults_on(name: str, drawn: list[tuple[str, str, str, str, int, bool]]) -> dict[str, int]:
    """The chaos faults BTJ `name`'s writes met over the whole chaos (its first child's too), by request
    ("PATCH pytorchjobs", "DELETE pytorchjobs", "PATCH blackwelltrainingjobs/status"...; "+lost": the
    change applied, the answer lost)."""
    counts: dict[str, int] = {}
    for method, plural, subresource, obj, _, committed in drawn:
        if obj not in (name, f"{name}-plan") or method not in ("POST", "PATCH", "DELETE"):
            continue
        key = f"{method} {plural}{'/' + subresource if subresource else ''}{' +lost' if committed else ''}"
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))
