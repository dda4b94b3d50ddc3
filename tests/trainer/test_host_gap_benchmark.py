"""benchmarks/host_gap.py: it times the product's loop between steps, writes its record, and leaves the
Trainer and the environment as it found them."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from benchmarks import host_gap

from blackwell_trainer.loop.trainer import Trainer


def test_the_host_gap_record_has_one_figure_per_timed_step_and_the_trainer_is_restored(
    tmp_path: Path,
) -> None:
    step, forward_backward = Trainer.step, Trainer._forward_backward
    environment = dict(os.environ)
    out = tmp_path / "gap.json"
    assert host_gap.main(["--steps", "60", "--checkpoint-every", "30", "--out", str(out)]) == 0
    record = json.loads(out.read_text())
    assert record["steps"] == 60 and record["left_out_first"] == host_gap.SKIP_STEPS
    for figure in ("between_steps", "step_entry_to_forward"):
        ms = record[figure]
        assert 0 <= ms["median_ms"] <= ms["p90_ms"] <= ms["max_ms"], (figure, ms)
    assert (Trainer.step, Trainer._forward_backward) == (step, forward_backward)
    # The trainer's world of one is not left in the environment for a process a later test starts.
    assert dict(os.environ) == environment


def test_too_few_steps_are_refused_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        host_gap.main(["--steps", "10", "--out", str(tmp_path / "x.json")])
    assert exit_.value.code == 2
    assert "--steps must be over 51" in capsys.readouterr().err
