"""benchmarks/trainer_ab_h200.py's pure parts: the allocator replay by category and the A/B summary."""

from __future__ import annotations

from typing import Any

from benchmarks import trainer_ab_h200 as ab

from blackwell_trainer.plan.units import GIB


def _alloc(addr: int, gib: float, *names: str, filename: str = "x.py") -> dict[str, Any]:
    frames = [{"filename": filename, "name": n, "line": 1} for n in names]
    return {"action": "alloc", "addr": addr, "size": int(gib * GIB), "frames": frames}


def _free(addr: int, gib: float) -> dict[str, Any]:
    return {"action": "free_completed", "addr": addr, "size": int(gib * GIB)}


def test_the_allocator_replay_reports_live_bytes_by_category_at_the_peak() -> None:
    trace = [
        _alloc(1, 4, "init_weights"),
        _alloc(2, 8, "_init_group"),
        _alloc(3, 2, "forward", filename="blackwell_trainer/model/transformer.py"),
        _alloc(4, 1, "forward", filename="blackwell_trainer/model/loss.py"),
        _free(4, 1),
        _alloc(5, 3, "backward", filename="torch/_functorch/runtime_wrappers.py"),  # the peak: 17 GiB
        _free(3, 2),
        _free(5, 3),
        _alloc(6, 0.5, "randint"),
        _alloc(7, 1),  # no Python frames: autograd's device thread
    ]
    snapshot = {"device_traces": [trace], "segments": [{"total_size": 20 * GIB}]}
    report = ab.memory_categories(snapshot)
    assert report["peak_live_gib"] == 17.0 and report["trace_events"] == len(trace)
    assert report["by_category_gib"] == {
        "optimizer state": 8.0,
        "parameters": 4.0,
        "backward thread (gradients, backward temporaries)": 3.0,
        "activations (forward)": 2.0,
    }
    assert report["reserved_at_snapshot_gib"] == 20.0


def _record(label: str, tokens: float, losses: list[float], **extra: Any) -> ab.Result:
    config = {"model": "3b-untied", "mbs": 2, "recipe": "none", "warmup": 1, "timed": 2}
    name = f"3b-untied-g1-mbs2-none-bf16-{label}"
    return ab.Result(name, "", config, "ok", tokens_per_s=tokens, losses=losses, **extra)


def test_the_summary_pairs_each_single_device_run_with_its_fsdp_twin() -> None:
    rows = ab.summary(
        [
            _record("single", 110.0, [2.0, 1.5, 1.0, 9.0], toggle_tokens_per_s={"both": 121.0}),
            _record("fsdp", 100.0, [2.0, 1.5, 1.1]),
            _record("single-profiled", 50.0, [2.0]),  # slowed by the allocator's history: not a row
        ]
    )
    (row,) = rows
    assert row["variant"] == "single"
    assert row["speedup"] == 1.1 and row["toggles_speedup"] == {"both": 1.1}
    # Over the warm-up and timed steps both ran (3 here): the last differs by 0.1 in 1.1.
    assert row["loss_max_rel_diff_first_steps"] == round(0.1 / 1.1, 6)


def test_the_fp8_all_gather_summary_pairs_each_float8_gather_with_its_bf16_gather_twin() -> None:
    def fp8(label: str, tokens: float, losses: list[float], reserved: float) -> ab.Result:
        config = {"model": "1b-untied", "mbs": 4, "recipe": "torchao-tensorwise", "warmup": 1, "timed": 2}
        name = f"1b-untied-g1-mbs4-none-fp8-tensorwise-{label}"
        return ab.Result(
            name, "", config, "ok", tokens_per_s=tokens, losses=losses, peak_reserved_gib=reserved
        )

    records = [
        fp8("fsdp", 100.0, [2.0, 1.5, 1.0, 0.8], 40.0),
        fp8("fsdp-fp8gather", 105.0, [2.0, 1.5, 1.0, 0.88, 0.5], 38.5),
        _record("fsdp", 90.0, [2.0]),  # BF16: no float8 gather to compare
    ]
    (row,) = ab.fp8_all_gather_summary(records)
    assert row["speedup"] == 1.05
    assert (row["bf16_gather_reserved_gib"], row["fp8_gather_reserved_gib"]) == (40.0, 38.5)
    # Over every step both ran (4): the last differs by 0.08 in 0.8.
    assert row["steps_compared"] == 4 and row["loss_max_rel_diff"] == 0.1
    assert row["loss_first_step_rel_diff"] == 0.0 and row["loss_rel_diff_per_step"] == [0.0, 0.0, 0.0, 0.1]
    assert ab.summary(records) == []  # not a single-device row
