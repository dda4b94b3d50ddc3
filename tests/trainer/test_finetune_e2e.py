"""Fine-tuning end to end on the CPU: text prepared with the model's own tokenizer, a Hugging Face model's
weights loaded, a few steps under torchrun with 2 gloo processes, the export reloaded with transformers.

The references are real: the model and its save_pretrained folder come from transformers, the tokenizer is
a byte-level BPE trained with the tokenizers library, and the exported folder is read back by
transformers' from_pretrained. The trainer's own weights at the end are read from its final
torch.distributed.checkpoint step, not through the export.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from blackwell_trainer.plan.config import Plan
from blackwell_trainer.plan.shard_manifest import ShardManifest, tokenizer_sha256
from blackwell_trainer.prepare import Options, prepare
from blackwell_trainer.weights.load import check_data_tokenizer
from tests.support.hf_models import (
    ATOL,
    RTOL,
    architecture_of,
    empty_trainer_model,
    hf_logits,
    save_hf_model,
    trainer_logits,
)
from tests.support.text_data import make_documents, read_documents, save_tokenizer

from .test_train_e2e import (
    complete_steps,
    edit_plan,
    first_step_batches,
    run_one_process,
    run_to_end,
    write_plan,
)

pytest.importorskip(
    "transformers", reason="transformers (the dev extra) is missing: bash scripts/bootstrap.sh --all"
)
STEPS = 3
VOCAB = 320  # the model's rows; the tokenizer uses 300 of them (as Qwen2.5's 151,936 hold 151,665)


@dataclass
class Prepared:
    """A Hugging Face checkpoint folder with its tokenizer, and shards prepared from JSONL with it."""

    checkpoint: Path
    shards: Path
    manifest: ShardManifest
    docs: list[str]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Prepared:
    root = tmp_path_factory.mktemp("finetune")
    checkpoint = root / "Llama-tiny"
    save_hf_model("llama3.1", checkpoint, vocab_size=VOCAB)
    save_tokenizer(checkpoint)  # tokenizer.json and tokenizer_config.json beside config.json
    docs = make_documents(400)
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    options = Options(inputs=[str(corpus)], output=root / "shards", tokenizer=checkpoint, chunk_bytes=8192)
    return Prepared(checkpoint, root / "shards", prepare(options), docs)


def finetune_plan(folder: Path, prepared: Prepared, *, nproc: int = 2, **dataset: object) -> Path:
    arch = architecture_of(prepared.checkpoint)
    plan = write_plan(folder, steps=STEPS, checkpoint=folder / "ckpt", interval=1000)

    def change(p: dict[str, object]) -> None:
        p.update(
            architecture=arch.model_dump(by_alias=True, exclude_none=True),
            parameterCount=arch.parameter_count(),
            dataset={"kind": "shards", "uri": str(prepared.shards), "tokenDtype": "uint16", **dataset},
            weights={"uri": str(prepared.checkpoint)},
            output={"uri": str(folder / "export")},
        )
        if nproc == 1:
            p["gpusPerNode"] = 1
            p["chosen"].update(shardDegree=1)  # type: ignore[attr-defined]

    return edit_plan(plan, change)


def first_global_batch(plan: Plan) -> tuple[torch.Tensor, torch.Tensor]:
    """The samples both ranks train on at step 1, in rank order (what the logged loss averages)."""
    batches = first_step_batches(plan)
    return torch.cat([b.inputs for b in batches]), torch.cat([b.labels for b in batches])


def final_trainer_model(plan: Plan, ckpt: Path) -> torch.nn.Module:
    """The trainer's model with the weights of its last checkpoint step (fp32 master weights)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint import load as dcp_load
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    model = empty_trainer_model(plan.architecture, plan.sequence_length)
    state = {"model": {k: torch.empty_like(v) for k, v in model.state_dict().items()}}
    step = ckpt / f"step-{STEPS:06d}"
    dcp_load(
        state,
        storage_reader=FileSystemReader(str(step)),
        planner=DefaultLoadPlanner(allow_partial_load=True),
        no_dist=True,
    )
    model.load_state_dict(state["model"])
    return model.eval()


def test_the_prepared_text_is_the_jsonl_in_the_models_tokens(prepared: Prepared) -> None:
    assert read_documents(prepared.shards, prepared.checkpoint, "uint16") == prepared.docs
    assert prepared.manifest.vocab_size == 300 and prepared.manifest.token_dtype == "uint16"
    assert len(prepared.manifest.shards) > 1


@pytest.mark.distributed
def test_finetune_from_hf_weights_on_prepared_text_and_reload_the_export(
    prepared: Prepared, tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    plan_path = finetune_plan(tmp_path, prepared)
    plan = Plan.from_file(plan_path)
    trainer = run_to_end(plan_path)
    losses = {step: float(loss) for step, loss in trainer.losses().items()}
    assert sorted(losses) == list(range(1, STEPS + 1)), trainer.output[-3000:]

    # Step 1 trained the Hugging Face model's weights on the prepared text: its loss is that model's
    # loss on the same samples (the trainer computes in bf16, hence the tolerance; from random
    # initialisation this run logs 5.77 against the checkpoint's 6.01).
    reference = AutoModelForCausalLM.from_pretrained(prepared.checkpoint, attn_implementation="eager").eval()
    inputs, labels = first_global_batch(plan)
    with torch.no_grad():
        logits = reference(input_ids=inputs).logits
        expected = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1)).item()
    assert losses[1] == pytest.approx(expected, abs=0.03), (losses, expected)

    # The export is the trainer's final weights: transformers' logits on it are the trainer's own.
    assert complete_steps(tmp_path / "ckpt")[-1] == STEPS
    trained = final_trainer_model(plan, tmp_path / "ckpt")
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "export", attn_implementation="eager").eval()
    ids = inputs[:2]
    torch.testing.assert_close(hf_logits(exported, ids), trainer_logits(trained, ids), atol=ATOL, rtol=RTOL)
    # ... and training moved them away from the initial weights.
    assert not torch.allclose(hf_logits(exported, ids), hf_logits(reference, ids), atol=1e-3)
    # The export carries the checkpoint's tokenizer, so it can prepare more data or serve.
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / "export" / name).read_bytes() == (prepared.checkpoint / name).read_bytes()


def test_a_manifest_that_does_not_match_the_plan_is_one_permanent_error(
    prepared: Prepared, tmp_path: Path
) -> None:
    # One process (no torchrun) is enough: the trainer checks the manifest while it builds the data source.
    plan = finetune_plan(tmp_path, prepared, nproc=1, tokenDtype="uint32")
    termination = tmp_path / "termination-log"
    refused = run_one_process(plan, termination)
    assert refused.returncode == 2, refused.stderr[-3000:]
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error: ")]
    expected = (
        f"dataset.uri {prepared.shards} was prepared as uint16 (manifest.json) but dataset.tokenDtype is "
        "uint32; set spec.training.dataset.tokenDtype: uint16"
    )
    assert errors == [f"error: {expected}"], refused.stderr[-3000:]
    assert termination.read_text() == f"permanent error: {expected}\n"
    assert "Traceback" not in refused.stderr


def other_tokenizer_checkpoint(prepared: Prepared, folder: Path, *, tokenizer: bool = True) -> Path:
    """The same weights with another tokenizer.json beside them (or none): what a mixed-up upload holds."""
    copy = folder / "Llama-tiny-other"
    copy.mkdir()
    for f in prepared.checkpoint.iterdir():
        if not f.name.startswith("tokenizer"):
            (copy / f.name).write_bytes(f.read_bytes())
    if tokenizer:
        save_tokenizer(copy, vocab_size=280)
    return copy


def test_shards_of_another_tokenizer_are_one_permanent_error_before_the_load(
    prepared: Prepared, tmp_path: Path
) -> None:
    plan = finetune_plan(tmp_path, prepared, nproc=1)
    other = other_tokenizer_checkpoint(prepared, tmp_path)
    edit_plan(plan, lambda p: p.update(weights={"uri": str(other)}))
    termination = tmp_path / "termination-log"
    refused = run_one_process(plan, termination)
    assert refused.returncode == 2, refused.stderr[-3000:]
    ours, theirs = prepared.manifest.tokenizer_sha256, tokenizer_sha256(other / "tokenizer.json")
    assert ours != theirs
    expected = (
        f"dataset.uri {prepared.shards} was tokenized with another tokenizer than weights.uri {other}: "
        f"manifest.json tokenizerSha256 {ours}, the checkpoint's tokenizer.json {theirs}; prepare the data "
        f"again with the checkpoint's tokenizer (python -m blackwell_trainer.prepare ... --tokenizer {other})"
    )
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [f"error: {expected}"], refused.stderr[-3000:]
    assert termination.read_text() == f"permanent error: {expected}\n"
    # Refused before the weights were read and before any step.
    assert "loaded " not in refused.stderr and "step 1/" not in refused.stderr
    assert "Traceback" not in refused.stderr


def test_the_tokenizer_check_passes_the_checkpoints_own_and_says_what_it_cannot_check(
    prepared: Prepared, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="blackwell_trainer.weights.load")
    uri = str(prepared.shards)
    check_data_tokenizer(str(prepared.checkpoint), uri, prepared.manifest)
    assert f"was prepared with weights.uri {prepared.checkpoint}'s tokenizer.json" in caplog.text
    # A checkpoint without tokenizer.json, or shards without a manifest: a warning, and training goes on.
    bare = other_tokenizer_checkpoint(prepared, tmp_path, tokenizer=False)
    check_data_tokenizer(str(bare), uri, prepared.manifest)
    check_data_tokenizer(str(prepared.checkpoint), uri, None)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        f"weights.uri {bare} has no tokenizer.json: the tokenizer dataset.uri {uri} was prepared with "
        f"(sha256 {prepared.manifest.tokenizer_sha256}) is not checked against it",
        f"dataset.uri {uri} has no manifest.json: its tokenizer is not checked against weights.uri "
        f"{prepared.checkpoint}",
    ]
