"""FSDP2's float8 all-gather (tuning.Tuning.fp8_all_gather) on one gloo rank: the weights really travel
as float8, the losses equal the plain gather's, checkpoints round-trip, and the other recipes refuse it.

One rank is what gloo runs: with two, gloo's all-gather refuses float8 tensors ("Invalid scalar type").
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torchao.float8.fsdp_utils import WeightWithDynamicFloat8CastTensor  # the dev extra: never skipped

from blackwell_trainer.checkpoint.store import Checkpointer
from blackwell_trainer.data.tokens import Batch
from blackwell_trainer.loop.trainer import Trainer
from blackwell_trainer.parallel.runtime import Runtime
from blackwell_trainer.plan.config import CheckpointConfig, Plan
from blackwell_trainer.plan.tuning import Tuning, TuningError
from tests.ports import free_port
from tests.support.plans import one_gpu_plan_file, tiny_plan

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.filterwarnings("ignore:.*torch.distributed.*:UserWarning"),
    pytest.mark.filterwarnings("ignore:DTensor random operators:UserWarning"),
]
CPU = torch.device("cpu")
ONE = Runtime(rank=0, local_rank=0, world_size=1, local_world_size=1, device=CPU)
GATHER, NO_GATHER = Tuning(single_device="fsdp", fp8_all_gather="on"), Tuning(single_device="fsdp")


@pytest.fixture
def one_rank() -> Iterator[None]:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _plan(recipe: str = "torchao-tensorwise", **chosen: Any) -> Plan:
    plan = tiny_plan(shardDegree=1, precision="fp8", precisionRecipe=recipe, **chosen)
    plan.gpus_per_node = 1
    return plan


def _batches(count: int) -> list[list[Batch]]:
    tokens = torch.randint(0, 256, (4, 33), generator=torch.Generator().manual_seed(5))
    return [[Batch(tokens[:, :-1], tokens[:, 1:])] for _ in range(count)]


def _train(trainer: Trainer, batches: list[list[Batch]]) -> list[float]:
    return [trainer.step(b).loss for b in batches]


def _local_types(trainer: Trainer) -> dict[str, type]:
    return {name: type(p.to_local()) for name, p in trainer.model.named_parameters()}  # type: ignore[operator]


def test_the_block_weights_are_all_gathered_as_float8_with_scales_from_after_the_step(
    one_rank: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    gathered: list[
        tuple[torch.dtype, bool]
    ] = []  # each gathered weight's dtype, cast with a precomputed scale
    real = WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather

    @functools.wraps(real)  # FSDP2 reads the hook's signature
    def spy(self: Any, *args: Any, **kwargs: Any) -> Any:
        precomputed = self._precomputed_scale is not None
        inputs, metadata = real(self, *args, **kwargs)
        gathered.extend((t.dtype, precomputed) for t in inputs)
        return inputs, metadata

    monkeypatch.setattr(WeightWithDynamicFloat8CastTensor, "fsdp_pre_all_gather", spy)
    trainer = Trainer(_plan(), ONE, tuning=GATHER)
    assert trainer.precision.fp8_all_gather
    types = _local_types(trainer)
    linears = {n for n in types if ".attention.w" in n or ".feed_forward.w" in n}
    assert len(linears) == 14  # 2 blocks x (q, k, v, o, gate, up, down)
    assert {types[n] for n in linears} == {WeightWithDynamicFloat8CastTensor}
    # The embedding, the norms and the output head stay high precision and gather as such.
    assert all(types[n] is torch.Tensor for n in set(types) - linears)
    _train(trainer, _batches(2))
    # Every gather of a block's weights is float8_e4m3fn: the forward's of both blocks, the backward's of
    # the first (the last block stays gathered from its forward: parallelize.apply_fsdp), each step.
    per_step = len(linears) + len(linears) // 2
    assert len(gathered) == 2 * per_step
    assert {dtype for dtype, _ in gathered} == {torch.float8_e4m3fn}
    # The first step's casts compute their own scales; from the second on, each uses the one the hook
    # after the optimizer step computed for all weights at once.
    assert [pre for _, pre in gathered] == [False] * per_step + [True] * per_step


def test_losses_equal_the_bf16_gather_from_the_same_seed(one_rank: None) -> None:
    steps = _batches(6)
    plain = Trainer(_plan(), ONE, tuning=NO_GATHER)
    assert not plain.precision.fp8_all_gather
    assert set(_local_types(plain).values()) == {torch.Tensor}  # the control gathers plain weights
    gathered = Trainer(_plan(), ONE, tuning=GATHER)
    want, got = _train(plain, steps), _train(gathered, steps)
    # fp32 parameters on the CPU: the cast before the gather and the one after it see the same weight.
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    assert want[-1] < want[0] - 0.5  # the runs learn: equal losses are not equal nothing


@pytest.mark.parametrize("loader", [GATHER, NO_GATHER], ids=["gather-to-gather", "gather-to-bf16"])
def test_a_checkpoint_saved_with_the_float8_gather_resumes(
    one_rank: None, tmp_path: Path, loader: Tuning
) -> None:
    plan, steps = _plan(), _batches(5)
    first = Trainer(plan, ONE, tuning=GATHER)
    _train(first, steps[:2])
    config = CheckpointConfig(path=str(tmp_path), interval_steps=1, keep_latest=2)
    Checkpointer(config, rank=0).save(2, first.model, first.optimizer, {"step": 2})
    plan.dataset.seed = 99  # another initial state, which the load must replace
    second = Trainer(plan, ONE, tuning=loader)
    assert Checkpointer(config, rank=0).load(second.model, second.optimizer) is not None
    second.step_index = 2  # loaded before any step (as train.py resumes): its first gathers cast afresh
    torch.testing.assert_close(_train(second, steps[2:]), _train(first, steps[2:]), rtol=1e-6, atol=1e-6)


def test_auto_gathers_float8_only_where_ranks_shard_the_weights_and_only_tensorwise() -> None:
    auto = Tuning()
    assert auto.fp8_all_gather == "auto"
    assert auto.gathers_fp8(shard_ranks=8, tensorwise=True)
    assert not auto.gathers_fp8(shard_ranks=1, tensorwise=True)
    assert not auto.gathers_fp8(shard_ranks=8, tensorwise=False)
    assert GATHER.gathers_fp8(shard_ranks=1, tensorwise=True)
    assert not Tuning(fp8_all_gather="off").gathers_fp8(shard_ranks=8, tensorwise=True)
    assert Tuning.parse("fp8-all-gather=on") == Tuning(fp8_all_gather="on")
    with pytest.raises(TuningError, match="fp8_all_gather takes one of auto, on, off, not 'yes'"):
        Tuning.parse("fp8_all_gather=yes")


@pytest.mark.parametrize("recipe", ["torchao-rowwise", "bf16"])
def test_on_with_another_recipe_is_refused_naming_the_switch_and_the_fix(one_rank: None, recipe: str) -> None:
    plan = tiny_plan(shardDegree=1) if recipe == "bf16" else _plan(recipe)
    plan.gpus_per_node = 1
    with pytest.raises(TuningError, match="fp8_all_gather=on needs torchao's tensorwise FP8 recipe") as err:
        Trainer(plan, ONE, tuning=GATHER)
    assert "Fix: fp8_all_gather=auto or off" in str(err.value)
    # auto leaves it off there, and on one rank's single-device path there is no gather to change.
    assert not Trainer(
        _plan("torchao-rowwise"), ONE, tuning=Tuning(single_device="fsdp")
    ).precision.fp8_all_gather
    assert not Trainer(_plan(), ONE, tuning=Tuning(fp8_all_gather="on")).precision.fp8_all_gather


def test_the_trainer_refuses_on_with_another_recipe_in_one_line_before_building(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], world_of_one: None
) -> None:
    from blackwell_trainer.train import main

    path = one_gpu_plan_file(tmp_path)
    monkeypatch.setenv("BTJ_TERMINATION_LOG", str(tmp_path / "termination-log"))
    monkeypatch.setenv("BTJ_TRAINER_TUNING", "fp8_all_gather=on")
    assert main(["--plan", str(path)]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "BTJ_TRAINER_TUNING: fp8_all_gather=on needs" in errors[0], errors
