"""Training on packed chat rows: the loss is the mean over the global batch's trained tokens, the same for one
rank and two and for every micro-batch x accumulation split of the same global batch."""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from blackwell_trainer.loop.trainer import Trainer
from blackwell_trainer.parallel.runtime import Runtime, free_port, init_distributed
from blackwell_trainer.plan.config import Plan
from blackwell_trainer.prepare import Options, prepare
from blackwell_trainer.train import _token_source
from tests.support.chat_data import CONVERSATIONS, save_chat_checkpoint, write_conversations
from tests.support.plans import tiny_plan_dict

from .conftest import join_two_rank_world, spawn_two_ranks

STEPS = 3
SEQ = 64
GLOBAL_ROWS = 4  # rows per optimizer step on any layout


@pytest.fixture(scope="module")
def chat_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("chat-train")
    folder = save_chat_checkpoint(root / "ckpt", "qwen25")
    conversations = [
        [dict(t, content=f"{t['content']} {'and more ' * (i % 4)}({i})") for t in turns]
        for i, turns in enumerate(CONVERSATIONS * 12)
    ]
    source = write_conversations(root / "chat.jsonl", conversations)
    prepare(Options(inputs=[str(source)], output=root / "data", tokenizer=folder, chat="auto"))
    return root / "data"


def chat_plan(data: Path, *, world: int, mbs: int, accum: int) -> dict[str, Any]:
    plan = tiny_plan_dict(
        microBatchSize=mbs, gradientAccumulationSteps=accum, shardDegree=world, lossChunkTokens=0
    )
    plan["architecture"]["vocabSize"] = 512  # the test tokenizer's 400 ids fit
    plan.update(
        gpusPerNode=world,
        sequenceLength=SEQ,
        globalBatchTokens=GLOBAL_ROWS * SEQ,
        steps=STEPS,
        dataset={"kind": "chat", "uri": str(data), "tokenDtype": "uint16", "seed": 3},
    )
    plan["optimizer"]["warmupSteps"] = 0
    model = Plan.model_validate(plan)
    plan["parameterCount"] = model.architecture.parameter_count()
    return plan


@torch.no_grad()
def same_weights(model: torch.nn.Module) -> None:
    """Weights drawn per parameter name from a full-size generator, then sharded: equal on any layout (the
    trainer's own initialisation draws on each shard, which differs between layouts on a CPU mesh)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    for name, param in model.named_parameters():
        generator = torch.Generator().manual_seed(zlib.crc32(name.encode()))
        full = torch.randn(param.shape, generator=generator)
        full = 1.0 + 0.1 * full if "norm" in name else 0.02 * full
        if isinstance(param, DTensor):
            param.copy_(distribute_tensor(full.to(param.dtype), param.device_mesh, param.placements))
        else:
            param.copy_(full.to(param.dtype))


def train_losses(plan_dict: dict[str, Any]) -> list[float]:
    """The step losses of this process's rank (its world already set in the environment)."""
    plan = Plan.model_validate(plan_dict)
    runtime = Runtime.from_env()
    init_distributed(runtime)
    try:
        torch.manual_seed(0)
        trainer = Trainer(plan, runtime)
        same_weights(trainer.model)
        source = _token_source(plan, runtime)
        accum = plan.chosen.gradient_accumulation_steps
        return [trainer.step([source.next_batch() for _ in range(accum)]).loss for _ in range(STEPS)]
    finally:
        dist.destroy_process_group()


@pytest.mark.usefixtures("world_of_one")
def test_every_micro_batch_and_accumulation_split_gives_the_same_losses(
    chat_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = {}
    for mbs, accum in ((4, 1), (2, 2), (1, 4)):
        monkeypatch.setenv("MASTER_PORT", str(free_port()))
        runs[(mbs, accum)] = train_losses(chat_plan(chat_data, world=1, mbs=mbs, accum=accum))
    reference = runs[(4, 1)]
    assert reference[-1] < reference[0]  # it trains
    for split, losses in runs.items():
        assert losses == pytest.approx(reference, rel=1e-4), split


@pytest.mark.usefixtures("world_of_one")
def test_without_the_token_weights_the_splits_differ(
    chat_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The negative case: a plain mean per micro-batch weights short and long rows alike."""
    monkeypatch.setattr(Trainer, "_trained_token_weights", lambda self, batches: None)
    runs = []
    for mbs, accum in ((4, 1), (1, 4)):
        monkeypatch.setenv("MASTER_PORT", str(free_port()))
        runs.append(train_losses(chat_plan(chat_data, world=1, mbs=mbs, accum=accum)))
    assert runs[0] != pytest.approx(runs[1], rel=1e-3)


def _rank_losses(rank: int, port: int, plan: dict[str, Any], out: str) -> None:
    join_two_rank_world(rank, port, os.devnull)
    losses = train_losses(plan)
    if rank == 0:
        Path(out).write_text(json.dumps(losses))


@pytest.mark.distributed
@pytest.mark.usefixtures("world_of_one")
def test_two_ranks_give_the_losses_of_one(chat_data: Path, tmp_path: Path) -> None:
    alone = train_losses(chat_plan(chat_data, world=1, mbs=2, accum=2))
    out = tmp_path / "losses.json"
    spawn_two_ranks(_rank_losses, (free_port(), chat_plan(chat_data, world=2, mbs=1, accum=2), str(out)))
    assert json.loads(out.read_text()) == pytest.approx(alone, rel=1e-4)
