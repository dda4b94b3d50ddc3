"""Stand-ins for the controllers that move a child job on a cluster (Kueue, the training operator, the
scheduler, the kubelet), for `btj demo`: every decision follows the job as rendered and the emulated nodes.

They are deliberately simple and say so: Kueue's quota is taken to be the nodes that can hold a worker
(one resource flavor, no other workloads), the scheduler places one worker per node (the job's pod
anti-affinity) on a node whose labels match its nodeSelector and whose allocatable holds its requests,
and the job is Running only once every worker is (torchrun's rendezvous waits for all of them: minReplicas
equals maxReplicas). Condition types and reasons are the Kubeflow training operator's (Created, Suspended,
Running, Succeeded; `<Kind><Type>`); HyperPod's job controller is played the same way. A TrainJob
(Kubeflow Trainer v2) has only Suspended and Complete conditions; its running pods show in
status.jobsStatus, as Trainer v2 reports its JobSet's Jobs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from blackwell_operator.discovery.capacity import parse_quantity
from blackwell_operator.render import hyperpod, pytorchjob, trainjob
from blackwell_operator.render.kinds import BATCH_JOB, JOBSET, ChildKind, job_kind
from blackwell_operator.render.labels import KUEUE_QUEUE_LABEL
from blackwell_operator.testing.emulator import HardenedEmulator
from blackwell_operator.timefmt import now_rfc3339

MERGE_PATCH = {"Content-Type": "application/merge-patch+json"}


@dataclass(frozen=True)
class Workers:
    """What the job asks the scheduler for: replicas of one pod template."""

    replica: str  # the replica name (Worker, pods)
    count: int
    template: Mapping[str, Any]

    @property
    def requests(self) -> Mapping[str, Any]:
        (container,) = self.template["spec"]["containers"]  # the operator renders one trainer container
        requests: Mapping[str, Any] = container.get("resources", {}).get("requests", {})
        return requests


def workers_of(job: Mapping[str, Any], runtime: Mapping[str, Any] | None = None) -> Workers:
    """The worker replicas of a PyTorchJob, HyperPodPyTorchJob or TrainJob (whose pod template is in its
    TrainingRuntime, `runtime`); ValueError for another kind."""
    spec = job["spec"]
    if job["kind"] == trainjob.KIND:
        if runtime is None:
            raise ValueError(f"the TrainingRuntime of TrainJob {job['metadata']['name']} is missing")
        (replicated,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
        template = replicated["template"]["spec"]["template"]
        return Workers(str(replicated["name"]), int(spec["trainer"]["numNodes"]), template)
    if job["kind"] == pytorchjob.KIND:
        worker = spec["pytorchReplicaSpecs"]["Worker"]
        return Workers("Worker", int(worker["replicas"]), worker["template"])
    if job["kind"] == hyperpod.KIND:
        (replica,) = spec["replicaSpecs"]
        return Workers(str(replica["name"]), int(replica["replicas"]), replica["template"])
    raise ValueError(f"the demo cannot play the controller of a {job['kind']}")


@dataclass(frozen=True)
class Placement:
    """Where the scheduler would put the workers: the nodes that can hold one, and why the rest cannot."""

    workers: int
    nodes: tuple[str, ...]  # at most one per worker
    total_nodes: int
    why_not: str = ""

    @property
    def complete(self) -> bool:
        return len(self.nodes) == self.workers


def short_resource(node: Mapping[str, Any], requests: Mapping[str, Any]) -> str | None:
    """The first requested resource the node's allocatable cannot hold; None when all fit. A node that
    publishes no allocatable holds nothing (the operator's capacity check is lenient there, as advice;
    the scheduler is not)."""
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    for resource, wanted in requests.items():
        if parse_quantity(allocatable.get(resource, 0)) < parse_quantity(wanted):
            return str(resource)
    return None


def place(workers: Workers, nodes: Sequence[Mapping[str, Any]]) -> Placement:
    """One worker per node that matches the nodeSelector, is not cordoned and whose allocatable holds the
    requests; the reason, in the scheduler's words, for workers left over."""
    selector: Mapping[str, str] = workers.template["spec"].get("nodeSelector") or {}
    unmatched, short, fitting = 0, dict[str, int](), list[str]()
    for node in nodes:
        labels = node.get("metadata", {}).get("labels") or {}
        cordoned = bool((node.get("spec") or {}).get("unschedulable"))
        if cordoned or any(labels.get(key) != value for key, value in selector.items()):
            unmatched += 1
            continue
        resource = short_resource(node, workers.requests)
        if resource:
            short[resource] = short.get(resource, 0) + 1
        else:
            fitting.append(str(node["metadata"]["name"]))
    chosen = tuple(fitting[: workers.count])
    if len(chosen) == workers.count:
        return Placement(workers.count, chosen, len(nodes))
    reasons = []
    if unmatched:
        reasons.append(f"{unmatched} node(s) didn't match Pod's node affinity/selector")
    reasons += [f"{count} Insufficient {resource}" for resource, count in sorted(short.items())]
    if chosen:
        reasons.append(f"{len(chosen)} node(s) didn't match pod anti-affinity rules (taken by this job)")
    why = f"0/{len(nodes)} nodes are available: " + ", ".join(reasons or ["no nodes"]) + "."
    return Placement(workers.count, chosen, len(nodes), why)


def _controller_ref(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A controller owner reference to `obj`, as controllers write them (blockOwnerDeletion set)."""
    meta = obj["metadata"]
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


@dataclass
class Move:
    """One thing a controller does: what it says, the BTJ phase it leads to, and the API calls."""

    says: str
    expect: str
    apply: Callable[[], Awaitable[None]]


@dataclass
class ControllerStandIn:
    """Plays Kueue, the training operator, the scheduler and the kubelet for one child job."""

    emulator: HardenedEmulator
    job: Mapping[str, Any]
    steps: int
    conditions: list[dict[str, str]] = field(default_factory=list)

    @property
    def _name(self) -> str:
        return str(self.job["metadata"]["name"])

    @property
    def _namespace(self) -> str:
        return str(self.job["metadata"]["namespace"])

    def _collection(self) -> str:
        row = job_kind(self.job["kind"])
        if row is None:
            raise ValueError(f"the demo cannot play the controller of a {self.job['kind']}")
        return f"/apis/{row.api_version}/namespaces/{self._namespace}/{row.plural}"

    def _condition(self, kind: str, status: str, reason: str, message: str) -> None:
        now = now_rfc3339()
        self.conditions = [c for c in self.conditions if c["type"] != kind]
        self.conditions.append(
            {
                "type": kind,
                "status": status,
                "reason": f"{self.job['kind']}{reason}",
                "message": message,
                "lastUpdateTime": now,
                "lastTransitionTime": now,
            }
        )

    async def _send(self, method: str, path: str, body: Mapping[str, Any]) -> None:
        headers = MERGE_PATCH if method == "PATCH" else None
        response = await self.emulator.request(method, path, json=dict(body), headers=headers)
        if response.status >= 400:
            payload = await response.json()
            raise RuntimeError(f"{method} {path}: HTTP {response.status}: {payload.get('message')}")

    async def _write_status(self) -> None:
        path = f"{self._collection()}/{self._name}/status"
        await self._send("PATCH", path, {"status": {"conditions": self.conditions}})

    @property
    def _trainjob(self) -> bool:
        return bool(self.job["kind"] == trainjob.KIND)

    def _pod_name(self, workers: Workers, index: int) -> str:
        if self._trainjob:  # JobSet: <jobset>-<replicated job>-<job index>-<pod index>
            return f"{self._name}-{workers.replica}-0-{index}"
        return f"{self._name}-{workers.replica.lower()}-{index}"

    async def _jobs_status(self, workers: Workers, *, ready: int, succeeded: int) -> None:
        """A TrainJob's status.jobsStatus: its one replicated job's pods, as Trainer v2 reports them."""
        entry = {
            "name": workers.replica,
            "ready": ready,
            "succeeded": succeeded,
            "failed": 0,
            "active": ready,
        }
        path = f"{self._collection()}/{self._name}/status"
        await self._send("PATCH", path, {"status": {"conditions": self.conditions, "jobsStatus": [entry]}})

    async def _owned(self, kind: ChildKind, name: str, owner: Mapping[str, Any]) -> dict[str, Any]:
        """Create one object of `kind` controlled by `owner`; its controller reference for the next."""
        collection = f"/apis/{kind.api_version}/namespaces/{self._namespace}/{kind.plural}"
        body = {
            "apiVersion": kind.api_version,
            "kind": kind.kind,
            "metadata": {"name": name, "namespace": self._namespace, "ownerReferences": [owner]},
        }
        response = await self.emulator.request("POST", collection, json=body)
        made = await response.json()
        if response.status >= 400:
            raise RuntimeError(f"POST {collection}: HTTP {response.status}: {made.get('message')}")
        return _controller_ref(made)

    async def _pod_owner(self, workers: Workers) -> dict[str, Any]:
        """The controller reference the worker pods carry: the job itself, or for a TrainJob the Job of the
        JobSet it controls (Trainer v2: TrainJob -> JobSet -> Job -> Pod)."""
        owner = _controller_ref(self.job)
        if self._trainjob:
            jobset = await self._owned(JOBSET, self._name, owner)
            owner = await self._owned(BATCH_JOB, f"{self._name}-{workers.replica}-0", jobset)
        return owner

    async def _create_pods(self, workers: Workers, placement: Placement) -> None:
        owner = await self._pod_owner(workers)
        pods = f"/api/v1/namespaces/{self._namespace}/pods"
        for index in range(workers.count):
            name = self._pod_name(workers, index)
            metadata = dict(workers.template.get("metadata") or {})
            spec = dict(workers.template["spec"])
            if index < len(placement.nodes):
                spec["nodeName"] = placement.nodes[index]
            body = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {**metadata, "name": name, "ownerReferences": [owner]},
                "spec": spec,
            }
            await self._send("POST", pods, body)
            if index < len(placement.nodes):
                status: dict[str, Any] = {
                    "phase": "Running",
                    "conditions": [{"type": "PodScheduled", "status": "True"}],
                    "containerStatuses": [
                        {"name": "pytorch", "ready": True, "state": {"running": {"startedAt": now_rfc3339()}}}
                    ],
                }
            else:
                status = {
                    "phase": "Pending",
                    "conditions": [
                        {
                            "type": "PodScheduled",
                            "status": "False",
                            "reason": "Unschedulable",
                            "message": placement.why_not,
                        }
                    ],
                }
            await self._send("PATCH", f"{pods}/{name}/status", {"status": status})

    async def _finish_pods(self, workers: Workers) -> None:
        pods = f"/api/v1/namespaces/{self._namespace}/pods"
        for index in range(workers.count):
            terminated = {"exitCode": 0, "reason": "Completed", "finishedAt": now_rfc3339()}
            status = {
                "phase": "Succeeded",
                "containerStatuses": [
                    {"name": "pytorch", "ready": False, "state": {"terminated": terminated}}
                ],
            }
            await self._send("PATCH", f"{pods}/{self._pod_name(workers, index)}/status", {"status": status})

    def moves(
        self,
        nodes: Sequence[Mapping[str, Any]],
        runtime: Mapping[str, Any] | None = None,
        service_accounts: Collection[str] = ("default",),
    ) -> tuple[list[Move], str]:
        """What happens to the job on these nodes, in order, and, when it cannot run, why it waits
        (`runtime`: a TrainJob's TrainingRuntime; `service_accounts`: those of the job's namespace)."""
        workers = workers_of(self.job, runtime)
        placement = place(workers, nodes)
        kind, qualified = self.job["kind"], f"{self._namespace}/{self._name}"
        queue = (self.job["metadata"].get("labels") or {}).get(KUEUE_QUEUE_LABEL)
        moves: list[Move] = []

        async def created() -> None:
            if not self._trainjob:  # Trainer v2 has no Created condition
                self._condition("Created", "True", "Created", f"{kind} {self._name} is created.")
            if queue:
                self._condition("Suspended", "True", "Suspended", f"{kind} {self._name} is suspended.")
            await self._write_status()

        if queue:
            moves.append(
                Move(
                    f"Kueue holds it in LocalQueue {queue} (suspended) until its ClusterQueue admits it",
                    "Queued",
                    created,
                )
            )
            if not placement.complete:
                return moves, (
                    f"Kueue keeps it suspended: the quota here is the {len(placement.nodes)} node(s) that "
                    f"can hold a worker, the job needs {workers.count}. It runs when nodes are added."
                )

            async def admitted() -> None:
                self._condition("Suspended", "False", "Resumed", f"{kind} {self._name} is resumed.")
                await self._write_status()

            moves.append(
                Move(f"Kueue admits it: {workers.count} node(s) within the quota", "Pending", admitted)
            )
        else:
            maker = "Kubeflow Trainer (its JobSet)" if self._trainjob else "the training operator"
            moves.append(Move(f"{maker} takes the job: {workers.count} worker pod(s)", "Pending", created))

        account = str(workers.template["spec"].get("serviceAccountName") or "default")
        if account not in service_accounts:
            # The API server refuses a pod whose ServiceAccount does not exist, so no pod is created and
            # the job stays Pending (the training operator records the error in its Events).
            return moves, (
                f"no worker pod can be created: serviceaccount {account!r} does not exist in namespace "
                f"{self._namespace} (create it first, with its IAM role: docs/install.md)"
            )

        if not placement.complete:

            async def pending() -> None:
                await self._create_pods(workers, placement)

            placed = len(placement.nodes)
            moves.append(
                Move(
                    f"the scheduler places {placed} of {workers.count} worker(s); the rest stay Pending: "
                    f"{placement.why_not}",
                    "Pending",
                    pending,
                )
            )
            return moves, (
                f"the job waits for capacity: {workers.count} worker(s), {placed} can be placed. torchrun's "
                "rendezvous needs every worker, so no step runs until nodes are added or freed."
            )

        async def running() -> None:
            await self._create_pods(workers, placement)
            if self._trainjob:
                await self._jobs_status(workers, ready=workers.count, succeeded=0)
                return
            self._condition("Running", "True", "Running", f"{kind} {qualified} is running.")
            await self._write_status()

        async def succeeded() -> None:
            await self._finish_pods(workers)
            if self._trainjob:
                self._condition("Complete", "True", "JobsCompleted", f"{kind} {qualified} is completed.")
                await self._jobs_status(workers, ready=0, succeeded=workers.count)
                return
            self._condition("Running", "False", "Succeeded", f"{kind} {qualified} successfully completed.")
            self._condition("Succeeded", "True", "Succeeded", f"{kind} {qualified} successfully completed.")
            await self._write_status()

        moves.append(
            Move(f"the scheduler binds the workers to {', '.join(placement.nodes)}", "Running", running)
        )
        moves.append(
            Move(
                f"the workers run {self.steps} steps (spec.training.steps; emulated, no GPU) and exit 0",
                "Succeeded",
                succeeded,
            )
        )
        return moves, ""
