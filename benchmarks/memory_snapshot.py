"""Where a run's caching-allocator pool grew past what it held: its memory history, recorded and summarised.

With ``BTJ_BENCH_MEMORY_SNAPSHOT=DIR`` set, ``benchmarks/trainer_h200.py``'s worker (and so every run of this
trainer that ``titan_side_by_side.py`` launches) records the allocator's history from before the model is
built and, when the run ends (an OOM included), writes:

- ``DIR/<run>.pickle``: ``torch.cuda.memory._snapshot()``, which https://pytorch.org/memory_viz draws;
- ``DIR/<run>.json``: ``summarise()`` of it: the reserved and allocated peaks, the pool per stream, and the
  moments the pool grew, each with what was allocated then and the Python frames of the allocation that made
  it grow. A pool that ends well above the allocated peak (``bf16_gradients``' 2-6 GiB on one H100,
  docs/benchmarks/titan_h100.md) shows there as growth while the allocated bytes were below their peak.

Nothing is recorded without the variable, or without CUDA.
"""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path
from typing import Any

ENV = "BTJ_BENCH_MEMORY_SNAPSHOT"
MAX_ENTRIES = 2_000_000  # trace events kept; a 3B run of 20 steps makes a few hundred thousand
GROWTH_KEPT = 12  # growth events listed in the summary, largest pool after them first
FRAMES_KEPT = 8  # Python frames listed per growth event, innermost first
# Trace actions that change the pool (expandable segments map and unmap; plain segments alloc and free).
POOL_UP = ("segment_alloc", "segment_map")
POOL_DOWN = ("segment_free", "segment_unmap")


def start() -> Path | None:
    """Record the allocator's history when ``ENV`` names a folder and CUDA is there; the folder, or None."""
    folder = os.environ.get(ENV, "")
    if not folder:
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    torch.cuda.memory._record_memory_history(max_entries=MAX_ENTRIES)
    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    return path


def dump(folder: Path | None, name: str) -> None:
    """Write the snapshot and its summary for run ``name`` (nothing when ``start`` recorded nothing)."""
    if folder is None:
        return
    import torch

    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    with (folder / f"{name}.pickle").open("wb") as handle:
        pickle.dump(snapshot, handle)
    (folder / f"{name}.json").write_text(json.dumps(summarise(snapshot), indent=1))


def _python_frames(event: dict[str, Any]) -> list[str]:
    """The event's frames in this repository's and torch's Python code, innermost first."""
    frames = [f for f in event.get("frames", []) if str(f.get("filename", "")).endswith(".py")]
    return [f"{f['filename']}:{f['line']} {f['name']}" for f in frames[:FRAMES_KEPT]]


def summarise(snapshot: dict[str, Any]) -> dict[str, Any]:
    """The pool's and the allocations' peaks from device 0's trace, the pool per stream at the end, and the
    moments the pool grew (largest pool after them first).

    The trace is replayed from its first event, so it must hold the whole run (``MAX_ENTRIES``); a trace that
    filled its buffer is said to be truncated and its peaks are then relative to where it starts.
    """
    traces = snapshot.get("device_traces") or [[]]
    trace: list[dict[str, Any]] = traces[0]
    reserved = allocated = 0
    reserved_peak = allocated_peak = allocated_at_reserved_peak = 0
    growth: list[dict[str, Any]] = []
    for event in trace:
        action, size = event.get("action"), int(event.get("size", 0))
        if action in POOL_UP:
            reserved += size
            growth.append({
                "bytes": size,
                "stream": event.get("stream", 0),
                "reserved_after": reserved,
                "allocated_then": allocated,
                "frames": _python_frames(event),
            })  # fmt: skip
        elif action in POOL_DOWN:
            reserved -= size
        elif action == "alloc":
            allocated += size
        elif action == "free_completed":
            allocated -= size
        if reserved > reserved_peak:
            reserved_peak, allocated_at_reserved_peak = reserved, allocated
        allocated_peak = max(allocated_peak, allocated)
    streams: dict[str, int] = {}
    for segment in snapshot.get("segments", []):
        key = str(segment.get("stream", 0))
        streams[key] = streams.get(key, 0) + int(segment.get("total_size", 0))
    growth.sort(key=lambda g: -g["reserved_after"])
    return {
        "trace_events": len(trace),
        "truncated": len(trace) >= MAX_ENTRIES,
        "reserved_peak_bytes": reserved_peak,
        "allocated_at_reserved_peak_bytes": allocated_at_reserved_peak,
        "allocated_peak_bytes": allocated_peak,
        "reserved_at_end_by_stream": streams,
        # Growth while less than the allocated peak was held: room the pool had to add beside free blocks.
        "growth_below_allocated_peak_bytes": sum(
            g["bytes"] for g in growth if g["allocated_then"] + g["bytes"] < allocated_peak
        ),
        "growth": growth[:GROWTH_KEPT],
    }
