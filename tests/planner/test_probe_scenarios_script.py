"""benchmarks/probe_scenarios_h100.py on CPU: real plans, the trainer launch replaced by a stand-in.

The must-show of issue 37 is read from its record: each probed job against the best configuration alone
inside the job's memory budget, and the memory the probe left behind."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import benchmarks.probe_scenarios_h100 as script
import benchmarks.trainer_process as trainer_process
import pytest

from blackwell_trainer.plan.config import Plan
from tests.support.probe_results import measured_probe

# A scenario whose shipped plan probes two AC modes (with the H100's own constants, gpus.H100: FP8 full AC
# mbs 32, the pick, against AC none mbs 4). The recorded ones (script.SCENARIOS) no longer probe under the
# shipped profile: their neighbour was FP8 selective, which this trainer runs as AC none
# (trainer.selective_recomputes_nothing): one family now. At batch 48 the H100 fit with full AC's recompute
# share (0.83, calls 10-11) puts AC none too far behind full AC to probe.
SCENARIO = {"3b-s2048-b64": {"preset": "llama3.2-3b", "seq": 2048, "sequences": 64}}


def _line(step: int, tps: int, gib: float) -> str:
    return f"step {step}/6 loss 1.0 tokens/s/gpu {tps} reserved {gib} GiB"


def test_plans_run_and_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(script, "SCENARIOS", SCENARIO)
    plans = tmp_path / "plans"
    script.make_plans(plans, dict(script.PROFILES))
    index = json.loads((plans / "index.json").read_text())
    assert [(p["scenario"], p["profile"]) for p in index["probed"]] == [
        ("3b-s2048-b64", "shipped"),
        ("3b-s2048-b64", "base"),
    ]
    assert all(p["probe_enabled"] for p in index["probed"])  # modelled candidates on an unmeasured GPU
    alone = [a["config"] for a in index["alone"]]
    # The neighbours: every size a probe looked at, one below, without and with selective AC, and full AC.
    assert {"torchao-tensorwise/none/mbs4", "torchao-tensorwise/none/mbs2"} <= set(alone)
    assert any(c.startswith("torchao-tensorwise/full/") for c in alone)
    predicted = [a["predicted_tokens_per_second_per_gpu"] for a in index["alone"]]
    assert predicted == sorted(predicted, reverse=True)  # most promising first
    for item in index["probed"] + index["alone"]:
        plan = Plan.model_validate_json((plans / item["plan"]).read_text())
        assert plan.steps == script.RUN_STEPS and plan.gpu.name == "H100"

    launched: list[str] = []

    def fake_run(plan: Plan, out: Path, name: str, timeout_s: float, tuning: str | None = None) -> Any:
        launched.append(name)
        mbs = plan.chosen.micro_batch_size
        probe = ""
        if plan.probe is not None and plan.probe.enabled:  # the pick wins, every candidate measured
            speeds = [1.0] * len(plan.probe.candidates)
            result = measured_probe(
                plan, speed=speeds, peak=lambda c: 1, winner=0, seconds_each=30, seconds=90
            )
            probe = result.to_line()
        text = "\n".join(_line(s, 10_000 * mbs + s, 60.0 + mbs) for s in range(1, 7))
        return trainer_process.TrainerRun(0, 1.0, text, "", probe)

    monkeypatch.setattr(trainer_process, "run_trainer", fake_run)
    out = tmp_path / "out"
    out.mkdir()
    script.run(plans, out, budget_s=10_000, only="3b-s2048")
    record = json.loads((out / "probe_scenarios_h100.json").read_text())
    assert len(record["probed"]) == 2 and len(record["alone"]) == len(index["alone"])
    assert launched[:2] == ["3b-s2048-b64.shipped", "3b-s2048-b64.base"]
    shipped = record["probed"]["3b-s2048-b64.shipped"]
    assert shipped["winner"] == shipped["pick"] == "torchao-tensorwise/full/mbs32"
    assert shipped["tokens_per_second_per_gpu"] == 10_000 * 32 + 4.5  # the log's median from step 3
    assert shipped["log_tail"][-1].startswith("step 6/6")
    table = script.report(out / "probe_scenarios_h100.json", plans)
    assert "| 3b-s2048-b64 | shipped |" in table and "| 3b-s2048-b64 | base |" in table


def test_the_trainer_runs_with_the_allocator_setting_the_pods_get(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import subprocess

    from blackwell_operator.render.environment import DEFAULT_ENV
    from tests.support.plans import tiny_plan

    seen: dict[str, str] = {}

    def fake_run(cmd: list[str], *, env: dict[str, str], **_: Any) -> subprocess.CompletedProcess[str]:
        seen.update(env)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    monkeypatch.setattr(trainer_process.subprocess, "run", fake_run)
    for name in ("a", "b/c", "d"):
        trainer_process.run_trainer(tiny_plan(), tmp_path, name, 10)
    assert seen["PYTORCH_CUDA_ALLOC_CONF"] == DEFAULT_ENV["PYTORCH_CUDA_ALLOC_CONF"]
    # However many runs, the output folder gets one file (the GPU machine returns 8): their output.
    assert [p.name for p in tmp_path.iterdir()] == [trainer_process.TRAINER_LOGS]
    logs = (tmp_path / trainer_process.TRAINER_LOGS).read_text()
    assert [line for line in logs.splitlines() if line.startswith("=====")] == [
        "===== a: rc 0, 0.0 s",
        "===== b/c: rc 0, 0.0 s",
        "===== d: rc 0, 0.0 s",
    ]


def test_a_probed_job_that_left_no_figures_is_reported_not_crashed_on(tmp_path: Path) -> None:
    # An OOM or a crash leaves no step lines: the table says "-" and the exit code instead of failing.
    plans = Path(script.__file__).resolve().parent / "results" / "probe_scenarios_h100"
    job = {
        "scenario": "3b-s2560-b24",
        "profile": "shipped",
        "plan": "3b-s2560-b24.shipped.plan.json",
        "pick": "torchao-tensorwise/none/mbs4",
        "rc": 1,
        "tokens_per_second_per_gpu": None,
        "peak_reserved_gib": None,
        "probe": None,
    }
    result = tmp_path / "result.json"
    result.write_text(json.dumps({"probed": {"x": job}, "alone": {}}))
    row = script.report(result, plans).splitlines()[2]
    assert row == (
        "| 3b-s2560-b24 | shipped | torchao-tensorwise/none/mbs4 | torchao-tensorwise/none/mbs4 | "
        "- | - | - | - | - | - | 0 probe, rc 1 |"
    )
