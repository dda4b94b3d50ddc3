"""The ``overlap_optimizer`` switch (issue 38): the optimizer step queued block by block beside the next
forward. On the CPU the same blocks are stepped in line, so these tests hold the block split, the
subset steps and the model's waits to the one-stream step bit for bit; the stream itself runs on a GPU
(docs/benchmarks/titan_h100.md)."""

from __future__ import annotations

import pytest
import torch

import tests.support.loss_reference as reference
from blackwell_trainer.loop.optimizer import AdamW
from blackwell_trainer.loop.overlap import OverlappedStep, chunk_key, forward_chunks
from blackwell_trainer.loop.trainer import Trainer
from blackwell_trainer.plan.tuning import Tuning

pytestmark = pytest.mark.filterwarnings("ignore:.*torch.distributed.*:UserWarning")


def test_parameters_fall_into_their_block_or_top_level_module() -> None:
    assert chunk_key("tok_embeddings.weight") == "tok_embeddings"
    assert chunk_key("layers.11.attention.wq.weight") == "layers.11"
    assert chunk_key("layers.3._checkpoint_wrapped_module.ffn_norm.weight") == "layers.3"
    assert chunk_key("output.weight") == "output"


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "foreach"])
def test_stepping_block_by_block_gives_the_one_step_weights_and_state_bit_for_bit(fused: bool) -> None:
    """Three steps with a clip scale: the whole step against the blocks in turn (empty groups included:
    a block's norms are its only undecayed parameters, the output head has none)."""
    runs = []
    with reference.one_rank_group():
        for chunked in (False, True):
            model = _trainer(Tuning()).model  # the plan's seed: the same weights both times
            params = list(model.parameters())
            generator = torch.Generator().manual_seed(1)
            grads = [torch.randn(p.shape, generator=generator) for p in params]
            opt = AdamW(
                [
                    {"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
                    {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
                ],
                lr=1e-2,
                fused=fused,
            )
            for step in range(3):
                for param, grad in zip(params, grads, strict=True):
                    param.grad = grad * (step + 1)
                opt.grad_scale = torch.tensor(1.5) if fused else None
                if not chunked:
                    opt.step()
                    continue
                for _, members in forward_chunks(model):
                    ids = {id(p) for p in members}
                    opt.step_only([[p for p in g["params"] if id(p) in ids] for g in opt.param_groups])
            runs.append((params, opt.state_dict()))
    (whole, whole_state), (blocks, block_state) = runs
    for a, b in zip(whole, blocks, strict=True):
        assert torch.equal(a, b)
    for key, state in whole_state["state"].items():
        for name in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(block_state["state"][key][name], state[name])
    assert block_state["param_groups"] == whole_state["param_groups"]  # the groups are restored


def _trainer(tuning: Tuning) -> Trainer:
    return Trainer(reference.reference_plan(), reference.ONE, tuning=tuning, compute_dtype=torch.bfloat16)


def _losses(tuning: Tuning) -> tuple[list[float], dict[str, torch.Tensor]]:
    with reference.one_rank_group():
        trainer = _trainer(tuning)
        losses = [trainer.step(batch).loss for batch in reference.reference_batches()]
        return losses, {n: p.detach().clone() for n, p in trainer.model.named_parameters()}


@pytest.mark.parametrize(
    "switches",
    [{}, {"bf16_gradients": True}, {"clip_in_optimizer": False}],
    ids=["defaults", "bf16-gradients", "separate-clip"],
)
def test_the_overlapped_step_trains_the_same_losses_and_weights_bit_for_bit(
    switches: dict[str, bool],
) -> None:
    plain_losses, plain_weights = _losses(Tuning(**switches))  # type: ignore[arg-type]
    losses, weights = _losses(Tuning(overlap_optimizer=True, **switches))  # type: ignore[arg-type]
    assert losses == plain_losses
    for name, weight in plain_weights.items():
        assert torch.equal(weights[name], weight), name


def test_the_forward_waits_for_each_block_before_it_reads_its_weights() -> None:
    """The model names every unit of the overlapped step, in the order the step queues them, and a block
    (or the final norm) runs only after its name was called."""
    with reference.one_rank_group():
        trainer = _trainer(Tuning(overlap_optimizer=True))
        assert isinstance(trainer.overlap, OverlappedStep)
        model = trainer.model
        waited: list[str] = []
        model.await_weights = waited.append
        early: list[str] = []

        def check(unit: str) -> None:
            def hook(_module: torch.nn.Module, _args: object) -> None:
                if unit not in waited:
                    early.append(unit)

            return hook  # type: ignore[return-value]

        handles = [
            block.register_forward_pre_hook(check(f"layers.{key}")) for key, block in model.layers.items()
        ]
        handles.append(model.norm.register_forward_pre_hook(check("norm")))
        batch = reference.reference_batches()[0][0]
        model(batch.inputs, batch.labels)
        for handle in handles:
            handle.remove()
    assert early == []
    assert list(dict.fromkeys(waited)) == [key for key, _ in forward_chunks(model)] == trainer.overlap.keys


def test_without_a_single_device_the_switch_is_off_and_says_why(caplog: pytest.LogCaptureFixture) -> None:
    with reference.one_rank_group(), caplog.at_level("WARNING"):
        trainer = _trainer(Tuning(overlap_optimizer=True, single_device="fsdp"))
    assert trainer.overlap is None
    assert "overlap_optimizer off: FSDP2" in caplog.text
