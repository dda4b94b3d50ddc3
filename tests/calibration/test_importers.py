"""Earlier measurements become records: the reference grid YAML and trainer_h200.py result files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from blackwell_operator.calibrate.importers import from_reference_grid, from_trainer_h200
from blackwell_operator.calibrate.records import RecordStatus

REFERENCE_GRID = Path(__file__).resolve().parents[1] / "planner" / "data" / "h200_reference_grid.yaml"


def test_reference_grid() -> None:
    if not REFERENCE_GRID.exists():
        pytest.skip("tests/planner/data/h200_reference_grid.yaml is absent")
    records = from_reference_grid(REFERENCE_GRID)
    assert len(records) == 26 and sum(r.oom for r in records) == 6
    first = records[0]
    assert first.trainer == "h200-reference" and first.model_name == "llama3.2-1b"
    assert first.candidate.loss_chunk_tokens == 0 and not first.candidate.compile
    assert first.peak_reserved_bytes == round(32.0 * 2**30) and first.tokens_per_second_per_gpu == 38377
    assert records[-1].gpus == 2 and records[-1].peak_reserved_bytes is None


def test_trainer_h200_results(tmp_path: Path) -> None:
    def rec(name: str, status: str, **cfg: object) -> dict[str, object]:
        config = {
            "model": "3b",
            "mbs": 4,
            "ac": "none",
            "precision": "bf16",
            "recipe": "none",
            "gpus": 1,
            "compile": True,
            "loss_chunk": 8192,
            "sdpa": "default",
            "kind": "train",
        }
        config.update(cfg)
        return {
            "name": name,
            "config": config,
            "status": status,
            "tokens_per_s_per_gpu": 25000.0 if status == "ok" else None,
            "step_seconds": [0.66, 0.65, 0.67],
            "peak_allocated_gib": 60.0,
            "peak_reserved_gib": 70.0,
            "losses": [11.9, 11.5],
            "detail": "",
        }

    data = {
        "meta": {
            "date_utc": "2026-11-29T23:00:00Z",
            "torch": "2.11.0+cu130",
            "device": "NVIDIA H200",
            "torchao": "0.17.0",
            "sequence_length": 4096,
            "command": "benchmarks/trainer_h200.py --grid one",
        },
        "records": [
            rec("check", "ok", kind="check"),
            rec("3b", "ok"),
            rec(
                "8b fp8",
                "oom",
                model="8b",
                precision="fp8",
                recipe="torchao-tensorwise",
                ac="full",
                gpus=2,
                mbs=8,
            ),
            rec("cudnn", "ok", sdpa="cudnn"),
            rec("late", "skipped"),
        ],
    }
    path = tmp_path / "trainer_h200.json"
    path.write_text(json.dumps(data))
    records = from_trainer_h200(path)
    assert [r.status for r in records] == [RecordStatus.OK, RecordStatus.OOM]
    ok, oom = records
    assert ok.model_name == "llama3.2-3b" and ok.step_time_seconds == 0.66 and ok.loss == 11.5
    assert (
        ok.peak_reserved_bytes == 70 * 2**30
        and ok.versions.torchao == "0.17.0"
        and ok.gpu_name == "NVIDIA H200"
    )
    assert oom.gpus == 2 and oom.candidate.shard_degree == 2 and oom.peak_reserved_bytes is None
    assert oom.key == "llama3.1-8b_s4096_g2_fp8-torchao-tensorwise_ac-full_shard-full_mbs8"


RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def test_trainer_ab_h200_keeps_each_paths_default_run_and_says_which_path_ran() -> None:
    from blackwell_operator.calibrate.importers import from_result_file

    records = from_result_file(RESULTS / "trainer_ab_h200.json")
    # 15 processes ran: the profiled one, 3 recast and 2 fused variants are left out (switches the
    # planner does not model; the profiler's allocator history is not a speed figure).
    assert len(records) == 9
    single = [r for r in records if r.single_device_path]
    assert len(single) == 5 and {r.model_name for r in records} == {
        "llama3.2-3b-untied",
        "llama3.2-1b-untied",
    }
    prefix = "llama3.2-3b-untied_s4096_g1_bf16_ac-none_shard-full_mbs2"
    bf16_b2 = {r.single_device_path: r for r in records if r.key.startswith(prefix)}
    assert (
        bf16_b2[True].tokens_per_second_per_gpu == 22807.5
        and bf16_b2[False].tokens_per_second_per_gpu == 21786.1
    )
    assert bf16_b2[True].key.endswith("_single") and not bf16_b2[False].key.endswith("_single")
    assert bf16_b2[True].architecture.parameter_count() == 3_606_752_256
    assert not bf16_b2[True].architecture.tie_word_embeddings
    assert bf16_b2[True].alloc_retries == 0 and bf16_b2[True].gpu_name == "NVIDIA H200"


def test_titan_h200_takes_this_trainers_side_on_the_path_its_meta_names(tmp_path: Path) -> None:
    from blackwell_operator.calibrate.importers import from_result_file

    records = from_result_file(RESULTS / "titan_h200_1b_best.json")
    assert len(records) == 4 and all(r.single_device_path for r in records)
    assert all(r.source == "titan_h200" for r in records)
    by_key = {r.key: r for r in records}
    fp8 = by_key["llama3.2-1b-untied_s4096_g1_fp8-torchao-tensorwise_ac-none_shard-full_mbs4_single"]
    assert fp8.architecture.parameter_count() == 1_498_482_688
    assert round(fp8.tokens_per_second_per_gpu or 0) == 69677  # torchtitan's own figure is not taken
    # A file whose meta does not name the path ran this trainer's default before 2026-12-02: FSDP2.
    data = json.loads((RESULTS / "titan_h200_1b_best.json").read_text())
    del data["meta"]["ours_tuning"]
    path = tmp_path / "titan_h200.json"
    path.write_text(json.dumps(data))
    assert not any(r.single_device_path for r in from_result_file(path))
    # Files written since name every switch resolved (titan_h200.py's meta), the opt-out included.
    cases = (("single_device=fsdp,compile_mode=default", False), ("single_device=auto", True))
    for resolved, single in cases:
        data["meta"]["ours_tuning"] = resolved
        path.write_text(json.dumps(data))
        assert all(r.single_device_path is single for r in from_result_file(path))


def test_trainer_h200_path_comes_from_the_files_trainer_tuning(tmp_path: Path) -> None:
    """trainer_h200.py's files say in meta.trainer_tuning which path one GPU ran; the importer reads it."""
    from blackwell_operator.calibrate.importers import from_result_file

    records = from_result_file(RESULTS / "trainer_h200_single.json")
    # Ten runs under BTJ_TRAINER_TUNING=single_device=auto; the packed chat run under a document mask is
    # left out (a record cannot describe the mask).
    assert len(records) == 9 and all(r.single_device_path and r.key.endswith("_single") for r in records)
    assert all(r.source == "trainer_h200" and r.gpus == 1 for r in records)
    by_key = {r.key: r for r in records}
    full = by_key["llama3.1-8b_s4096_g1_bf16_ac-full_shard-full_mbs2_single"]
    assert round(full.tokens_per_second_per_gpu or 0) == 8802  # not the docmask run's 9,044

    def rewritten(tuning: str | None, **cfg: object) -> Path:
        data = json.loads((RESULTS / "trainer_h200_single.json").read_text())
        if tuning is None:
            del data["meta"]["trainer_tuning"]
        else:
            data["meta"]["trainer_tuning"] = tuning
        for rec in data["records"]:
            rec["config"].update(cfg)
        path = tmp_path / "trainer_h200.json"
        path.write_text(json.dumps(data))
        return path

    # The opt-out, the script's resolved form, and a file from before the key (FSDP2, the only path then).
    assert not any(r.single_device_path for r in from_result_file(rewritten("single_device=fsdp")))
    resolved = "single_device=auto,compile_mode=default,clip_in_optimizer=False,parameter_check=True"
    assert all(r.single_device_path for r in from_result_file(rewritten(resolved)))
    assert not any(r.single_device_path for r in from_result_file(rewritten(None)))
    # Two GPUs shard whatever the switch says: FSDP2.
    assert not any(r.single_device_path for r in from_result_file(rewritten("single_device=auto", gpus=2)))
    # "the trainer's defaults" names no path (the default changed on 2026-12-02): refused, not assumed.
    with pytest.raises(ValueError, match="does not say whether one GPU ran"):
        from_result_file(rewritten("the trainer's defaults"))
    with pytest.raises(ValueError, match="single_device takes one of"):
        from_result_file(rewritten("single_device=maybe"))


def test_trainer_h200_te_runs_keep_fsdp2_on_one_rank(tmp_path: Path) -> None:
    data = json.loads((RESULTS / "trainer_h200_te.json").read_text())
    data["meta"]["trainer_tuning"] = "single_device=auto"
    path = tmp_path / "trainer_h200_te.json"
    path.write_text(json.dumps(data))
    records = from_trainer_h200(path)
    te = [r for r in records if r.candidate.precision_recipe.value not in ("none", "torchao-tensorwise")]
    assert te and not any(r.single_device_path for r in te)
    assert all(r.single_device_path for r in records if r.gpus == 1 and r not in te)


def test_records_name_the_gpu_their_file_ran_on(tmp_path: Path) -> None:
    """An H100 side by side imports as H100 records (the instance the H100 grid records use), a file that
    names no device as the H200 every such file ran on, and a GPU the catalog does not know is refused."""
    from blackwell_operator.calibrate.importers import H200_INSTANCE, from_result_file

    h100 = from_result_file(RESULTS / "titan_side_by_side_h100.json")
    assert h100 and {r.instance_type for r in h100} == {"ml.p5.48xlarge"}
    assert {r.gpu_name for r in h100} == {"NVIDIA H100 80GB HBM3"}
    data = json.loads((RESULTS / "titan_side_by_side_h100.json").read_text())
    path = tmp_path / "side_by_side.json"
    del data["meta"]["device"]
    path.write_text(json.dumps(data))
    assert {r.instance_type for r in from_result_file(path)} == {H200_INSTANCE}
    data["meta"]["device"] = "NVIDIA A100-SXM4-80GB, 550.54.15, 81920 MiB"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=r"meta.device 'NVIDIA A100-SXM4-80GB' names none of the catalog"):
        from_result_file(path)


def test_a_side_by_side_keeps_the_default_trainers_rows_at_the_chunks_plans_run() -> None:
    """Rows with switches (``ours-...+key=value``) are variants the planner does not model and stay out;
    rows at the 4,096-token chunk every plan runs since 2026-12-07 come in with it (predict.as_ran)."""
    from blackwell_operator.calibrate.importers import from_result_file

    graphs = from_result_file(RESULTS / "titan_h100_20261207_cudagraphs" / "titan_side_by_side_h100.json")
    # 8 rows, 3 of them the defaults (their median steps); CUDA graphs, max-autotune, bf16 gradients left out
    assert [round(r.tokens_per_second_per_gpu or 0) for r in graphs] == [22058, 25912, 58771]
    night = from_result_file(RESULTS / "titan_h100_20261207_pool" / "titan_side_by_side_h100.json")
    assert [r.candidate.loss_chunk_tokens for r in night] == [4096, 4096, 4096]
    assert [round(r.tokens_per_second_per_gpu or 0) for r in night] == [22094, 59563, 26258]


def test_runs_that_recorded_the_allocators_history_are_not_speed_records(tmp_path: Path) -> None:
    """A run with BTJ_BENCH_MEMORY_SNAPSHOT paid a stack trace per allocation: its row stays out, whatever
    else it measured; the same file without the marker imports it."""
    from blackwell_operator.calibrate.importers import from_result_file

    source = RESULTS / "titan_h100_20261207_late" / "b_snapshot" / "titan_side_by_side_h100.json"
    assert from_result_file(source) == []  # its one default row ran with the history recorded
    data = json.loads(source.read_text())
    for row in data["rows"]:
        row["ours"]["memory_history"] = False
    unmarked = tmp_path / "unmarked.json"
    unmarked.write_text(json.dumps(data))
    assert [round(r.tokens_per_second_per_gpu or 0) for r in from_result_file(unmarked)] == [22150]
