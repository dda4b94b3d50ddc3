"""Where a profiled GPU waits: the idle gaps of a torch.profiler Chrome trace and what the host was doing.

    python benchmarks/gpu_gaps.py trace.json [--min-us 20] [--top 30]

A kernel-time profile sums what the GPU ran; a step can still be slower than that sum, because the GPU
idles whenever the host has not queued the next kernel yet (a synchronising read, slow Python between
launches, a blocking allocator call). This reads the trace's GPU events (kernels, copies, memsets), finds
every stretch of at least ``--min-us`` with none running, and for each gap names the kernels on both
sides, whether the next kernel was launched only after the GPU had gone idle (host-bound), and the host
operations enclosing that launch (outermost first), plus any synchronising runtime call inside the gap.
The summary groups the idle time by the innermost enclosing operations, so one repeated cause shows up
as one line.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")
HOST_CATEGORIES = ("cpu_op", "user_annotation", "python_function")
# Runtime calls that block the host until the GPU (or a stream) has drained: a gap that holds one was
# made by the host waiting, then having to queue work again.
SYNCHRONISING = ("Synchronize", "cudaMemcpy ", "cudaMemcpy\x00", "cudaStreamWaitEvent")
CONTEXT_DEPTH = 2  # the innermost enclosing host operations that name a gap's group


@dataclass(frozen=True)
class Gap:
    """One stretch with no GPU work."""

    start_us: float
    us: float
    before: str  # the last kernel before it
    after: str  # the first kernel after it
    host_bound: bool  # the next kernel was launched only after the GPU went idle
    launch_stack: tuple[str, ...]  # host operations enclosing that launch, outermost first
    syncs: tuple[str, ...]  # synchronising runtime calls that overlap the gap

    @property
    def group(self) -> str:
        inner = self.launch_stack[-CONTEXT_DEPTH:] if self.launch_stack else ("(no host op)",)
        return " > ".join(inner)


def _is_sync(name: str) -> bool:
    return any(marker in name + "\x00" for marker in SYNCHRONISING)


def _enclosing(
    ops: list[dict[str, Any]], queries: list[tuple[Any, float]]
) -> dict[tuple[Any, float], tuple[str, ...]]:
    """For each (thread, time), the host operations of that thread running then, outermost first.

    One sweep per thread over its operations in start order, keeping those not yet ended: operations on
    one thread nest, so that set stays as small as the call depth.
    """
    by_tid: dict[Any, list[tuple[float, float, str]]] = defaultdict(list)
    for e in ops:
        ts = float(e["ts"])
        by_tid[e.get("tid")].append((ts, ts + float(e.get("dur", 0.0)), str(e["name"])))
    found: dict[tuple[Any, float], tuple[str, ...]] = {}
    for tid, times in _group(queries).items():
        spans = sorted(by_tid.get(tid, []))
        active: list[tuple[float, float, str]] = []
        i = 0
        for t in sorted(times):
            while i < len(spans) and spans[i][0] <= t:
                active = [a for a in active if a[1] >= spans[i][0]]
                active.append(spans[i])
                i += 1
            found[(tid, t)] = tuple(name for _, end, name in active if end >= t)
    return found


def _group(queries: list[tuple[Any, float]]) -> dict[Any, list[float]]:
    grouped: dict[Any, list[float]] = defaultdict(list)
    for tid, t in queries:
        grouped[tid].append(t)
    return grouped


def find_gaps(events: list[dict[str, Any]], min_us: float = 20.0) -> tuple[list[Gap], dict[str, float]]:
    """The trace's idle gaps of at least ``min_us`` and its totals: GPU busy, window and idle (µs)."""
    complete = [e for e in events if e.get("ph") == "X" and "ts" in e]
    gpu = sorted((e for e in complete if e.get("cat") in GPU_CATEGORIES), key=lambda e: float(e["ts"]))
    launches = {
        e.get("args", {}).get("correlation"): e for e in complete if e.get("cat") in LAUNCH_CATEGORIES
    }
    syncs = [e for e in complete if e.get("cat") in LAUNCH_CATEGORIES and _is_sync(str(e["name"]))]
    host_ops = [e for e in complete if e.get("cat") in HOST_CATEGORIES]
    # First the gaps and the launch that ended each; the host stacks of all launches in one sweep after.
    raw: list[tuple[float, float, str, dict[str, Any], dict[str, Any] | None]] = []
    busy = 0.0
    if not gpu:
        return [], {"busy_us": 0.0, "window_us": 0.0, "idle_us": 0.0}
    busy_until = float(gpu[0]["ts"])
    last_name = ""
    for e in gpu:
        ts, dur = float(e["ts"]), float(e.get("dur", 0.0))
        if ts - busy_until >= min_us:
            raw.append((busy_until, ts, last_name, e, launches.get(e.get("args", {}).get("correlation"))))
        # Busy time is the union of the kernels' intervals: streams may overlap.
        start = max(ts, busy_until)
        busy += max(0.0, ts + dur - start)
        if ts + dur > busy_until:
            busy_until, last_name = ts + dur, str(e["name"])
    stacks = _enclosing(host_ops, [(lo.get("tid"), float(lo["ts"])) for *_, lo in raw if lo is not None])
    gaps = []
    for idle_from, ts, before, e, launch in raw:
        stack = () if launch is None else stacks[(launch.get("tid"), float(launch["ts"]))]
        host_bound = launch is not None and float(launch["ts"]) > idle_from
        inside = tuple(
            str(s["name"])
            for s in syncs
            if float(s["ts"]) < ts and float(s["ts"]) + float(s.get("dur", 0.0)) > idle_from
        )
        gaps.append(Gap(idle_from, ts - idle_from, before, str(e["name"]), host_bound, stack, inside))
    window = busy_until - float(gpu[0]["ts"])
    return gaps, {"busy_us": busy, "window_us": window, "idle_us": window - busy}


def summarise(events: list[dict[str, Any]], min_us: float = 20.0, top: int = 30) -> dict[str, Any]:
    """Totals, the idle time grouped by the innermost host operations, and the largest gaps."""
    gaps, totals = find_gaps(events, min_us)
    groups: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for g in gaps:
        groups[g.group][0] += g.us
        groups[g.group][1] += 1
    return {
        **{k: round(v, 1) for k, v in totals.items()},
        "gaps_over_min_us": len(gaps),
        "gap_us_over_min": round(sum(g.us for g in gaps), 1),
        "host_bound_us": round(sum(g.us for g in gaps if g.host_bound), 1),
        "with_sync_us": round(sum(g.us for g in gaps if g.syncs), 1),
        "groups": [
            {"idle_us": round(us, 1), "gaps": int(n), "host_ops": name}
            for name, (us, n) in sorted(groups.items(), key=lambda kv: -kv[1][0])[:top]
        ],
        "largest": [
            {
                "us": round(g.us, 1),
                "before": g.before[:100],
                "after": g.after[:100],
                "host_bound": g.host_bound,
                "launch_stack": [s[:100] for s in g.launch_stack[-6:]],
                "syncs": list(g.syncs),
            }
            for g in sorted(gaps, key=lambda g: -g.us)[:top]
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("trace", type=Path)
    parser.add_argument("--min-us", type=float, default=20.0)
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    events = json.loads(args.trace.read_text()).get("traceEvents", [])
    print(json.dumps(summarise(events, args.min_us, args.top), indent=1))


if __name__ == "__main__":
    main()
