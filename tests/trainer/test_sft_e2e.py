"""Supervised fine-tuning end to end on the CPU: conversations prepared with the checkpoint's chat template,
its Hugging Face weights loaded, packed document-masked steps, the export reloaded with transformers.

Step 1's loss is checked against transformers run on each conversation of the first global batch alone,
averaged over the assistant's tokens only: the mask, the packing and the document mask together.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from blackwell_trainer.data.packed import build_chat_source
from blackwell_trainer.data.tokens import DataLayout
from blackwell_trainer.model.loss import IGNORE_INDEX
from blackwell_trainer.plan.config import DatasetKind, Plan
from blackwell_trainer.prepare import Options, prepare
from tests.support.chat_data import CONVERSATIONS, save_chat_checkpoint, write_conversations
from tests.support.hf_models import ATOL, RTOL, architecture_of, hf_logits, save_hf_model, trainer_logits

from .test_finetune_e2e import final_trainer_model
from .test_train_e2e import STEP_LINE, complete_steps, edit_plan, run_one_process, write_plan

pytest.importorskip(
    "transformers", reason="transformers (the dev extra) is missing: bash scripts/bootstrap.sh --all"
)
STEPS = 3
VOCAB = 512  # the model's rows; the chat tokenizer uses 400 of them
SEQ = 96


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("sft")
    checkpoint = root / "Llama-tiny-Instruct"
    save_hf_model("llama3.1", checkpoint, vocab_size=VOCAB)
    save_chat_checkpoint(checkpoint, "llama3")  # tokenizer.json and the chat template beside config.json
    conversations = [
        [dict(t, content=f"{t['content']} ({i})") for t in turns] for i, turns in enumerate(CONVERSATIONS * 6)
    ]
    source = write_conversations(root / "chats.jsonl", conversations)
    prepare(Options(inputs=[str(source)], output=root / "chats", tokenizer=checkpoint, chat="auto"))
    return checkpoint, root / "chats"


def sft_plan(folder: Path, checkpoint: Path, chats: Path) -> Path:
    arch = architecture_of(checkpoint)
    plan = write_plan(folder, steps=STEPS, checkpoint=folder / "ckpt", interval=1000)

    def change(p: dict[str, object]) -> None:
        p.update(
            architecture=arch.model_dump(by_alias=True, exclude_none=True),
            parameterCount=arch.parameter_count(),
            sequenceLength=SEQ,
            gpusPerNode=1,
            dataset={"kind": "chat", "uri": str(chats), "tokenDtype": "uint16"},
            weights={"uri": str(checkpoint)},
            output={"uri": str(folder / "export")},
        )
        p["chosen"].update(shardDegree=1, microBatchSize=4)  # type: ignore[attr-defined]

    return edit_plan(plan, change)


def reference_loss(model: torch.nn.Module, plan: Plan) -> float:
    """transformers on each conversation of step 1's rows alone, averaged over the trained labels."""
    assert plan.dataset.kind is DatasetKind.CHAT
    layout = DataLayout(plan.chosen.micro_batch_size, SEQ, vocab_size=VOCAB)
    batch = build_chat_source(plan.dataset, layout).next_batch()
    total, count = 0.0, 0
    for tokens, labels, documents in zip(batch.inputs, batch.labels, batch.documents, strict=True):
        for number in documents.unique():
            where = documents == number
            trained = labels[where] != IGNORE_INDEX
            if not trained.any():
                continue
            with torch.no_grad():
                logits = model(input_ids=tokens[where].unsqueeze(0)).logits[0]
            total += F.cross_entropy(logits[trained], labels[where][trained], reduction="sum").item()
            count += int(trained.sum())
    return total / count


@pytest.mark.distributed
def test_sft_on_packed_conversations_and_reload_the_export(
    prepared: tuple[Path, Path], tmp_path: Path
) -> None:
    from transformers import AutoModelForCausalLM

    checkpoint, chats = prepared
    plan_path = sft_plan(tmp_path, checkpoint, chats)
    plan = Plan.from_file(plan_path)
    run = run_one_process(plan_path, tmp_path / "termination-log")
    assert run.returncode == 0, run.stderr[-4000:]
    losses = {int(m[1]): float(m[2]) for m in STEP_LINE.finditer(run.stderr)}
    assert sorted(losses) == list(range(1, STEPS + 1)), run.stderr[-3000:]
    assert "trained on (the assistant's)" in run.stderr

    # Step 1 trained the checkpoint's weights: its loss is transformers' on each conversation alone, over
    # the assistant's tokens only (bf16 in the trainer, hence the tolerance).
    reference = AutoModelForCausalLM.from_pretrained(checkpoint, attn_implementation="eager").eval()
    expected = reference_loss(reference, plan)
    assert losses[1] == pytest.approx(expected, abs=0.03), (losses, expected)

    assert complete_steps(tmp_path / "ckpt")[-1] == STEPS
    trained = final_trainer_model(plan, tmp_path / "ckpt")
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "export", attn_implementation="eager").eval()
    ids = torch.arange(40).reshape(2, 20) % 400
    torch.testing.assert_close(hf_logits(exported, ids), trainer_logits(trained, ids), atol=ATOL, rtol=RTOL)
    assert not torch.allclose(hf_logits(exported, ids), hf_logits(reference, ids), atol=1e-3)
