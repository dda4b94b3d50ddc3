"""Context parallelism: the split round-trips; CP=2 on 2 gloo processes gives the loss and the gradients
of the unsplit single-process model (GQA and MHA, with AC and replication); the trainer runs it end to end.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

from blackwell_trainer.loop.trainer import Trainer
from blackwell_trainer.model.loss import IGNORE_INDEX
from blackwell_trainer.model.transformer import Attention, build_model
from blackwell_trainer.parallel.context_parallel import (
    ContextParallel,
    chunk_order,
    data_parallel_rank,
    kv_gather_bytes_per_layer,
    local_positions,
    merge_sequence,
    split_sequence,
)
from blackwell_trainer.parallel.parallelize import ParallelismError, build_mesh, parallelize, validate_layout
from blackwell_trainer.parallel.runtime import Runtime
from blackwell_trainer.plan.config import Architecture, Candidate
from blackwell_trainer.train import _token_source
from tests.ports import free_port
from tests.support.plans import tiny_plan

from .conftest import spawn_two_ranks
from .test_train_e2e import edit_plan, run_to_end, write_plan

SEQ = 16


@pytest.mark.parametrize("cp", [1, 2, 4])
def test_the_load_balanced_split_round_trips_and_carries_global_positions(cp: int) -> None:
    x = torch.arange(3 * SEQ).view(3, SEQ)
    parts = [split_sequence(x, cp, r) for r in range(cp)]
    assert all(p.shape == (3, SEQ // cp) for p in parts)
    torch.testing.assert_close(merge_sequence(parts), x)
    for r, part in enumerate(parts):
        # Row 0 holds 0..SEQ-1, so the values are the positions themselves.
        torch.testing.assert_close(part[0], local_positions(SEQ, cp, r))
    assert sorted(chunk_order(cp)) == list(range(2 * cp))


def test_rank_i_keeps_chunks_i_and_mirror() -> None:
    # 16 tokens, cp 2: chunks of 4; rank 0 keeps chunks 0 and 3, rank 1 keeps 1 and 2.
    assert local_positions(SEQ, 2, 0).tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
    assert local_positions(SEQ, 2, 1).tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    assert chunk_order(2) == [0, 3, 1, 2]
    assert data_parallel_rank(5, 8, 2) == (2, 4)


def test_kv_gather_bytes_are_the_other_ranks_share_of_the_full_kv() -> None:
    # 70B (8 KV heads x 128) at 128K, bf16, cp 8: full K+V of a layer is 512 MiB; a rank receives 7/8.
    got = kv_gather_bytes_per_layer(micro_batch_size=1, sequence_length=131072, kv_dim=1024, cp=8)
    assert got == 2 * 131072 * 1024 * 2 * 7 // 8


def _candidate(**overrides: object) -> Candidate:
    base: dict[str, object] = dict(
        precision="bf16", precision_recipe="none", activation_checkpointing="none", micro_batch_size=2,
        gradient_accumulation_steps=1, sharding="full", shard_degree=2, replicate_degree=1, compile=False,
        loss_chunk_tokens=8, context_parallel=2,
    )  # fmt: skip
    return Candidate.model_validate({**base, **overrides})


@pytest.mark.parametrize(
    ("overrides", "world", "seq", "message"),
    [
        ({"context_parallel": 3, "shard_degree": 4}, 4, 24, r"contextParallel \(3\) must divide the job's 4"),
        ({}, 2, 18, "sequenceLength divisible by 4"),
        ({"sharding": "hybrid", "shard_degree": 2, "replicate_degree": 2, "context_parallel": 4}, 4, 32,
         r"must divide chosen.shardDegree \(2\) with hybrid"),
    ],
)  # fmt: skip
def test_impossible_cp_layouts_are_refused_with_one_line(
    overrides: dict[str, object], world: int, seq: int, message: str
) -> None:
    with pytest.raises(ParallelismError, match=message) as err:
        validate_layout(_candidate(**overrides), world, sequence_length=seq)
    assert "\n" not in str(err.value)


def test_possible_cp_layouts_pass() -> None:
    validate_layout(_candidate(), 2, sequence_length=SEQ)
    validate_layout(_candidate(sharding="none", shard_degree=1, replicate_degree=2), 2, sequence_length=SEQ)
    validate_layout(
        _candidate(sharding="hybrid", shard_degree=4, replicate_degree=2, context_parallel=4),
        8,
        sequence_length=4096,
    )


# --- CP=2 over 2 gloo processes against the unsplit model on one process

CASES: dict[str, dict[str, Any]] = {
    "gqa-full-shard": {"kv_heads": 2, "candidate": {}},
    "mha-full-shard": {"kv_heads": 4, "candidate": {}},
    "gqa-selective-ac": {"kv_heads": 2, "candidate": {"activation_checkpointing": "selective"}},
    "gqa-full-ac-replicated": {
        "kv_heads": 2,
        "candidate": {
            "activation_checkpointing": "full",
            "sharding": "none",
            "shard_degree": 1,
            "replicate_degree": 2,
        },
    },
}


def _arch(kv_heads: int) -> Architecture:
    return Architecture(
        hidden_size=64, num_layers=2, num_attention_heads=4, num_key_value_heads=kv_heads,
        intermediate_size=128, vocab_size=96,
    )  # fmt: skip


def _full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of an FSDP2 shard (a DTensor)."""
    assert isinstance(t, DTensor)
    return t.full_tensor()


def _clean(name: str) -> str:
    return name.replace("_checkpoint_wrapped_module.", "").replace("_orig_mod.", "")


def _check_case(name: str, case: dict[str, Any], cp: ContextParallel) -> None:
    arch = _arch(case["kv_heads"])
    candidate = _candidate(**case["candidate"])
    model = build_model(arch, max_seq_len=SEQ, loss_chunk_tokens=8)
    for module in model.modules():
        if isinstance(module, Attention):
            module.attend = cp
    parallelize(model, candidate, build_mesh(candidate, 2, "cpu"), device=torch.device("cpu"), seed=0)

    # The reference: the same weights, unsharded and unsplit, in this process alone.
    full = {_clean(n): _full(p).detach().clone() for n, p in model.named_parameters()}
    ref = build_model(arch, max_seq_len=SEQ, loss_chunk_tokens=8)
    ref.to_empty(device="cpu")
    ref.init_weights()
    ref.load_state_dict(full, strict=False)

    gen = torch.Generator().manual_seed(11)
    tokens = torch.randint(0, arch.vocab_size, (2, SEQ), generator=gen)
    labels = torch.randint(0, arch.vocab_size, (2, SEQ), generator=gen)
    labels[0, 13:] = IGNORE_INDEX  # unequal valid labels per rank: the loss weighting must cope
    ref_loss = ref(tokens, labels)
    ref_loss.backward()

    part = cp.batch(tokens, labels)
    loss = model(part.inputs, part.labels, cp.positions) * part.loss_weight
    loss.backward()
    mean = loss.detach().clone()
    dist.all_reduce(mean)
    torch.testing.assert_close(mean / 2, ref_loss.detach(), rtol=1e-5, atol=1e-6, msg=name)
    ref_grads = {n: p.grad for n, p in ref.named_parameters()}
    for pname, param in model.named_parameters():
        assert param.grad is not None, pname
        grad = _full(param.grad)
        ref_grad = ref_grads[_clean(pname)]
        torch.testing.assert_close(grad, ref_grad, rtol=1e-4, atol=1e-6, msg=f"{name} {pname}")


class _CountCollectives(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Counts the functional collectives dispatched while active."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.counts: dict[str, int] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = str(func)
        if name.startswith("_c10d_functional.") and "wait" not in name and "wrap" not in name:
            self.counts[name] = self.counts.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


def _check_collectives(ac: str, cp: ContextParallel) -> None:
    """Per layer: one K/V all-gather forward, one reduce-scatter backward, one more gather if recomputed."""
    candidate = _candidate(activation_checkpointing=ac, sharding="none", shard_degree=1, replicate_degree=2)
    model = build_model(_arch(2), max_seq_len=SEQ, loss_chunk_tokens=8)
    for module in model.modules():
        if isinstance(module, Attention):
            module.attend = cp
    parallelize(model, candidate, build_mesh(candidate, 2, "cpu"), device=torch.device("cpu"), seed=0)
    tokens = torch.arange(2 * SEQ).view(2, SEQ) % 96
    part = cp.batch(tokens, tokens)
    with _CountCollectives() as forward:
        loss = model(part.inputs, part.labels, cp.positions)
    with _CountCollectives() as backward:
        loss.backward()
    layers = 2
    gather, scatter = (
        "_c10d_functional.all_gather_into_tensor.default",
        "_c10d_functional.reduce_scatter_tensor.default",
    )
    assert forward.counts == {gather: layers}, forward.counts
    regather = {gather: layers} if ac != "none" else {}
    assert backward.counts == {scatter: layers, **regather}, (ac, backward.counts)


def _trainer_losses(rank: int, steps: int, **chosen: Any) -> list[float]:
    """Losses of the real Trainer on the tiny plan, fed as train.run feeds it (data by dp rank)."""
    plan = tiny_plan(**chosen)
    runtime = Runtime(rank, rank, 2, 2, torch.device("cpu"))
    trainer = Trainer(plan, runtime)
    source = _token_source(plan, runtime)
    return [trainer.step([source.next_batch()]).loss for _ in range(steps)]


def _worker(rank: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        torch.set_num_threads(1)
        cp = ContextParallel.create(2, sequence_length=SEQ, device=torch.device("cpu"))
        for name, case in CASES.items():
            _check_case(name, case, cp)
        for ac in ("none", "selective"):
            _check_collectives(ac, cp)
        # The trainer's step: CP=2 with 4 sequences per group against 2 data-parallel ranks with 2 each
        # (the same 4 samples per step, the same sharded initial weights): the same losses, step by step.
        split = _trainer_losses(rank, 3, contextParallel=2, microBatchSize=4)
        plain = _trainer_losses(rank, 3, contextParallel=1, microBatchSize=2)
        assert split == pytest.approx(plain, rel=1e-5), (split, plain)
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
def test_cp2_matches_the_unsplit_model_in_loss_and_gradients() -> None:
    port = free_port()
    # Raises here with the worker's assertion if any case differs.
    spawn_two_ranks(_worker, (port,))


# --- the real entry point: CP=2 on 2 processes trains, checkpoints and resumes exactly


@pytest.mark.distributed
def test_trainer_runs_cp2_checkpoints_and_resumes_exactly(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    plan = write_plan(tmp_path, steps=4, checkpoint=ckpt, interval=2, contextParallel=2)
    # 2 processes, one CP group: a data-parallel world of one, so the global batch is one rank's 4 sequences.
    edit_plan(plan, lambda p: p.update(globalBatchTokens=4 * 32))
    first = run_to_end(plan)
    assert sorted(first.losses()) == [1, 2, 3, 4]
    assert "tokens/s/gpu" in first.output
    shutil.rmtree(ckpt / "step-000004")
    resumed = run_to_end(plan)
    assert "resumed at step 2" in resumed.output
    # Steps 3-4 again from the step-2 checkpoint in fresh processes: the same losses as the first time.
    assert resumed.losses() == {s: first.losses()[s] for s in (3, 4)}
