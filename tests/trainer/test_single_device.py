"""The single-device path (no FSDP2 on one rank) against FSDP2 on one rank: same losses, checkpoints
that load either way, and the step-level switches of tuning.py."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from blackwell_trainer.checkpoint.store import Checkpointer
from blackwell_trainer.data.tokens import Batch
from blackwell_trainer.loop.optimizer import build_optimizer
from blackwell_trainer.loop.trainer import Trainer
from blackwell_trainer.parallel.runtime import Runtime
from blackwell_trainer.plan.config import CheckpointConfig, Plan
from blackwell_trainer.plan.tuning import Tuning, TuningError
from tests.ports import free_port
from tests.support.plans import tiny_plan

CPU = torch.device("cpu")
ONE = Runtime(rank=0, local_rank=0, world_size=1, local_world_size=1, device=CPU)
# The same optimizer kernels on both paths (compiled_update acts on the single-device path only, and its
# own tests compare it with torch's): what these compare is the model's computation.
SINGLE, FSDP = Tuning(compiled_update=False), Tuning(single_device="fsdp")
pytestmark = pytest.mark.filterwarnings("ignore:.*torch.distributed.*:UserWarning")


@pytest.fixture
def one_rank() -> Iterator[None]:
    """A gloo process group of one in this process (conftest's world_of_one sets only the environment)."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _plan(**chosen: object) -> Plan:
    plan = tiny_plan(shardDegree=1, **chosen)
    plan.gpus_per_node = 1
    return plan


def _batches(seed: int, count: int) -> list[list[Batch]]:
    """One random batch, `count` times: the loss falls as the model learns it by heart."""
    tokens = torch.randint(0, 256, (4, 33), generator=torch.Generator().manual_seed(seed))
    return [[Batch(tokens[:, :-1], tokens[:, 1:])] for _ in range(count)]


def _full(param: torch.Tensor) -> torch.Tensor:
    full = getattr(param, "full_tensor", None)
    return (full() if callable(full) else param).detach()


def _train(trainer: Trainer, batches: list[list[Batch]]) -> list[float]:
    return [trainer.step(b).loss for b in batches]


def test_one_rank_takes_the_single_device_path_by_default_and_fsdp2_when_told(one_rank: None) -> None:
    assert Tuning().single_device == "auto"  # since it ran on one H200 (docs/trainer.md)
    single = Trainer(_plan(), ONE, tuning=SINGLE)
    assert single.single_device
    assert not any(hasattr(p, "to_local") for p in single.model.parameters())
    assert all(p.dtype == torch.float32 for p in single.model.parameters())
    fsdp = Trainer(_plan(), ONE, tuning=FSDP)
    assert not fsdp.single_device
    assert all(hasattr(p, "to_local") for p in fsdp.model.parameters())


@pytest.mark.parametrize("accumulation", [1, 2])
def test_single_device_losses_and_weights_equal_fsdp2_on_one_rank_fp32(
    one_rank: None, accumulation: int
) -> None:
    plan = _plan(microBatchSize=4 // accumulation, gradientAccumulationSteps=accumulation)
    steps = [[Batch(m.inputs[j::accumulation], m.labels[j::accumulation]) for j in range(accumulation)
              for m in b] for b in _batches(0, 6)]  # fmt: skip
    single, fsdp = Trainer(plan, ONE, tuning=SINGLE), Trainer(plan, ONE, tuning=FSDP)
    # A control: the two start from the same initial weights (one seed, one RNG stream on CPU).
    for (name, a), b in zip(single.model.named_parameters(), fsdp.model.parameters(), strict=True):
        torch.testing.assert_close(a.detach(), _full(b), rtol=0, atol=0, msg=name)
    ours, theirs = _train(single, steps), _train(fsdp, steps)
    assert ours[-1] < ours[0]  # it trains
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)
    for (name, a), b in zip(single.model.named_parameters(), fsdp.model.parameters(), strict=True):
        torch.testing.assert_close(a.detach(), _full(b), rtol=1e-5, atol=1e-6, msg=name)


def test_single_device_bf16_compute_matches_fsdp2_bf16_mixed_precision(one_rank: None) -> None:
    plan, steps = _plan(), _batches(1, 5)
    single = Trainer(plan, ONE, tuning=SINGLE, compute_dtype=torch.bfloat16)
    fsdp = Trainer(plan, ONE, tuning=FSDP, compute_dtype=torch.bfloat16)
    assert single.model.compute_dtype == torch.bfloat16
    assert all(p.dtype == torch.float32 for p in single.model.parameters())  # fp32 masters kept
    ours, theirs = _train(single, steps), _train(fsdp, steps)
    fp32 = _train(Trainer(plan, ONE, tuning=SINGLE), steps)
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-6)  # bit for bit on CPU
    # A control that the comparison can fail: bf16 compute is not the fp32 run.
    assert max(abs(a - b) for a, b in zip(ours, fp32, strict=True)) > 1e-4


@pytest.mark.parametrize("path", [SINGLE, FSDP], ids=["single-device", "fsdp2"])
def test_clipping_inside_the_fused_step_equals_clipping_before_it(one_rank: None, path: Tuning) -> None:
    plan, steps = _plan(), _batches(2, 6)
    plan.optimizer.grad_clip_norm = 0.05  # far below the tiny model's gradient norm: clipping acts
    runs = []
    assert path.clip_in_optimizer  # the default since it ran on one H100 (docs/trainer.md)
    for tuning in (replace(path, clip_in_optimizer=False), path):
        trainer = Trainer(plan, ONE, tuning=tuning)
        trainer.optimizer = build_optimizer(trainer.model, plan, CPU, fused=True)
        runs.append((_train(trainer, steps), trainer))
    (plain, _), (folded, trainer) = runs
    grads = [p.grad for p in trainer.model.parameters() if p.grad is not None]
    assert not grads  # zeroed after each step; the norm the last step clipped is read back instead
    scale = getattr(trainer.optimizer, "grad_scale", None)
    assert scale is not None and float(scale) > 10  # the folded path ran, and clipping acted
    assert getattr(trainer.optimizer, "grad_scale", None) is not None  # the folded path ran
    torch.testing.assert_close(folded, plain, rtol=1e-5, atol=1e-5)
    # Switched off again (as the A/B script does between windows): no scale is left to divide by twice.
    trainer.tuning = replace(path, clip_in_optimizer=False)
    trainer.step(steps[0])
    assert trainer.optimizer.grad_scale is None  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "saver,loader", [(SINGLE, FSDP), (FSDP, SINGLE)], ids=["single-to-fsdp", "fsdp-to-single"]
)
def test_a_checkpoint_of_either_path_resumes_on_the_other(
    one_rank: None, tmp_path: Path, saver: Tuning, loader: Tuning
) -> None:
    plan, steps = _plan(), _batches(3, 5)
    first = Trainer(plan, ONE, tuning=saver)
    _train(first, steps[:2])
    config = CheckpointConfig(path=str(tmp_path), interval_steps=1, keep_latest=2)
    Checkpointer(config, rank=0).save(2, first.model, first.optimizer, {"step": 2})
    plan.dataset.seed = 99  # another initial state, which the load must replace
    second = Trainer(plan, ONE, tuning=loader)
    assert Checkpointer(config, rank=0).load(second.model, second.optimizer) is not None
    second.step_index = 2
    torch.testing.assert_close(_train(second, steps[2:]), _train(first, steps[2:]), rtol=1e-6, atol=1e-6)


def test_tuning_is_read_as_key_value_pairs_and_bad_entries_name_the_key() -> None:
    assert Tuning.parse("") == Tuning()
    parsed = Tuning.parse("single-device=fsdp, clip_in_optimizer=false,parameter_check=off")
    assert parsed == Tuning(single_device="fsdp", clip_in_optimizer=False, parameter_check=False)
    assert Tuning.parse("single_device=auto") == Tuning()
    with pytest.raises(TuningError, match="'colour=red' is not key=value with a key among"):
        Tuning.parse("colour=red")
    with pytest.raises(TuningError, match="compile_mode takes one of default, "):
        Tuning.parse("compile_mode=fastest")
    with pytest.raises(TuningError, match="parameter_check takes true or false, not 'maybe'"):
        Tuning.parse("parameter_check=maybe")
    assert Tuning.parse("attention=cudnn,manual_gc=on") == Tuning(attention="cudnn", manual_gc=True)
    with pytest.raises(TuningError, match="attention takes one of default, cudnn, flash, not 'xformers'"):
        Tuning.parse("attention=xformers")
    assert not SINGLE.use_single_device(world_size=1, context_parallel=1, backend="te")
    assert not SINGLE.use_single_device(world_size=2, context_parallel=1, backend="bf16")
    assert SINGLE.use_single_device(world_size=1, context_parallel=1, backend="bf16")


def test_fused_projections_give_the_losses_of_separate_ones(one_rank: None) -> None:
    plan, steps = _plan(), _batches(4, 5)
    fused = Trainer(plan, ONE, tuning=Tuning(fuse_projections=True))
    blocks = [m for m in fused.model.modules() if hasattr(m, "fuse")]
    assert len(blocks) == 2 * plan.architecture.num_layers and all(m.fuse for m in blocks)
    plain = Trainer(plan, ONE, tuning=SINGLE)
    assert not any(m.fuse for m in plain.model.modules() if hasattr(m, "fuse"))
    torch.testing.assert_close(_train(fused, steps), _train(plain, steps), rtol=1e-5, atol=1e-5)
    # FSDP2 keeps separate matmuls (its weights are gathered copies, a concatenation would be one more).
    fsdp = Trainer(plan, ONE, tuning=Tuning(single_device="fsdp", fuse_projections=True))
    assert not any(m.fuse for m in fsdp.model.modules() if hasattr(m, "fuse"))


def test_recast_blocks_keep_no_bf16_weight_for_backward_and_give_the_same_losses(
    one_rank: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from blackwell_trainer.model import recast

    packed: list[tuple[int, ...]] = []
    init = recast._Recast.__init__

    def counting(self: recast._Recast, param: torch.Tensor, dtype: torch.dtype, view: torch.Tensor) -> None:
        packed.append(tuple(param.shape))
        init(self, param, dtype, view)

    monkeypatch.setattr(recast._Recast, "__init__", counting)
    plan, steps = _plan(), _batches(5, 4)
    tuned = Trainer(plan, ONE, tuning=replace(SINGLE, recast_blocks=True), compute_dtype=torch.bfloat16)
    assert tuned.model.recast_blocks
    plain = Trainer(plan, ONE, tuning=SINGLE, compute_dtype=torch.bfloat16)
    assert not plain.model.recast_blocks  # a CPU keeps its copies unless asked (no memory rule there)
    ours = _train(tuned, steps)
    # Every matrix of every block was saved for backward as its fp32 parameter, not as a bf16 copy.
    matrices = [tuple(p.shape) for n, p in tuned.model.layers.named_parameters() if p.dim() == 2]
    assert set(matrices) <= set(packed) and len(packed) >= len(steps) * len(matrices)
    torch.testing.assert_close(ours, _train(plain, steps), rtol=1e-6, atol=1e-6)
    # Under AC the recompute would see the restored fp32 weights: the switch is not taken there.
    ac = Trainer(_plan(activationCheckpointing="full"), ONE, tuning=Tuning(recast_blocks=True),
                 compute_dtype=torch.bfloat16)  # fmt: skip
    assert not ac.model.recast_blocks


@pytest.mark.parametrize("backend", ["cudnn", "flash"])
def test_an_attention_kernel_order_gives_the_default_losses(one_rank: None, backend: str) -> None:
    """The order only picks SDPA's kernel: on CPU every order ends in the math kernel, bit for bit."""
    from blackwell_trainer.model.transformer import Attention, causal_attention

    plan, steps = _plan(), _batches(6, 4)
    ordered = Trainer(plan, ONE, tuning=Tuning(attention=backend))
    attends = [m.attend for m in ordered.model.modules() if isinstance(m, Attention)]
    assert len(attends) == plan.architecture.num_layers
    assert all(a is not causal_attention for a in attends)  # every block got the ordered call
    plain = Trainer(plan, ONE, tuning=SINGLE)
    assert all(m.attend is causal_attention for m in plain.model.modules() if isinstance(m, Attention))
    torch.testing.assert_close(_train(ordered, steps), _train(plain, steps), rtol=0, atol=0)


def test_manual_gc_turns_the_collector_off_and_collects_the_young_every_50_steps(
    one_rank: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gc

    from blackwell_trainer.plan.tuning import GC_EVERY_STEPS

    collected: list[int] = []
    monkeypatch.setattr(gc, "collect", lambda generation=2: collected.append(generation) or 0)
    plan, steps = _plan(), _batches(7, 3)
    manual = Trainer(plan, ONE, tuning=Tuning(manual_gc=True))
    try:
        manual.step_index = GC_EVERY_STEPS - 2  # the next steps are 49, 50 and 51
        losses = _train(manual, steps)
        assert not gc.isenabled()
        assert collected == [1]  # step 50 only, the young generations only
    finally:
        gc.enable()
    plain = Trainer(plan, ONE, tuning=SINGLE)
    plain.step_index = GC_EVERY_STEPS - 2  # the same learning rates
    torch.testing.assert_close(losses, _train(plain, steps), rtol=0, atol=0)
    assert gc.isenabled() and collected == [1]  # the default leaves Python's collector alone


def test_cuda_graphs_are_told_where_each_micro_batch_starts(
    one_rank: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """compile_mode=reduce-overhead replays CUDA graphs into static buffers: without a step mark a replay
    could overwrite the previous micro-batch's loss or saved activations before backward reads them."""
    marks: list[int] = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    plan = _plan()
    two_micro_batches = [b[0] for b in _batches(3, 2)]
    graphs = Trainer(plan, ONE, tuning=Tuning(compile_mode="reduce-overhead"))
    graphs.step(two_micro_batches)
    assert len(marks) == 2  # one per forward
    Trainer(plan, ONE, tuning=SINGLE).step(two_micro_batches)
    assert len(marks) == 2  # the default compiles without CUDA graphs: nothing to mark


@pytest.mark.usefixtures("world_of_one")
def test_a_bad_tuning_entry_stops_the_trainer_with_one_line_before_anything_is_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from blackwell_trainer.train import main
    from tests.support.plans import one_gpu_plan_file

    path = one_gpu_plan_file(tmp_path)
    monkeypatch.setenv("BTJ_TERMINATION_LOG", str(tmp_path / "termination-log"))
    monkeypatch.setenv("BTJ_TRAINER_TUNING", "single_device=fsdp,recast=yes")
    assert main(["--plan", str(path)]) == 2
    stderr = capsys.readouterr().err
    errors = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert errors == [
        "error: BTJ_TRAINER_TUNING: 'recast=yes' is not key=value with a key among attention, "
        "batched_update, bf16_gradients, clip_in_optimizer, compile_mode, compiled_update, "
        "fp32_weight_gradients, fp8_all_gather, fp8_pow2_scales, fp8_skip_small, fuse_projections, "
        "manual_gc, parameter_check, "
        "recast_blocks, single_device"
    ], stderr[-2000:]


def test_only_the_models_own_linears_are_fused() -> None:
    from blackwell_trainer.model.transformer import build_model
    from blackwell_trainer.parallel.parallelize import apply_fused_projections

    model = build_model(tiny_plan().architecture, max_seq_len=32, device="cpu")
    block = model.layers["0"]
    old = block.attention.wk
    # A replacement module (as float8 or TE conversion leaves): its scaling is per weight, not fusable.
    block.attention.wk = torch.nn.Linear(old.in_features, old.out_features, bias=False)
    assert apply_fused_projections(model) == 2 * len(model.layers) - 1
    assert not block.attention.fuse and block.feed_forward.fuse and model.layers["1"].attention.fuse


def _clip_on_two_ranks(rank: int, port: int, out: str) -> None:
    import json
    import os

    from blackwell_trainer.parallel.runtime import init_distributed
    from tests.trainer.conftest import join_two_rank_world

    join_two_rank_world(rank, port, os.devnull)
    runtime = Runtime.from_env()
    init_distributed(runtime)
    plan = tiny_plan()  # FSDP2 full shard over the two ranks
    plan.optimizer.grad_clip_norm = 0.05
    runs, scales = [], []
    for tuning in (Tuning(clip_in_optimizer=False), Tuning(clip_in_optimizer=True)):
        trainer = Trainer(plan, runtime, tuning=tuning)
        trainer.optimizer = build_optimizer(trainer.model, plan, CPU, fused=True)
        runs.append(_train(trainer, _batches(10 + rank, 4)))
        scales.append(getattr(trainer.optimizer, "grad_scale", None) is not None)
    if rank == 0:
        Path(out).write_text(json.dumps({"runs": runs, "scaled": scales}))
    dist.destroy_process_group()


@pytest.mark.distributed
def test_clipping_inside_the_fused_step_holds_for_fsdp2_on_two_ranks(tmp_path: Path) -> None:
    import json

    from tests.trainer.conftest import spawn_two_ranks

    out = tmp_path / "runs.json"
    spawn_two_ranks(_clip_on_two_ranks, (free_port(), str(out)))
    result = json.loads(out.read_text())
    plain, folded = result["runs"]
    assert result["scaled"] == [False, True]  # the sharded gradients' step took the folded path
    torch.testing.assert_close(folded, plain, rtol=1e-5, atol=1e-5)
