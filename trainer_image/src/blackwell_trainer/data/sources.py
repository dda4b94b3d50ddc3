"""The one way the trainer opens its data: the plan's dataset section as a TokenSource, whatever its kind."""

from __future__ import annotations

from blackwell_trainer.data.packed import build_chat_source
from blackwell_trainer.data.tokens import DataLayout, TokenSource, build_token_source
from blackwell_trainer.plan.config import DatasetConfig, DatasetKind


def open_token_source(dataset: DatasetConfig, layout: DataLayout) -> TokenSource:
    """Synthetic tokens, token shards, or packed chat rows (with their documents) for one data-parallel
    rank; every kind gives the same `Batch`, so the loop never asks which one it reads."""
    if dataset.kind == DatasetKind.CHAT:
        return build_chat_source(dataset, layout)
    return build_token_source(dataset, layout)
