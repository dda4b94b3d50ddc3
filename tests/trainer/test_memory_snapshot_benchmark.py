"""benchmarks/memory_snapshot.py: the summary of a memory-history snapshot (the GPU records it; the summary is
pure, so a trace in torch's snapshot format is replayed here), and the worker recording nothing unasked."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from benchmarks import memory_snapshot
from benchmarks.memory_snapshot import ENV, summarise

from blackwell_operator.units import GIB


def _event(action: str, size: float, *, stream: int = 0, where: str = "") -> dict[str, object]:
    frames = [{"filename": f"/repo/{where}.py", "line": 7, "name": where}] if where else []
    frames.append({"filename": "??", "line": 0, "name": "c10::allocate"})  # a C++ frame: not listed
    return {"action": action, "addr": 0, "size": int(size * GIB), "stream": stream, "frames": frames}


def test_the_summary_replays_the_pool_and_names_growth_below_the_allocated_peak() -> None:
    trace = [
        _event("segment_map", 10, where="forward"),
        _event("alloc", 10),  # activations: the allocated peak, 10 GiB
        _event("free_requested", 10),
        _event("free_completed", 10),
        # 4 GiB allocated while 10 GiB sit free in the pool, and still the pool grows: fragmentation
        _event("segment_map", 4, stream=7, where="optimizer"),
        _event("alloc", 4, stream=7),
        _event("free_completed", 4, stream=7),
        _event("segment_unmap", 2),
    ]
    snapshot = {
        "segments": [{"stream": 0, "total_size": 8 * GIB}, {"stream": 7, "total_size": 4 * GIB}],
        "device_traces": [trace],
    }
    got = summarise(snapshot)
    assert got["trace_events"] == len(trace) and not got["truncated"]
    assert got["reserved_peak_bytes"] == 14 * GIB
    assert got["allocated_at_reserved_peak_bytes"] == 0  # the pool peaked before the 4 GiB landed
    assert got["allocated_peak_bytes"] == 10 * GIB
    assert got["growth_below_allocated_peak_bytes"] == 4 * GIB
    assert got["reserved_at_end_by_stream"] == {"0": 8 * GIB, "7": 4 * GIB}
    first = got["growth"][0]  # the largest pool after it first
    assert (first["bytes"], first["stream"], first["reserved_after"]) == (4 * GIB, 7, 14 * GIB)
    assert first["frames"] == ["/repo/optimizer.py:7 optimizer"]


def test_an_empty_snapshot_summarises_to_zeros() -> None:
    got = summarise({"segments": [], "device_traces": []})
    assert got["reserved_peak_bytes"] == got["allocated_peak_bytes"] == 0
    assert got["growth"] == []


def test_nothing_is_recorded_unasked(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(ENV, raising=False)
    assert memory_snapshot.start() is None
    memory_snapshot.dump(None, "run")  # nothing to write, nothing raised
    # Asked on a machine without CUDA: nothing to record either, and no folder made.
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv(ENV, str(tmp_path / "snap"))
    assert memory_snapshot.start() is None
    assert not (tmp_path / "snap").exists()
