"""benchmarks/gpu_gaps.py: the GPU's idle gaps in a profiler trace and the host operations behind each.

The GPU run is `benchmarks/trainer_h200.py`'s profile (docs/benchmarks/titan_h100.md); here a trace written
by hand in the Chrome format torch.profiler exports, and a real CPU-only trace, which has no GPU events.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from benchmarks.gpu_gaps import find_gaps, summarise


def _op(name: str, ts: float, dur: float, cat: str = "cpu_op", tid: int = 1) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid}


def _kernel(name: str, ts: float, dur: float, corr: int) -> dict[str, Any]:
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": 7,
            "args": {"correlation": corr}}  # fmt: skip


def _launch(ts: float, corr: int, name: str = "cudaLaunchKernel") -> dict[str, Any]:
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "ts": ts, "dur": 5.0, "pid": 1, "tid": 1,
            "args": {"correlation": corr}}  # fmt: skip


def _step() -> list[dict[str, Any]]:
    """Two steps' worth: a forward kernel, a host-bound wait in the optimizer, a sync at the step's end."""
    return [
        _op("ProfilerStep#1", 0, 2000, cat="user_annotation"),
        _op("forward", 0, 200),
        _launch(10, 1),
        _kernel("gemm_fwd", 20, 300, 1),  # busy 20-320
        _launch(30, 2),
        _kernel("gemm_bwd", 320, 100, 2),  # back to back: no gap
        _op("Optimizer.step", 400, 600),
        _op("aten::_foreach_mul_", 700, 50),
        _launch(720, 3),  # launched after the GPU went idle at 420: host-bound, 300 us
        _kernel("adam", 720, 80, 3),
        _launch(805, 4, name="cudaStreamSynchronize"),
        _op("aten::item", 1000, 400),
        _launch(1010, 5, name="cudaMemcpyAsync"),
        _kernel("Memcpy DtoH", 1010, 5, 5),  # 210 us after adam: below a 250 us floor, above 20
        _op("forward", 1500, 100),
        _launch(1510, 6),
        _kernel("gemm_fwd", 1520, 300, 6),  # 505 us after the copy, launched inside `forward`
        _kernel("overlapping", 1600, 100, 99),  # another stream, inside the busy span: adds no busy time
    ]


def test_gaps_are_the_stretches_without_any_gpu_event() -> None:
    gaps, totals = find_gaps(_step(), min_us=20)
    assert [(g.start_us, g.us) for g in gaps] == [(420, 300), (800, 210), (1015, 505)]
    assert totals == {"busy_us": 300 + 100 + 80 + 5 + 300, "window_us": 1820 - 20, "idle_us": 1015.0}
    assert find_gaps(_step(), min_us=250)[0] == [gaps[0], gaps[2]]


def test_each_gap_names_its_kernels_and_the_host_operations_around_its_launch() -> None:
    gaps, _ = find_gaps(_step())
    wait = gaps[0]
    assert (wait.before, wait.after) == ("gemm_bwd", "adam")
    assert wait.host_bound
    assert wait.launch_stack == ("ProfilerStep#1", "Optimizer.step", "aten::_foreach_mul_")
    assert wait.group == "Optimizer.step > aten::_foreach_mul_"
    # The step's end: the synchronising call inside the gap is named.
    assert gaps[1].syncs == ("cudaStreamSynchronize",)
    assert gaps[2].launch_stack == ("ProfilerStep#1", "forward")
    assert not gaps[2].syncs


def test_a_launch_queued_before_the_gpu_went_idle_is_not_host_bound() -> None:
    events = [_launch(0, 1), _kernel("a", 10, 100, 1), _launch(20, 2), _kernel("b", 200, 10, 2)]
    (gap,), _ = find_gaps(events)
    assert gap.us == 90 and not gap.host_bound and gap.launch_stack == ()
    assert gap.group == "(no host op)"


def test_the_summary_groups_idle_time_by_cause_and_keeps_the_largest_gaps(tmp_path: Path) -> None:
    summary = summarise(_step(), min_us=20, top=2)
    assert summary["idle_us"] == 1015.0
    assert summary["host_bound_us"] == 300 + 210 + 505
    assert summary["with_sync_us"] == 210
    assert [g["host_ops"] for g in summary["groups"]] == [
        "ProfilerStep#1 > forward",
        "Optimizer.step > aten::_foreach_mul_",
    ]
    assert [g["us"] for g in summary["largest"]] == [505, 300]
    json.dumps(summary)  # what the profile writes


def test_a_real_cpu_trace_reads_as_no_gpu_time(tmp_path: Path) -> None:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        torch.ones(64, 64) @ torch.ones(64, 64)
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    summary = summarise(json.loads(path.read_text())["traceEvents"])
    assert summary["window_us"] == 0.0 and summary["groups"] == [] and summary["largest"] == []


# ------------------------------------------------------------- benchmarks/profile_side_by_side.py's parts


def test_kernels_are_summed_by_name_and_category() -> None:
    from benchmarks.profile_side_by_side import kernel_summary, trace_kernels

    instant = {"ph": "i", "cat": "kernel", "name": "instant", "ts": 1}  # not a complete event: no time
    events = [*_step(), _op("aten::mm", 0, 5), instant]
    kernels = sorted(trace_kernels(events))
    assert kernels == [
        ("Memcpy DtoH", 5.0, 1),
        ("adam", 80.0, 1),
        ("gemm_bwd", 100.0, 1),
        ("gemm_fwd", 600.0, 2),
        ("overlapping", 100.0, 1),
    ]
    summary = kernel_summary(kernels)
    assert summary["total_ms"] == pytest.approx(0.885, abs=0.01)
    assert summary["categories_ms"] == pytest.approx(
        {
            "matmul": 0.7,  # the gemm kernels
            "other (eager elementwise, copies, reductions)": 0.105,  # the copy and "overlapping"
            "optimizer": 0.08,
        },
        abs=0.01,
    )
    assert list(summary["categories_ms"]) == [
        "matmul",
        "other (eager elementwise, copies, reductions)",
        "optimizer",
    ]
    assert [k["kernel"] for k in summary["largest"]][:2] == ["gemm_fwd", "gemm_bwd"]


def test_torchtitans_last_profiling_cycle_is_read_by_its_step_not_its_name(tmp_path: Path) -> None:
    from benchmarks.profile_side_by_side import TITAN_PROFILE_ARGS, last_trace

    assert last_trace(tmp_path) is None
    for step in (10, 20, 100):
        folder = tmp_path / "profile_traces" / f"iteration_{step}"
        folder.mkdir(parents=True)
        (folder / "rank0_trace.json").write_text("{}")
    assert last_trace(tmp_path) == tmp_path / "profile_traces" / "iteration_100" / "rank0_trace.json"
    # Two traced steps a cycle, the cycle as long as torchtitan's log interval (what call A ran).
    assert TITAN_PROFILE_ARGS[TITAN_PROFILE_ARGS.index("--profiling.profiler_active") + 1] == "2"


def test_a_profiled_worker_brings_its_kernel_list_and_gaps_back(tmp_path: Path) -> None:
    """trainer_h200's grid copies the profile's small JSON files out of the worker's folder (CPU, tiny)."""
    import time

    from benchmarks import trainer_h200

    cfg = trainer_h200.Config(model="tiny", mbs=1, compile=False, warmup=1, timed=1, profile=True)
    rec = trainer_h200.Grid(tmp_path, time.time() + 300, gpus=1).run_one(cfg, [0])
    assert rec.status == "ok", rec.detail
    gaps = json.loads((tmp_path / f"gaps_{cfg.name}.json").read_text())
    assert gaps["idle_us"] == 0.0  # no GPU on this machine: no GPU events, no gaps
    assert (tmp_path / f"kernels_{cfg.name}.json").exists()
    assert not list(tmp_path.glob("trace_*.json"))  # the trace is summarised, not kept


def test_the_profile_call_runs_each_trainer_once_a_row_and_skips_what_the_budget_cannot_hold(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """main's loop, the launches replaced: the pair's two runs, an `ours-` row's one, then the budget."""
    import sys

    from benchmarks import profile_side_by_side as script

    monkeypatch.setattr(script.side, "environment", lambda argv, card: {"device": "NVIDIA H100 80GB HBM3"})
    monkeypatch.setattr(script.side, "ensure_assets", lambda assets: None)
    clock = iter(range(0, 10_000, 100))  # every launch takes 100 s of the budget
    monkeypatch.setattr(script.time, "time", lambda: float(next(clock)))
    monkeypatch.setattr(script, "profile_ours", lambda p, o, d: {"who": "ours", "status": "ok"})
    monkeypatch.setattr(script, "profile_titan", lambda p, a, d: {"who": "titan", "status": "ok"})
    argv = ["x", "--card", "h100", "--configs", "3b-bf16-b2,ours-1b-fp8-b4,3b-fp8-b2", "--out", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", [*argv, "--budget-s", "440"])
    script.main()
    runs = json.loads((tmp_path / "profile_side_by_side_h100.json").read_text())["runs"]
    assert [(r["config"], r["who"], r["status"]) for r in runs] == [
        ("3b-bf16-b2", "ours", "ok"),
        ("3b-bf16-b2", "titan", "ok"),
        ("ours-1b-fp8-b4", "ours", "ok"),
        ("3b-fp8-b2", "ours", "skipped (budget)"),
        ("3b-fp8-b2", "titan", "skipped (budget)"),
    ]
    with pytest.raises(SystemExit, match="--card h200"):
        monkeypatch.setattr(
            sys, "argv", ["x", "--card", "h200", "--configs", "3b-bf16-b2", "--out", str(tmp_path)]
        )
        script.main()
