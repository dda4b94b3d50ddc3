"""Operator load benchmark: N BTJs applied at once to the hardened KMock API server, served by `btj run`.

Measures, per BTJ, the time from its create (the API server's answer to the POST) to the operator's
create of its child job, and to its status being reconciled (observedGeneration and plan written);
the total time for all of them; and the operator process's resident memory (VmRSS now, VmHWM peak).
The operator runs as its own process (`btj run`), so its memory is its own, not the emulator's.

    python benchmarks/operator_load.py --count 500 --out benchmarks/results/operator_load.json
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

import kmock

from blackwell_operator.testing.emulator import BTJ_RESOURCE, HardenedEmulator
from blackwell_operator.testing.kubeconfig import write_kubeconfig

NAMESPACE = "hyperpod-ns-team-a"
PRESETS = [("llama3.2-1b", 1), ("llama3.1-8b", 2), ("qwen2.5-7b", 2), ("mistral-7b", 4)]


class TimedEmulator(HardenedEmulator):
    """Records when each child job create succeeded."""

    child_created: dict[str, float]

    async def _handle(self, request: Any) -> Any:
        response = await super()._handle(request)
        if (
            request.method == kmock.method.POST
            and request.resource is not None
            and request.resource.plural == "pytorchjobs"
            and isinstance(request.data, dict)
        ):
            self.child_created.setdefault(request.data["metadata"]["name"], time.monotonic())
        return response


# --profile: the operator under cProfile in every thread (Kopf runs the sync handlers in a thread pool,
# which a profiler of the main thread alone would miss), the stats of all threads merged into one file.
# Each profiler counts its thread's CPU time (time.thread_time), not wall time: in wall time the threads'
# waits on sockets, locks and queues hide what costs CPU.
PROFILE: Path | None = None
PROFILED = """
import cProfile, pstats, threading, time
profiles = [cProfile.Profile(time.thread_time)]
def _start(*_):
    sys.setprofile(None)
    profile = cProfile.Profile(time.thread_time)
    profiles.append(profile)
    profile.enable()
threading.setprofile(_start)
profiles[0].enable()
sys.argv = ['btj', 'run', '--metrics-bind', 'off']
try:
    main()
finally:
    for profile in profiles:
        profile.disable()
    stats = pstats.Stats(profiles[0])
    for profile in profiles[1:]:
        stats.add(profile)
    stats.dump_stats({out!r})
"""


def manifest(i: int) -> dict[str, Any]:
    preset, nodes = PRESETS[i % len(PRESETS)]
    return {
        "apiVersion": "training.blackwell.dev/v1alpha1",
        "kind": "BlackwellTrainingJob",
        "metadata": {"name": f"load-{i:04d}", "namespace": NAMESPACE},
        "spec": {
            "model": {"preset": preset},
            "cluster": {"instanceType": "ml.p6-b200.48xlarge", "nodes": nodes},
            "training": {"sequenceLength": 4096, "steps": 100},
        },
    }


def planner_milliseconds() -> dict[str, float]:
    """Mean planning time per BTJ of each spec in the mix (the operator's main CPU cost per reconcile)."""
    from blackwell_operator.models import BlackwellTrainingJobSpec
    from blackwell_operator.planner import plan_job

    out = {}
    for i in range(len(PRESETS)):
        spec = BlackwellTrainingJobSpec.model_validate(manifest(i)["spec"])
        plan_job(spec)
        start = time.perf_counter()
        for _ in range(5):
            plan_job(spec, job_name="bench")
        out[PRESETS[i][0]] = round((time.perf_counter() - start) / 5 * 1000, 1)
    return out


def memory_kib(pid: int) -> dict[str, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0])
    return fields


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process: a figure other load on the machine does not inflate much."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


async def main(count: int, timeout: float, idle_s: float = 0.0) -> dict[str, Any]:
    async with TimedEmulator() as k, kmock.Server(k):
        k.child_created = {}
        k.declare_resources()
        await k.post("/api/v1/namespaces", json={"metadata": {"name": NAMESPACE}})
        for n in range(16):
            await k.post(
                "/api/v1/nodes",
                json={
                    "metadata": {
                        "name": f"node-{n}",
                        "labels": {
                            "node.kubernetes.io/instance-type": "ml.p6-b200.48xlarge",
                            "sagemaker.amazonaws.com/node-health-status": "Schedulable",
                        },
                    }
                },
            )
        server = str(k.url).rstrip("/")
        with tempfile.TemporaryDirectory() as tmp:
            kubeconfig = write_kubeconfig(Path(tmp) / "kubeconfig", server, name="c")
            env = dict(os.environ, KUBECONFIG=str(kubeconfig))
            log = (Path(tmp) / "operator.log").open("wb")
            run = "sys.argv = ['btj', 'run', '--metrics-bind', 'off']; main()"
            if PROFILE is not None:
                run = PROFILED.format(out=str(PROFILE))
            operator = subprocess.Popen(
                [sys.executable, "-c", f"import sys; from blackwell_operator.cli import main; {run}"],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=log,
            )
            try:
                result = await _load(k, operator, count, timeout)
                if idle_s > 0:
                    result["idle_after"] = await _idle(operator, idle_s)
                return result
            except BaseException:
                sys.stderr.write((Path(tmp) / "operator.log").read_text()[-3000:])
                raise
            finally:
                # Kopf shuts down gracefully on SIGTERM and talks to the API server (this loop) meanwhile.
                operator.terminate()
                try:
                    await asyncio.to_thread(operator.wait, 30)
                except subprocess.TimeoutExpired:
                    operator.kill()


async def _idle(operator: subprocess.Popen[bytes], seconds: float) -> dict[str, Any]:
    """The operator's CPU while nothing changes, after the burst: what its loops cost per BTJ it knows."""
    before = cpu_seconds(operator.pid)
    await asyncio.sleep(seconds)
    used = cpu_seconds(operator.pid) - before
    return {
        "seconds": seconds,
        "operator_cpu_seconds": round(used, 2),
        "cpu_percent": round(100 * used / seconds, 1),
    }


async def _load(
    k: TimedEmulator, operator: subprocess.Popen[bytes], count: int, timeout: float
) -> dict[str, Any]:
    def watching() -> bool:
        return any(
            r.params.get("watch") == "true"
            and r.resource is not None
            and r.resource.plural == "blackwelltrainingjobs"
            for r in k.requests
        )

    deadline = time.monotonic() + 60
    while not watching():
        if time.monotonic() > deadline or operator.poll() is not None:
            raise RuntimeError("the operator did not start")
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)  # let the other watches settle
    idle = memory_kib(operator.pid)
    cpu_before = cpu_seconds(operator.pid)
    server_cpu_before = cpu_seconds(os.getpid())

    created: dict[str, float] = {}
    url = f"/apis/training.blackwell.dev/v1alpha1/namespaces/{NAMESPACE}/blackwelltrainingjobs"
    start = time.monotonic()
    for i in range(count):  # one client applying a folder, as fast as the server answers
        response = await k.post(url, json=manifest(i))
        assert response.status == 201, await response.text()
        created[f"load-{i:04d}"] = time.monotonic()
    applied = time.monotonic()

    reconciled: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    while len(reconciled) < count and time.monotonic() < deadline:
        for name in created:
            if name not in reconciled:
                obj = k.get_object(BTJ_RESOURCE, NAMESPACE, name) or {}
                status = obj.get("status") or {}
                if status.get("observedGeneration") == 1 and status.get("plan"):
                    reconciled[name] = time.monotonic()
        await asyncio.sleep(0.05)
    end = time.monotonic()
    memory = memory_kib(operator.pid)
    cpu = cpu_seconds(operator.pid) - cpu_before
    server_cpu = cpu_seconds(os.getpid()) - server_cpu_before
    child = [k.child_created[n] - created[n] for n in created if n in k.child_created]
    status_latency = [reconciled[n] - created[n] for n in reconciled]
    duplicates = sum(
        1
        for r in k.requests
        if r.method == kmock.method.POST and r.resource is not None and r.resource.plural == "pytorchjobs"
    ) - len(k.child_created)
    return {
        "btjs": count,
        "children_created": len(child),
        "reconciled": len(status_latency),
        "duplicate_child_creates": duplicates,
        "apply_seconds": round(applied - start, 3),
        "total_seconds_to_last_child": round(max(k.child_created.values()) - start, 3) if child else None,
        "total_seconds_to_last_status": round(max(reconciled.values()) - start, 3) if reconciled else None,
        "create_to_child_seconds": {
            "median": round(statistics.median(child), 3),
            "p99": round(percentile(child, 0.99), 3),
            "max": round(max(child), 3),
        },
        "create_to_status_seconds": {
            "median": round(statistics.median(status_latency), 3),
            "p99": round(percentile(status_latency, 0.99), 3),
            "max": round(max(status_latency), 3),
        },
        "operator_memory_mib": {
            "idle_rss": round(idle["VmRSS"] / 1024, 1),
            "rss_after": round(memory["VmRSS"] / 1024, 1),
            "peak_rss": round(memory["VmHWM"] / 1024, 1),
        },
        "wall_seconds": round(end - start, 3),
        "operator_cpu_seconds": round(cpu, 2),
        "operator_cpu_ms_per_btj": round(cpu / count * 1000, 1),
        "api_server_and_client_cpu_seconds": round(server_cpu, 2),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=500)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--profile", type=Path, help="write the operator's cProfile stats (every thread) here"
    )
    parser.add_argument(
        "--idle-s", type=float, default=0.0, help="then measure the operator's CPU for this long, idle"
    )
    args = parser.parse_args()
    PROFILE = args.profile
    load = os.getloadavg()[0]
    planning = planner_milliseconds()
    result = asyncio.run(main(args.count, args.timeout, args.idle_s))
    result["planner_wall_ms_per_btj"] = planning
    result["load_average_1m_at_end"] = os.getloadavg()[0]
    report = {
        "benchmark": "operator_load",
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": "python " + " ".join(sys.argv),
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "kopf": version("kopf"),
            "kmock": version("kmock"),
            "kubernetes_client": version("kubernetes"),
            # The 2-core machine is shared with other work: wall-clock figures stretch with this load,
            # operator_cpu_seconds much less.
            "load_average_1m_at_start": load,
            "note": "operator (`btj run`, own process) and the KMock API server share the machine's CPUs",
        },
        "setup": {
            "api_server": "hardened KMock 0.8 emulator (blackwell_operator.testing.emulator)",
            "btj_mix": [f"{p} x{n} nodes" for p, n in PRESETS],
            "nodes": "16 Schedulable ml.p6-b200.48xlarge",
            "apply": "one client POSTing all BTJs back to back",
        },
        "results": result,
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
