"""Elastic soak: elastic BTJs train while their nodes are lost and regained at random; every step once.

Against the hardened KMock API server (loopback only), with `btj run` as its own process:

1. `--jobs` elastic BTJs (minNodes 2, maxNodes 4, scaleUp, a 1 s grace period and a 2 s cooldown), each
   on a pool of four nodes of its own instance type, are applied.
2. A stand-in plays the training operator and the trainer: each child it sees resumes from its BTJ's last
   checkpoint, trains one global step every `--step-s` while every node its plan needs is schedulable,
   and checkpoints every `--checkpoint-every` steps; only a checkpoint commits the steps before it, so a
   child deleted by a resize loses the steps since, which its successor trains again, as the real trainer
   does. At the last step it reports the job Succeeded.
3. For `--chaos-s` seconds one node of a random pool is lost (made Unschedulable) or regained every
   0.5-3 s, now and then below minNodes; then every node comes back and each job must finish.

It reports, per BTJ, whether it Succeeded, the committed steps (each step's global batch must be trained
exactly once: every step from 1 to `--steps`, none twice, all with the spec's global batch), the node
counts it trained on, and its resizes.

    python benchmarks/elastic_soak.py --jobs 3 --chaos-s 60 --out benchmarks/results/elastic_soak.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kmock

from blackwell_operator.nodelabels import INSTANCE_TYPE_LABEL, NODE_HEALTH_LABEL, SCHEDULABLE
from blackwell_operator.render.environment import PLAN_FILE
from blackwell_operator.testing.emulator import BTJ_RESOURCE, PYTORCHJOB_RESOURCE, HardenedEmulator
from blackwell_operator.testing.kubeconfig import write_kubeconfig

NAMESPACE = "elastic-soak"
BTJS = f"/apis/training.blackwell.dev/v1alpha1/namespaces/{NAMESPACE}/blackwelltrainingjobs"
JOBS = f"/apis/kubeflow.org/v1/namespaces/{NAMESPACE}/pytorchjobs"
MERGE = {"Content-Type": "application/merge-patch+json"}
# One pool of nodes per job, each of its own instance type, so the jobs never share a node.
INSTANCE_TYPES = ("ml.p6-b200.48xlarge", "ml.p5en.48xlarge", "ml.p5.48xlarge", "ml.p5e.48xlarge")
POOL = 4
SEQUENCE = 4096
# 768 sequences divide over 16, 24 and 32 GPUs: every count of the range trains the same global batch.
GLOBAL_BATCH = 768 * SEQUENCE
RUNNING = {
    "conditions": [{"type": "Running", "status": "True", "reason": "PyTorchJobRunning", "message": "ok"}]
}
SUCCEEDED = {
    "conditions": [
        {"type": "Running", "status": "False", "reason": "PyTorchJobSucceeded", "message": "done"},
        {"type": "Succeeded", "status": "True", "reason": "PyTorchJobSucceeded", "message": "done"},
    ]
}


def manifest(i: int, steps: int) -> dict[str, Any]:
    return {
        "apiVersion": "training.blackwell.dev/v1alpha1",
        "kind": "BlackwellTrainingJob",
        "metadata": {"name": f"elastic-{i}", "namespace": NAMESPACE},
        "spec": {
            "model": {"preset": "llama3.2-1b"},
            "volumes": [{"name": "fsx", "claimName": "fsx-claim", "mountPath": "/fsx"}],
            "cluster": {
                "instanceType": INSTANCE_TYPES[i],
                "nodes": POOL,
                "elastic": {
                    "minNodes": 2,
                    "maxNodes": POOL,
                    "gracePeriodSeconds": 1,
                    "cooldownSeconds": 2,
                    "scaleUp": True,
                },
            },
            "training": {
                "sequenceLength": SEQUENCE,
                "globalBatchTokens": GLOBAL_BATCH,
                "steps": steps,
                "checkpoint": {"path": f"/fsx/checkpoints/elastic-{i}"},
            },
        },
    }


def node_name(job: int, index: int) -> str:
    return f"pool-{job}-node-{index}"


@dataclass
class Run:
    """One child's run of the simulated trainer: where it resumed, what it trained since its checkpoint."""

    plan: dict[str, Any]
    step: int
    pending: list[tuple[int, int, int]] = field(default_factory=list)  # (step, global batch, nodes)


@dataclass
class Job:
    """What the simulated trainer keeps of one BTJ: its checkpoint and the steps checkpoints committed."""

    index: int
    checkpoint: int = 0
    committed: list[tuple[int, int, int]] = field(default_factory=list)
    runs: dict[str, Run] = field(default_factory=dict)  # child uid -> its run
    succeeded: bool = False
    stalls: int = 0  # ticks a child waited for a lost node


class ElasticSoak:
    """The run's state: the emulator, the operator process, the simulated trainers and the node chaos."""

    def __init__(
        self, k: HardenedEmulator, jobs: int, steps: int, rng: random.Random, args: dict[str, float]
    ):
        self.k, self.steps, self.rng = k, steps, rng
        self.step_s, self.checkpoint_every = args["step_s"], int(args["checkpoint_every"])
        self.jobs = {f"elastic-{i}": Job(i) for i in range(jobs)}
        self.healthy = {i: set(range(POOL)) for i in range(jobs)}
        self.node_changes = 0
        self.operator: subprocess.Popen[bytes] | None = None

    # ----- the simulated training operator and trainer -----

    def _plan(self, name: str) -> dict[str, Any] | None:
        config = self.k.get_object("v1/configmaps", NAMESPACE, f"{name}-plan")
        text = ((config or {}).get("data") or {}).get(PLAN_FILE)
        return json.loads(text) if text else None

    async def trainer(self) -> None:
        """Every tick, each live child trains one step if its nodes are there; checkpoints commit."""
        while True:
            live = {j["metadata"]["name"]: j for j in self.k.live_objects(PYTORCHJOB_RESOURCE, NAMESPACE)}
            for name, job in self.jobs.items():
                child = live.get(name)
                uid = (child or {}).get("metadata", {}).get("uid")
                if child is None or child["metadata"].get("deletionTimestamp"):
                    job.runs.clear()  # the child is gone: its steps since the checkpoint with it
                    continue
                run = job.runs.get(uid)
                if run is None:
                    plan = self._plan(name)
                    replicas = child["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"]
                    if plan is None or plan["nodes"] != replicas:
                        continue  # the ConfigMap is written before the child; wait for it
                    job.runs = {uid: Run(plan, job.checkpoint)}  # resumes from the last checkpoint
                    run = job.runs[uid]
                    await self.k.patch(f"{JOBS}/{name}/status", json={"status": RUNNING}, headers=MERGE)
                if job.succeeded:
                    continue
                if run.plan["nodes"] > len(self.healthy[job.index]):
                    job.stalls += 1  # a worker's node is gone: torchrun's rendezvous waits
                    continue
                run.step += 1
                run.pending.append((run.step, run.plan["globalBatchTokens"], run.plan["nodes"]))
                if run.step % self.checkpoint_every == 0 or run.step == self.steps:
                    job.committed.extend(run.pending)
                    run.pending.clear()
                    job.checkpoint = run.step
                if run.step == self.steps:
                    job.succeeded = True
                    await self.k.patch(f"{JOBS}/{name}/status", json={"status": SUCCEEDED}, headers=MERGE)
            await asyncio.sleep(self.step_s)

    # ----- the nodes -----

    async def set_health(self, job: int, index: int, healthy: bool) -> None:
        labels = {NODE_HEALTH_LABEL: SCHEDULABLE if healthy else "Unschedulable"}
        response = await self.k.patch(
            f"/api/v1/nodes/{node_name(job, index)}", json={"metadata": {"labels": labels}}, headers=MERGE
        )
        assert response.status == 200, await response.text()
        (self.healthy[job].add if healthy else self.healthy[job].discard)(index)
        self.node_changes += 1

    async def chaos(self) -> None:
        """One node of a random pool lost or regained every 0.5-3 s (at least one node always stays)."""
        while True:
            await asyncio.sleep(self.rng.uniform(0.5, 3.0))
            job = self.rng.choice(sorted(self.healthy))
            up = self.healthy[job]
            down = set(range(POOL)) - up
            if down and (len(up) <= 1 or self.rng.random() < 0.5):
                await self.set_health(job, self.rng.choice(sorted(down)), True)
            elif len(up) > 1:
                await self.set_health(job, self.rng.choice(sorted(up)), False)

    # ----- the operator process -----

    def start(self, env: dict[str, str], log: Path) -> None:
        with log.open("ab") as out:
            self.operator = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    "import sys; from blackwell_operator.cli import main; "
                    "sys.argv = ['btj', 'run', '--metrics-bind', 'off']; main()",
                ],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=out,
            )

    async def stop(self) -> None:
        if self.operator is not None and self.operator.poll() is None:
            self.operator.terminate()
            try:
                await asyncio.to_thread(self.operator.wait, 30)
            except subprocess.TimeoutExpired:
                self.operator.kill()
                self.operator.wait()

    # ----- judging -----

    def finished(self, name: str) -> bool:
        status = (self.k.get_object(BTJ_RESOURCE, NAMESPACE, name) or {}).get("status") or {}
        return bool(status.get("phase") == "Succeeded")

    def report(self) -> dict[str, Any]:
        jobs: dict[str, Any] = {}
        for name, job in self.jobs.items():
            status = (self.k.get_object(BTJ_RESOURCE, NAMESPACE, name) or {}).get("status") or {}
            steps = [s for s, _, _ in job.committed]
            resizes = [
                (e.get("nodesBefore"), e.get("nodesAfter"))
                for e in status.get("planHistory") or []
                if e.get("reason") == "Resized"
            ]
            jobs[name] = {
                "phase": status.get("phase"),
                "steps_committed": len(steps),
                "every_step_once": steps == list(range(1, self.steps + 1)),
                "steps_trained_twice": sorted({s for s in steps if steps.count(s) > 1}),
                "steps_missing": sorted(set(range(1, self.steps + 1)) - set(steps)),
                "global_batches": sorted({g for _, g, _ in job.committed}),
                "node_counts_trained_on": sorted({n for _, _, n in job.committed}),
                "resizes": (status.get("elastic") or {}).get("resizes", 0),
                "resizes_in_history": resizes,
                "ticks_stalled_on_a_lost_node": job.stalls,
                "message": status.get("message"),
            }
        return jobs


@contextlib.asynccontextmanager
async def cluster(jobs: int) -> AsyncIterator[HardenedEmulator]:
    async with HardenedEmulator() as k, kmock.Server(k):
        k.declare_resources()
        await k.post("/api/v1/namespaces", json={"metadata": {"name": NAMESPACE}})
        for job in range(jobs):
            for index in range(POOL):
                labels = {INSTANCE_TYPE_LABEL: INSTANCE_TYPES[job], NODE_HEALTH_LABEL: SCHEDULABLE}
                body = {"metadata": {"name": node_name(job, index), "labels": labels}}
                response = await k.post("/api/v1/nodes", json=body)
                assert response.status == 201, await response.text()
        yield k


async def elastic_soak(
    jobs: int, steps: int, chaos_s: float, finish_s: float, seed: int, *, step_s: float, checkpoint_every: int
) -> dict[str, Any]:
    """Run the soak; the report of every job and of the run."""
    if not 1 <= jobs <= len(INSTANCE_TYPES):
        raise ValueError(f"--jobs must be 1 to {len(INSTANCE_TYPES)} (one instance type each)")
    rng = random.Random(seed)
    async with cluster(jobs) as k:
        with tempfile.TemporaryDirectory() as tmp:
            kubeconfig = write_kubeconfig(Path(tmp) / "kubeconfig", str(k.url).rstrip("/"), name="soak")
            # The loops look often here (30 s and 60 s by default) so that a soak of a minute sees many
            # resizes; the decisions are the same.
            env = dict(
                os.environ,
                KUBECONFIG=str(kubeconfig),
                BTJ_ELASTIC_INTERVAL_S="0.2",
                BTJ_CHILD_RETRY_INTERVAL_S="2",
            )
            log = Path(tmp) / "operator.log"
            run = ElasticSoak(k, jobs, steps, rng, {"step_s": step_s, "checkpoint_every": checkpoint_every})
            run.start(env, log)
            tasks = [asyncio.create_task(run.trainer())]
            started = time.monotonic()
            try:
                for i in range(jobs):
                    response = await k.post(BTJS, json=manifest(i, steps))
                    assert response.status == 201, await response.text()
                tasks.append(asyncio.create_task(run.chaos()))
                await asyncio.sleep(chaos_s)
                tasks[1].cancel()
                for job in range(jobs):  # calm: every node back
                    for index in sorted(set(range(POOL)) - run.healthy[job]):
                        await run.set_health(job, index, True)
                calm = time.monotonic()
                while time.monotonic() - calm < finish_s and not all(map(run.finished, run.jobs)):
                    await asyncio.sleep(0.2)
                report = run.report()
            except BaseException:
                sys.stderr.write(log.read_text()[-4000:])
                raise
            finally:
                for task in tasks:
                    task.cancel()
                await run.stop()
            lines = log.read_text().splitlines()
            errors = [line[:300] for line in lines if "[ERROR" in line]
            tracebacks = sum(1 for line in lines if line.startswith("Traceback"))
    return {
        "jobs": jobs,
        "steps": steps,
        "chaos_seconds": chaos_s,
        "node_changes": run.node_changes,
        "seconds_to_finish": round(time.monotonic() - started, 1),
        "all_succeeded": all(j["phase"] == "Succeeded" for j in report.values()),
        "every_step_once": all(j["every_step_once"] for j in report.values()),
        "one_global_batch": all(j["global_batches"] == [GLOBAL_BATCH] for j in report.values()),
        "resizes": sum(j["resizes"] for j in report.values()),
        "per_job": report,
        "operator_error_lines": len(errors),
        "tracebacks_logged": tracebacks,
        "operator_error_samples": errors[:5],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--chaos-s", type=float, default=60.0)
    parser.add_argument("--finish-s", type=float, default=120.0)
    parser.add_argument("--step-s", type=float, default=0.1)
    parser.add_argument("--checkpoint-every", type=int, default=5)
    parser.add_argument("--seed", type=int, default=27)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    started = time.monotonic()
    result = asyncio.run(
        elastic_soak(
            args.jobs,
            args.steps,
            args.chaos_s,
            args.finish_s,
            args.seed,
            step_s=args.step_s,
            checkpoint_every=args.checkpoint_every,
        )
    )
    result.update(
        command=" ".join(["python", "benchmarks/elastic_soak.py", *sys.argv[1:]]),
        date=datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        machine=f"{platform.machine()}, {os.cpu_count()} CPUs (shared), Python {platform.python_version()}",
        wall_seconds=round(time.monotonic() - started, 1),
    )
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
