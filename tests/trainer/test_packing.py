"""Packed rows compute each document as if it were alone: logits and loss equal transformers run on each
document separately (float32, CPU), attention never crosses a boundary, positions restart per document."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from blackwell_trainer.model.document_mask import build_document_mask, document_attention, document_positions
from blackwell_trainer.model.loss import IGNORE_INDEX
from blackwell_trainer.weights.load import load_pretrained
from tests.support.hf_models import ATOL, RTOL, SEQ, architecture_of, empty_trainer_model, save_hf_model

pytest.importorskip(
    "transformers", reason="transformers (the dev extra) is missing: bash scripts/bootstrap.sh --all"
)

# Two packed rows of SEQ tokens: three documents and padding, and one document filling the row.
LENGTHS = [[13, 20, 11], [SEQ]]


def packed_batch(vocab: int = 256) -> tuple[torch.Tensor, torch.Tensor, list[list[torch.Tensor]]]:
    """tokens and document numbers [2, SEQ], and each row's documents as separate token tensors."""
    generator = torch.Generator().manual_seed(7)
    rows, docs, pieces = [], [], []
    for lengths in LENGTHS:
        row_docs = [torch.randint(0, vocab, (n,), generator=generator) for n in lengths]
        pad = SEQ - sum(lengths)
        row = torch.cat([*row_docs, torch.zeros(pad, dtype=torch.long)])
        numbers = torch.cat(
            [torch.full((n,), i) for i, n in enumerate(lengths)] + [torch.full((pad,), len(lengths))]
        )
        rows.append(row)
        docs.append(numbers)
        pieces.append(row_docs)
    return torch.stack(rows), torch.stack(docs), pieces


def in_document_labels(tokens: torch.Tensor, documents: torch.Tensor, pads: list[int]) -> torch.Tensor:
    """The next token where it belongs to the same document; ignored at each document's last token."""
    labels = torch.full_like(tokens, IGNORE_INDEX)
    same = documents[:, 1:] == documents[:, :-1]
    labels[:, :-1] = torch.where(same, tokens[:, 1:], torch.full_like(tokens[:, 1:], IGNORE_INDEX))
    for row, pad in enumerate(pads):
        if pad:
            labels[row, SEQ - pad - 1 :] = IGNORE_INDEX  # the padding is no document to learn
    return labels


def test_positions_restart_at_every_document() -> None:
    documents = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2, 2], [0] * 9])
    assert document_positions(documents).tolist() == [[0, 1, 2, 0, 1, 0, 1, 2, 3], list(range(9))]


# Eager FlexAttention on the CPU warns that it is unfused; it computes the same function.
@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_the_flex_block_mask_and_the_sdpa_mask_compute_the_same_attention() -> None:
    _, documents, _ = packed_batch()
    generator = torch.Generator().manual_seed(1)
    q = torch.randn(2, 4, SEQ, 16, generator=generator)
    k, v = (torch.randn(2, 2, SEQ, 16, generator=generator) for _ in range(2))
    dense = document_attention(q, k, v, build_document_mask(documents, flex=False))
    flex = document_attention(q, k, v, build_document_mask(documents, flex=True))
    torch.testing.assert_close(flex, dense, atol=1e-5, rtol=1e-5)
    # No token sees another document: changing the second document leaves the first unchanged.
    k2 = k.clone()
    k2[:, :, 13:33] += 1.0
    moved = document_attention(q, k2, v, build_document_mask(documents, flex=False))
    torch.testing.assert_close(moved[:, :, :13][0], dense[:, :, :13][0])
    assert not torch.allclose(moved[0, :, 13:33], dense[0, :, 13:33])


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_document_attention_compiles_inside_a_checkpointed_block() -> None:
    """Full AC wraps each compiled block in a checkpoint; the masked attention must trace there without a
    side effect outside the block (the H200 run of 2026-12-01 failed with "Unsafe side effect" when the
    compiled FlexAttention was made lazily inside the trace)."""
    from torch.utils.checkpoint import checkpoint

    _, documents, _ = packed_batch()
    mask = build_document_mask(documents, flex=True)
    generator = torch.Generator().manual_seed(2)
    # Forward only: the CPU has no FlexAttention backward under compile; the refusal was at trace time.
    q = torch.randn(2, 4, SEQ, 16, generator=generator)
    k, v = (torch.randn(2, 2, SEQ, 16, generator=generator) for _ in range(2))

    def block(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return checkpoint(document_attention, q, k, v, mask, use_reentrant=False)

    compiled = torch.compile(block, backend="aot_eager", fullgraph=True)
    expected = document_attention(q, k, v, build_document_mask(documents, flex=False))
    torch.testing.assert_close(compiled(q, k, v), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", ["llama3.1", "qwen2.5-tied", "mistral"])
def test_packed_logits_and_loss_equal_transformers_per_document(family: str, tmp_path: Path) -> None:
    reference = save_hf_model(family, tmp_path)
    arch = architecture_of(tmp_path)
    model = empty_trainer_model(arch)
    load_pretrained(model, str(tmp_path), arch, SEQ)
    tokens, documents, pieces = packed_batch(arch.vocab_size)
    with torch.no_grad():
        hidden = model(tokens, documents=documents)
        logits = hidden @ model.output_weight().T
    total_loss, trained = 0.0, 0
    for row, row_docs in enumerate(pieces):
        start = 0
        for doc in row_docs:
            with torch.no_grad():
                alone = reference(input_ids=doc.unsqueeze(0)).logits[0]
            torch.testing.assert_close(logits[row, start : start + doc.numel()], alone, atol=ATOL, rtol=RTOL)
            total_loss += F.cross_entropy(alone[:-1], doc[1:], reduction="sum").item()
            trained += doc.numel() - 1
            start += doc.numel()
    pads = [SEQ - sum(lengths) for lengths in LENGTHS]
    labels = in_document_labels(tokens, documents, pads)
    assert int((labels != IGNORE_INDEX).sum()) == trained
    with torch.no_grad():
        ours = model(tokens, labels, documents=documents)
    assert ours.item() == pytest.approx(total_loss / trained, rel=1e-5)


def test_without_documents_the_rows_attend_across_the_boundary(tmp_path: Path) -> None:
    """The negative case: the same packed row without the mask differs from the per-document reference."""
    reference = save_hf_model("llama3.1", tmp_path)
    arch = architecture_of(tmp_path)
    model = empty_trainer_model(arch)
    load_pretrained(model, str(tmp_path), arch, SEQ)
    tokens, _, pieces = packed_batch(arch.vocab_size)
    with torch.no_grad():
        logits = model(tokens) @ model.output_weight().T
        second = pieces[0][1]
        alone = reference(input_ids=second.unsqueeze(0)).logits[0]
    assert not torch.allclose(logits[0, 13:33], alone, atol=1e-3)
