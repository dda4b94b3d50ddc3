"""benchmarks/probe_h200.py's plumbing on CPU: real plans, the trainer launch replaced by a recorder. Each
distinct configuration of a scenario runs alone once whichever profiles planned or probed it (a grown one
included), the record is written after every run, and --scenarios picks a subset."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import benchmarks.probe_h200 as script
import benchmarks.trainer_process as trainer_process
import pytest

from blackwell_trainer.plan.config import Plan, ProbeMeasurement, ProbeOutcome, ProbeResult


def recorder(launched: list[tuple[str, str]], saved: list[int]) -> Any:
    """A stand-in for the trainer launch: records each run; a probed run grows once and wins with it."""

    def fake_train(plan: Plan, out: Path, name: str, timeout_s: float) -> dict[str, Any]:
        record = out / "probe_h200.json"
        saved.append(len(json.loads(record.read_text())["results"]) if record.exists() else -1)
        launched.append((name, trainer_process.candidate_label(plan.chosen)))
        probe = None
        if plan.probe is not None:  # the probed run: the pick measured under its predicted peak, so it grew
            assert plan.probe.growth
            grown = len(plan.probe.candidates)
            measurements = [
                ProbeMeasurement(
                    index=i,
                    outcome=ProbeOutcome.MEASURED,
                    predicted_tokens_per_second_per_gpu=o.prediction.tokens_per_second_per_gpu,
                    predicted_peak_reserved_bytes=o.prediction.memory.peak_reserved,
                    tokens_per_second_per_gpu=1000.0 + i,
                    peak_reserved_bytes=1,
                )
                for i, o in enumerate(plan.probe.options[: grown + 1])
            ]
            result = ProbeResult(winner=grown, measurements=measurements, seconds=200.0)
            probe = result.model_dump(mode="json", by_alias=True)
        return {"rc": 0, "seconds": 1.0, "tokens_per_second_per_gpu": 100.0 + len(launched), "probe": probe}

    return fake_train


def test_each_configuration_runs_alone_once_grown_included_and_the_record_is_saved_per_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    launched: list[tuple[str, str]] = []
    saved: list[int] = []
    monkeypatch.setattr(script, "train", recorder(launched, saved))
    argv = ["probe_h200.py", "--out", str(tmp_path), "--only", "fitted,base", "--scenarios", "3b-seq3072"]
    monkeypatch.setattr("sys.argv", argv)
    assert script.main() == 0
    names = [n for n, _ in launched]
    # The base profile's probe ran once; the fitted pick (torchao-tensorwise/none/mbs12) is also the base
    # pick's grown size: it ran alone once, as did the base candidates.
    assert names == [
        "3b-seq3072.base.probed",
        "3b-seq3072.alone.torchao-tensorwise/none/mbs12",
        "3b-seq3072.alone.torchao-tensorwise/none/mbs8",
        "3b-seq3072.alone.torchao-tensorwise/selective/mbs12",
    ]
    assert saved[1:] == [1, 1, 1]  # written after the probed run and after each alone run
    record = json.loads((tmp_path / "probe_h200.json").read_text())
    # One size grows at most: the global batch is reached exactly, so only sizes that divide it are tried.
    assert record["launches"] == {"probed": 1, "alone": 3, "grown_at_most": 1}
    base = record["results"]["3b-seq3072"]["profiles"]["base"]
    assert base["pick"] == "torchao-tensorwise/none/mbs8"
    assert base["winner"] == "torchao-tensorwise/none/mbs12"
    assert [c["candidate"] for c in base["candidates"]][-1] == "torchao-tensorwise/none/mbs12"
    assert record["results"]["3b-seq3072"]["profiles"]["fitted"]["probe"] is None


def test_an_unknown_scenario_is_refused_naming_the_choices(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("sys.argv", ["probe_h200.py", "--out", str(tmp_path), "--scenarios", "7b-seq1"])
    with pytest.raises(SystemExit):
        script.main()
    assert "--scenarios: unknown ['7b-seq1']; choose from 3b-seq3072" in capsys.readouterr().err


def test_runs_choose_profiles_per_scenario_and_picks_alone_runs_only_picks_and_winners(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    launched: list[tuple[str, str]] = []
    monkeypatch.setattr(script, "train", recorder(launched, []))
    runs = "3b-seq3072:base,1b-seq12288:skewed"
    monkeypatch.setattr("sys.argv", ["p", "--out", str(tmp_path), "--runs", runs, "--alone", "picks"])
    assert script.main() == 0
    names = [n for n, _ in launched]
    assert names[:3] == [
        "3b-seq3072.base.probed",
        "3b-seq3072.alone.torchao-tensorwise/none/mbs8",  # the base pick
        "3b-seq3072.alone.torchao-tensorwise/none/mbs12",  # the probe's (grown) winner
    ]
    # The skewed profile underrates FP8: it picks BF16, and its probe's winner runs alone beside it.
    assert names[3] == "1b-seq12288.skewed.probed"
    assert names[4] == "1b-seq12288.alone.none/none/mbs4"
    assert len(names) == 6 and names[5].startswith("1b-seq12288.alone.")
    record = json.loads((tmp_path / "probe_h200.json").read_text())
    assert set(record["results"]) == {"3b-seq3072", "1b-seq12288"}
    assert set(record["results"]["1b-seq12288"]["profiles"]) == {"skewed"}
    assert len(record["skew_flips_the_pick_in"]) >= 2


def test_resume_keeps_the_probed_runs_and_alone_figures_of_an_earlier_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, again = tmp_path / "first", tmp_path / "again"
    monkeypatch.setattr(script, "train", recorder([], []))
    monkeypatch.setattr(
        "sys.argv", ["p", "--out", str(first), "--runs", "3b-seq3072:base", "--alone", "picks"]
    )
    assert script.main() == 0
    launched: list[tuple[str, str]] = []
    monkeypatch.setattr(script, "train", recorder(launched, []))
    resume = ["--resume", str(first / "probe_h200.json")]
    runs = ["--runs", "3b-seq3072:base,1b-seq12288:skewed", "--alone", "picks"]
    monkeypatch.setattr("sys.argv", ["p", "--out", str(again), *runs, *resume])
    assert script.main() == 0
    assert next(n for n, _ in launched) == "1b-seq12288.skewed.probed"  # nothing of 3b-seq3072 again
    record = json.loads((again / "probe_h200.json").read_text())
    assert record["results"]["3b-seq3072"]["profiles"]["base"]["winner"] == "torchao-tensorwise/none/mbs12"


def test_a_run_named_by_a_configuration_key_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The H200 call of 2026-12-01 stopped at the first alone run: "fp8/none/mbs8" made a folder path. A
    run's name now heads its section of the output and names no file."""
    import subprocess

    seen: list[list[str]] = []

    def fake_run(cmd: list[str], **_: Any) -> Any:
        seen.append(cmd)
        assert Path(cmd[-1]).is_file()  # the plan the trainer is given
        return subprocess.CompletedProcess(cmd, 0, "step 1/1\n", "")

    monkeypatch.setattr(trainer_process.subprocess, "run", fake_run)
    plans = script.profiles()[0]
    plan = script.plan_job(script.spec_for(script.SCENARIOS["3b-seq3072"], 10), calibration=plans["fitted"])
    script.train(plan, tmp_path, "3b.alone.torchao-tensorwise/none/mbs8", 10)
    assert len(seen) == 1
    logs = (tmp_path / trainer_process.TRAINER_LOGS).read_text()
    assert logs.startswith("===== 3b.alone.torchao-tensorwise/none/mbs8: rc 0")
