"""Operator soak: many BTJs, the operator killed at random moments, API faults at a high rate, then calm.

Against the hardened KMock API server (loopback only), with `btj run` as its own process:

1. `--jobs` BTJs are applied; a stand-in for the training operator marks every child Running, and every
   fifth BTJ's job then succeeds and is deleted at once (ttlSecondsAfterFinished: 0).
2. For `--chaos-s` seconds the API server answers a `--rate` share of the operator's requests with 409,
   429, 500, 503 or 504 (a quarter of them after applying the change: a lost answer) and delays every
   request by up to `--max-delay-s`; children of running BTJs are deleted by hand now and then; the
   operator is SIGKILLed every 2-6 s and started again after a pause.
3. Faults off, one last operator start: every BTJ must reach its documented state.

Three more BTJs carry the operator's multi-step intents through the faults and kills
(benchmarks/soak_intents.py): one resizes when a node of its pool is lost, one is re-planned when its
worker runs out of GPU memory, one adopts its probe's result; each must end on the child it intends.

It reports duplicates (children created beyond one per needed creation), finished jobs run again,
orphans (plan ConfigMaps without their job, children without their BTJ, children held Terminating),
the BTJs not converged, and the time from calm to the last one converging.

    python benchmarks/operator_soak.py --jobs 40 --chaos-s 60 --out benchmarks/results/operator_soak.json
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
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kmock

from blackwell_operator.testing.emulator import BTJ_RESOURCE, PYTORCHJOB_RESOURCE, Chaos, HardenedEmulator
from blackwell_operator.testing.kubeconfig import write_kubeconfig

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script, its own folder is on the path, not the repository
    sys.path.insert(0, str(ROOT))

from benchmarks import soak_intents  # noqa: E402

NAMESPACE = "soak"
BTJS = f"/apis/training.blackwell.dev/v1alpha1/namespaces/{NAMESPACE}/blackwelltrainingjobs"
JOBS = f"/apis/kubeflow.org/v1/namespaces/{NAMESPACE}/pytorchjobs"
FINALIZER = "training.blackwell.dev/final-status"
STATUSES = (409, 429, 500, 503, 504)
RUNNING = {
    "conditions": [{"type": "Running", "status": "True", "reason": "PyTorchJobRunning", "message": "ok"}]
}
SUCCEEDED = {
    "conditions": [
        {"type": "Running", "status": "False", "reason": "PyTorchJobSucceeded", "message": "done"},
        {"type": "Succeeded", "status": "True", "reason": "PyTorchJobSucceeded", "message": "done"},
    ]
}
MERGE = {"Content-Type": "application/merge-patch+json"}


def manifest(i: int) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": {"preset": "llama3.2-1b" if i % 2 else "llama3.1-8b"},
        "cluster": {"instanceType": "ml.p6-b200.48xlarge", "nodes": 1 + i % 2},
        "training": {"sequenceLength": 4096, "steps": 100},
    }
    if finishes(i):
        spec["ttlSecondsAfterFinished"] = 0
    return {
        "apiVersion": "training.blackwell.dev/v1alpha1",
        "kind": "BlackwellTrainingJob",
        "metadata": {"name": f"soak-{i:03d}", "namespace": NAMESPACE},
        "spec": spec,
    }


def finishes(i: int) -> bool:
    """Every fifth job succeeds (and its child is deleted at once, as a TTL of 0 does)."""
    return i % 5 == 0


class Soak:
    """The run's state: the emulator, the operator process, and what the stand-ins did."""

    def __init__(self, k: HardenedEmulator, jobs: int, rng: random.Random, env: dict[str, str], log: Path):
        self.k, self.jobs, self.rng, self.env, self.log = k, jobs, rng, env, log
        self.names = [f"soak-{i:03d}" for i in range(jobs)] + list(soak_intents.NAMES)
        self.intents = soak_intents.Intents(k, NAMESPACE)
        self.stand_in_errors: list[str] = []
        self.finishing = {f"soak-{i:03d}" for i in range(jobs) if finishes(i)}
        self.succeeded_at: dict[str, int] = {}  # name -> bus history length when its job succeeded
        self.hand_deleted: dict[str, int] = dict.fromkeys(self.names, 0)
        self.operator: subprocess.Popen[bytes] | None = None
        self.kills = 0
        self.watches = 0

    # ----- the operator process -----

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.operator = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    "import sys; from blackwell_operator.cli import main; "
                    "sys.argv = ['btj', 'run', '--metrics-bind', 'off']; main()",
                ],
                env=self.env,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )

    async def serving(self) -> None:
        """Wait until the operator just started watches BTJs (its start takes a few seconds of imports)."""
        before = self.watches
        while self._count_watches() <= before and self.operator is not None and self.operator.poll() is None:
            await asyncio.sleep(0.1)
        self.watches = self._count_watches()

    def _count_watches(self) -> int:
        return sum(
            1
            for r in self.k.requests
            if r.params.get("watch") in ("true", "1")
            and r.resource is not None
            and r.resource.plural == "blackwelltrainingjobs"
        )

    def kill(self) -> None:
        if self.operator is not None and self.operator.poll() is None:
            os.kill(self.operator.pid, signal.SIGKILL)  # no goodbye: a node lost, an OOM kill
            self.operator.wait()
            self.kills += 1

    async def stop(self) -> None:
        if self.operator is not None and self.operator.poll() is None:
            self.operator.terminate()
            try:
                await asyncio.to_thread(self.operator.wait, 30)
            except subprocess.TimeoutExpired:
                self.kill()

    # ----- the stand-ins: the training operator and a user -----

    async def training_operator(self) -> None:
        """Marks each new child Running; a finishing BTJ's running child succeeds and is deleted."""
        while True:
            for job in self.k.live_objects(PYTORCHJOB_RESOURCE, NAMESPACE):
                name, meta = job["metadata"]["name"], job["metadata"]
                if meta.get("deletionTimestamp"):
                    continue
                if not (job.get("status") or {}).get("conditions"):
                    await self.k.patch(f"{JOBS}/{name}/status", json={"status": RUNNING}, headers=MERGE)
                elif name in self.finishing and name not in self.succeeded_at:
                    await self.k.patch(f"{JOBS}/{name}/status", json={"status": SUCCEEDED}, headers=MERGE)
                    self.succeeded_at[name] = len(self._history())
                    await self.k.delete(f"{JOBS}/{name}")
            await asyncio.sleep(0.2)

    async def intent_starter(self) -> None:
        """Starts each intent once its BTJ's first child runs (soak_intents.Intents.step)."""
        while True:
            try:
                await self.intents.step()
            except Exception as exc:  # reported, and tried again: a stand-in that dies silently hides it
                self.stand_in_errors.append(repr(exc)[:300])
            await asyncio.sleep(0.2)

    async def user(self) -> None:
        """Deletes a running BTJ's child by hand every second or so."""
        while True:
            await asyncio.sleep(self.rng.uniform(0.5, 2.0))
            live = [
                j["metadata"]["name"]
                for j in self.k.live_objects(PYTORCHJOB_RESOURCE, NAMESPACE)
                if j["metadata"]["name"] not in self.finishing
                and j["metadata"]["name"] not in soak_intents.NAMES
                and not j["metadata"].get("deletionTimestamp")
            ]
            if live:
                name = self.rng.choice(live)
                response = await self.k.delete(f"{JOBS}/{name}")
                if response.status == 200:
                    self.hand_deleted[name] += 1

    # ----- judging -----

    def _history(self) -> list[dict[str, Any]]:
        return list(self.k._buses[kmock.resource(PYTORCHJOB_RESOURCE)].history)

    def converged(self, name: str) -> bool:
        btj = self.k.get_object(BTJ_RESOURCE, NAMESPACE, name) or {}
        status, meta = btj.get("status") or {}, btj.get("metadata") or {}
        job = self.k.get_object(PYTORCHJOB_RESOURCE, NAMESPACE, name)
        plan = self.k.get_object("v1/configmaps", NAMESPACE, f"{name}-plan")
        conds = {c["type"]: c for c in status.get("conditions") or []}
        if status.get("observedGeneration") != meta.get("generation"):
            return False
        if name in self.finishing and name in self.succeeded_at:
            return status.get("phase") == "Succeeded" and job is None and plan is None
        return bool(
            job is not None
            and not job["metadata"].get("deletionTimestamp")
            and (status.get("child") or {}).get("uid") == job["metadata"]["uid"]
            and conds.get("ChildCreated", {}).get("status") == "True"
            and status.get("phase") == "Running"
            and plan is not None
            and (name not in soak_intents.NAMES or self.intents.converged(name, job, status))
        )

    def state(self, name: str) -> dict[str, Any]:
        """What a BTJ says about itself, and its children's events (for a BTJ that went wrong)."""
        status = (self.k.get_object(BTJ_RESOURCE, NAMESPACE, name) or {}).get("status") or {}
        events = [
            (
                e.get("type"),
                e["object"]["metadata"].get("uid", "")[:8],
                bool(e["object"]["metadata"].get("deletionTimestamp")),
                [
                    c.get("type")
                    for c in (e["object"].get("status") or {}).get("conditions") or []
                    if c.get("status") == "True"
                ],
            )
            for e in self._history()
            if e["object"]["metadata"]["name"] == name
        ]
        return {
            "phase": status.get("phase"),
            "message": status.get("message"),
            "conditions": {c["type"]: c.get("reason") for c in status.get("conditions") or []},
            "child": (status.get("child") or {}).get("uid", "")[:8],
            "child_events": events,
            "succeeded_at": self.succeeded_at.get(name),
        }

    def report(self) -> dict[str, Any]:
        created: dict[str, list[int]] = {name: [] for name in self.names}
        for index, event in enumerate(self._history()):
            if event.get("type") == "ADDED":
                name = event["object"]["metadata"]["name"]
                if name in created and index not in created[name]:
                    created[name].append(index)
        uids: dict[str, set[str]] = {name: set() for name in self.names}
        for event in self._history():
            if event.get("type") == "ADDED" and event["object"]["metadata"]["name"] in uids:
                uids[event["object"]["metadata"]["name"]].add(event["object"]["metadata"]["uid"])
        needed = {name: 1 + self.hand_deleted[name] + self.intents.replacements(name) for name in self.names}
        duplicates = {n: len(uids[n]) - needed[n] for n in self.names if len(uids[n]) > needed[n]}
        reruns = {
            n: sum(1 for i in created[n] if i > self.succeeded_at[n])
            for n in self.succeeded_at
            if any(i > self.succeeded_at[n] for i in created[n])
        }
        jobs = self.k.live_objects(PYTORCHJOB_RESOURCE, NAMESPACE)
        job_names = {j["metadata"]["name"] for j in jobs}
        btj_uids = {b["metadata"]["uid"] for b in self.k.live_objects(BTJ_RESOURCE, NAMESPACE)}
        plans = [c["metadata"]["name"] for c in self.k.live_objects("v1/configmaps", NAMESPACE)]
        return {
            "duplicates": duplicates,
            "finished_jobs_run_again": reruns,
            "orphans": {
                "config_maps_without_job": sorted(
                    p for p in plans if p.removesuffix("-plan") not in job_names
                ),
                "children_without_btj": sorted(
                    j["metadata"]["name"]
                    for j in jobs
                    if not {r.get("uid") for r in j["metadata"].get("ownerReferences") or []} & btj_uids
                ),
                "children_held_terminating": sorted(
                    j["metadata"]["name"] for j in jobs if j["metadata"].get("deletionTimestamp")
                ),
            },
            "hand_deletions": sum(self.hand_deleted.values()),
            "children_created": sum(len(u) for u in uids.values()),
        }


@contextlib.asynccontextmanager
async def cluster() -> AsyncIterator[HardenedEmulator]:
    async with HardenedEmulator() as k, kmock.Server(k):
        k.declare_resources()
        await k.post("/api/v1/namespaces", json={"metadata": {"name": NAMESPACE}})
        for n in range(8):
            labels = {
                "node.kubernetes.io/instance-type": "ml.p6-b200.48xlarge",
                "sagemaker.amazonaws.com/node-health-status": "Schedulable",
            }
            await k.post("/api/v1/nodes", json={"metadata": {"name": f"node-{n}", "labels": labels}})
        for pool_node in soak_intents.pool_nodes():
            await k.post("/api/v1/nodes", json=pool_node)
        yield k


async def soak(
    jobs: int,
    chaos_s: float,
    rate: float,
    max_delay_s: float,
    converge_s: float,
    seed: int,
    keep_log: Path | None = None,
) -> dict[str, Any]:
    rng = random.Random(seed)
    async with cluster() as k:
        with tempfile.TemporaryDirectory() as tmp:
            kubeconfig = write_kubeconfig(Path(tmp) / "kubeconfig", str(k.url).rstrip("/"), name="soak")
            # The resync loop backs off to 2 s at most here (60 s by default), so that calm is reached
            # within the benchmark's time; the policy is the same.
            # The elastic loop looks every half second (30 s by default), so that the resize starts under
            # the faults.
            env = dict(
                os.environ,
                KUBECONFIG=str(kubeconfig),
                BTJ_CHILD_RETRY_INTERVAL_S="2",
                BTJ_ELASTIC_INTERVAL_S="0.5",
            )
            run = Soak(k, jobs, rng, env, Path(tmp) / "operator.log")
            k.chaos = Chaos(rate=rate, statuses=STATUSES, max_delay_s=max_delay_s, rng=random.Random(seed))
            stand_ins = [
                asyncio.create_task(run.training_operator()),
                asyncio.create_task(run.user()),
                asyncio.create_task(run.intent_starter()),
            ]
            run.start()
            try:
                for body in [*soak_intents.manifests(NAMESPACE), *(manifest(i) for i in range(jobs))]:
                    response = await k.post(BTJS, json=body)
                    assert response.status == 201, await response.text()
                chaos_start = time.monotonic()
                chaos_end = chaos_start + chaos_s
                # The faults last until every intent has started (its first child ran; 7-8 s into the
                # chaos on 2 busy cores, once over 20 s), 60 s more at most: an intent started after calm
                # would meet none of them.
                while time.monotonic() < chaos_end or (
                    not run.intents.all_started() and time.monotonic() < chaos_end + 60.0
                ):
                    await run.serving()
                    await asyncio.sleep(rng.uniform(1.0, 5.0))  # killed at a random moment of its work
                    run.kill()
                    await asyncio.sleep(rng.uniform(0.2, 1.5))
                    run.start()
                stand_ins[1].cancel()  # no more hand deletions
                injected, drawn = k.chaos.injected, k.chaos.drawn
                k.chaos = None
                calm = time.monotonic()
                run.kill()
                run.watches = run._count_watches()  # the killed one's watches do not count
                run.start()  # one last start, after the faults
                # The window opens once the operator watches again: its start-up (imports, warm-up) is not
                # what is judged, and on a loaded machine it alone took 40-50 s of the old window.
                await run.serving()
                serving = time.monotonic()
                waiting = set(run.names)
                converged_at: dict[str, float] = {}
                while waiting and time.monotonic() - serving < converge_s:
                    for name in sorted(waiting):
                        if run.converged(name):
                            converged_at[name] = time.monotonic() - calm
                            waiting.discard(name)
                    await asyncio.sleep(0.2)
                await asyncio.sleep(1.0)  # anything still moving after the last one converged?
                report = run.report()
                not_converged = sorted(n for n in run.names if not run.converged(n))
                details = {n: run.state(n) for n in not_converged + sorted(report["duplicates"])}
            except BaseException:
                sys.stderr.write(run.log.read_text()[-4000:])
                raise
            finally:
                if keep_log is not None:
                    keep_log.write_bytes(run.log.read_bytes())
                for task in stand_ins:
                    task.cancel()
                await run.stop()
            lines = run.log.read_text().splitlines()
            # Kopf's own lines are counted apart: each retried request of its own (at ERROR), and its
            # throttling when one of its own patches meets an injected conflict (a real API server does
            # not answer Kopf's merge patches with 409; the resync loop covers the event it drops).
            kopf_retries = sum(1 for line in lines if "Request attempt" in line)
            kopf_throttled = sum(1 for line in lines if "Throttling for" in line)
            # A handler that raised kopf.TemporaryError (an API error the policy gave up on, a previous
            # child still going): Kopf says so in one ERROR line, no traceback, and retries it.
            kopf_temporary = sum(1 for line in lines if "failed temporarily" in line)
            kopf_own = ("Request attempt", "Throttling for", "failed temporarily")
            errors = [
                line[:300] for line in lines if "[ERROR" in line and not any(k in line for k in kopf_own)
            ]
            tracebacks = sum(1 for line in lines if line.startswith("Traceback"))
    return {
        "jobs": jobs,
        "chaos_seconds": chaos_s,
        "chaos_seconds_run": round(calm - chaos_start, 1),
        "fault_rate": rate,
        "fault_statuses": list(STATUSES),
        "max_delay_seconds": max_delay_s,
        "faults_injected": injected,
        "operator_kills": run.kills,
        **report,
        "not_converged": not_converged,
        "details": details,
        "stand_in_errors": run.stand_in_errors[:5],
        "intents": {
            name: {
                "started_before_calm": name in run.intents.started_at and run.intents.started_at[name] < calm,
                "seconds_from_chaos_to_start": round(run.intents.started_at[name] - chaos_start, 1)
                if name in run.intents.started_at
                else None,
                "faults_on_its_requests": soak_intents.faults_on(name, drawn),
            }
            for name in soak_intents.NAMES
        },
        "seconds_from_calm_to_serving": round(serving - calm, 2),
        "seconds_from_calm_to_converged": {
            "median": round(sorted(converged_at.values())[len(converged_at) // 2], 2)
            if converged_at
            else None,
            "max": round(max(converged_at.values()), 2) if converged_at else None,
        },
        "operator_error_lines": len(errors),
        "kopf_request_retries_logged": kopf_retries,
        "kopf_throttled_on_injected_conflicts": kopf_throttled,
        "kopf_temporary_failures_logged": kopf_temporary,
        "tracebacks_logged": tracebacks,
        "operator_error_samples": errors[:5],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=40)
    parser.add_argument("--chaos-s", type=float, default=60.0)
    parser.add_argument("--rate", type=float, default=0.2)
    parser.add_argument("--max-delay-s", type=float, default=0.05)
    parser.add_argument("--converge-s", type=float, default=120.0)
    parser.add_argument("--seed", type=int, default=19)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--log", type=Path, help="keep the operator's log here")
    args = parser.parse_args()
    started = time.monotonic()
    result = asyncio.run(
        soak(args.jobs, args.chaos_s, args.rate, args.max_delay_s, args.converge_s, args.seed, args.log)
    )
    result.update(
        command=" ".join(["python", "benchmarks/operator_soak.py", *sys.argv[1:]]),
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
