"""The real entry point with Hugging Face weights in and out, under torchrun with 2 gloo processes.

A run starts from a transformers checkpoint (not random init: its first loss is the checkpoint's),
trains, and exports; the export equals what the export command makes of the final job checkpoint and
reloads in transformers. A resume takes the job's own checkpoint, not the initial weights. Weights of
another architecture stop the run before the first step with one `permanent error:` line.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from blackwell_trainer.export import main as export_main
from tests.support.hf_models import architecture_of, hf_logits, save_hf_model, tokens

from .test_train_e2e import STEP_LINE, edit_plan, first_step_batches, run_one_process, run_to_end, write_plan

pytest.importorskip(
    "transformers", reason="transformers (the dev extra) is missing: bash scripts/bootstrap.sh --all"
)
SEQ = 32  # the tiny plan's sequence length


def _weights_plan(tmp_path: Path, hf: Path, *, steps: int, output: Path) -> Path:
    arch = architecture_of(hf)
    plan = write_plan(tmp_path, steps=steps, checkpoint=tmp_path / "ckpt", interval=2, lossChunkTokens=0)

    def use_weights(p: dict[str, object]) -> None:
        p.update(
            architecture=arch.model_dump(by_alias=True, exclude_none=True),
            parameterCount=arch.parameter_count(),
            weights={"uri": str(hf)},
            output={"uri": str(output)},
            # The synthetic task's batches, fixed by the seed: the first loss is computable here.
            optimizer={"learningRate": 1e-3, "warmupSteps": 0, "weightDecay": 0.0},
        )

    return edit_plan(plan, use_weights)


def _first_synthetic_loss(reference: torch.nn.Module, plan: Path) -> float:
    """The loss of the checkpoint on the first step's batches (both ranks' micro-batches)."""
    from blackwell_trainer.plan.config import Plan

    parsed = Plan.from_file(plan)
    assert parsed.world_size == 2
    losses = []
    for batch in first_step_batches(parsed):
        logits = hf_logits(reference, batch.inputs)
        losses.append(float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch.labels.reshape(-1))))
    return sum(losses) / 2


@pytest.mark.distributed
def test_train_from_hf_weights_export_and_resume_from_the_jobs_own_checkpoint(tmp_path: Path) -> None:
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    reference = save_hf_model("llama3.1", tmp_path / "hf")
    out = tmp_path / "out"
    plan = _weights_plan(tmp_path, tmp_path / "hf", steps=2, output=out)

    first = run_to_end(plan)
    assert re.search(r"loaded \d+ tensors .* from " + re.escape(str(tmp_path / "hf")), first.output)
    assert float(first.losses()[1]) == pytest.approx(_first_synthetic_loss(reference, plan), abs=2e-4)
    assert re.search(r"exported the trained weights to " + re.escape(str(out)), first.output)

    # The export is the final checkpoint, as the export command converts it.
    converted = tmp_path / "converted"
    argv = ["--plan", str(plan), "--checkpoint", str(tmp_path / "ckpt"), "--output", str(converted)]
    assert export_main(argv) == 0
    exported, again = load_file(out / "model.safetensors"), load_file(converted / "model.safetensors")
    assert exported.keys() == again.keys()
    for name, tensor in exported.items():
        assert torch.equal(tensor, again[name]), name
        assert tensor.dtype == torch.float32  # the input checkpoint's dtype
    trained = AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager").eval()
    ids = tokens(seq=SEQ)
    assert not torch.allclose(hf_logits(trained, ids), hf_logits(reference, ids), atol=1e-3)

    # Two more steps: the job's own checkpoint (step 2) wins over the initial weights.
    edit_plan(plan, lambda p: p.update(steps=4))
    second = run_to_end(plan)
    assert "resumed from checkpoint" in second.output
    assert not re.search(r"loaded \d+ tensors", second.output)
    assert min(int(m[1]) for m in STEP_LINE.finditer(second.output)) == 3
    retrained = load_file(out / "model.safetensors")
    assert any(not torch.equal(retrained[n], exported[n]) for n in exported)


def test_weights_of_another_architecture_stop_the_run_with_one_permanent_line(tmp_path: Path) -> None:
    save_hf_model("llama3.1", tmp_path / "hf")
    plan = _weights_plan(tmp_path, tmp_path / "hf", steps=1, output=tmp_path / "out")
    edit_plan(plan, lambda p: p.update(gpusPerNode=1, chosen={**p["chosen"], "shardDegree": 1}))  # type: ignore[dict-item]
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    config["num_key_value_heads"] = 4
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    termination = tmp_path / "termination-log"
    refused = run_one_process(plan, termination)
    assert refused.returncode == 2
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "num_key_value_heads" in errors[0], refused.stderr[-3000:]
    assert "Traceback" not in refused.stderr and "step 1/" not in refused.stderr
    assert termination.read_text().startswith("permanent error: weights.uri ")
    assert not (tmp_path / "out").exists()
