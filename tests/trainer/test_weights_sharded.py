"""Weights into and out of the FSDP2-sharded model on 2 gloo processes.

Under full sharding each rank reads only its own rows of every tensor (about half the bytes each); with
plain replication (a 2-D mesh) each reads its whole copy. Either way the model's loss equals transformers'
on the same tokens, and the streamed export (one gathered tensor at a time, written by rank 0) reloads in
transformers with the input's logits.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from blackwell_trainer.loop.trainer import Trainer
from blackwell_trainer.parallel.runtime import Runtime
from blackwell_trainer.plan.config import Plan
from blackwell_trainer.weights.export import export_model
from blackwell_trainer.weights.load import load_pretrained
from tests.ports import free_port
from tests.support.hf_models import SEQ, architecture_of, hf_logits, save_hf_model, tokens
from tests.support.plans import tiny_plan_dict

from .conftest import spawn_two_ranks

pytest.importorskip(
    "transformers", reason="transformers (the dev extra) is missing: bash scripts/bootstrap.sh --all"
)
FAMILY = "qwen2.5"  # Q/K/V biases (1-D shards) and an untied head


# (sharding, shardDegree, replicateDegree): FSDP over both ranks, and plain replication (a 2-D mesh whose
# shard dimension is 1: every rank holds, so reads, every tensor whole).
LAYOUTS = {"full": ("full", 2, 1), "replicated": ("none", 1, 2)}


def _plan(folder: Path, layout: str) -> Plan:
    arch = architecture_of(folder)
    sharding, shard, replicate = LAYOUTS[layout]
    wire = tiny_plan_dict(lossChunkTokens=0, sharding=sharding, shardDegree=shard, replicateDegree=replicate)
    wire.update(
        architecture=arch.model_dump(by_alias=True, exclude_none=True),
        parameterCount=arch.parameter_count(),
        sequenceLength=SEQ,
        weights={"uri": str(folder)},
    )
    return Plan.model_validate(wire)


def _worker(rank: int, port: int, root: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        torch.set_num_threads(1)
        folder = Path(root) / "hf"
        for layout in LAYOUTS:
            plan = _plan(folder, layout)
            trainer = Trainer(plan, Runtime(rank, rank, 2, 2, torch.device("cpu")))
            report = load_pretrained(trainer.model, str(folder), plan.architecture, SEQ)
            ids = tokens()
            labels = torch.roll(ids, -1, dims=1)
            with torch.no_grad():
                loss = float(trainer.model(ids, labels))
            export_model(
                trainer.model,
                plan.architecture,
                str(Path(root) / f"out-{layout}"),
                sequence_length=SEQ,
                weights_uri=str(folder),
                is_writer=rank == 0,
                max_shard_bytes=100_000,
            )
            result = {"bytes": report.bytes_read, "loss": loss}
            (Path(root) / f"{layout}-rank-{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
def test_two_ranks_load_their_own_slices_and_export_the_model_whole(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    reference = save_hf_model(FAMILY, tmp_path / "hf")
    spawn_two_ranks(_worker, (free_port(), str(tmp_path)))

    total = sum(p.numel() * p.element_size() for p in reference.parameters())
    ids = tokens()
    logits = hf_logits(reference, ids)
    expected = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), torch.roll(ids, -1, dims=1).reshape(-1))
    for layout in LAYOUTS:
        ranks = [json.loads((tmp_path / f"{layout}-rank-{r}.json").read_text()) for r in range(2)]
        if layout == "full":
            assert sum(r["bytes"] for r in ranks) == total  # every byte read once, by one rank
            assert all(r["bytes"] < 0.6 * total for r in ranks)  # neither rank read (nor holds) the whole
        else:
            assert all(r["bytes"] == total for r in ranks)  # each replica reads its whole copy
        for r in ranks:
            assert r["loss"] == pytest.approx(float(expected), rel=1e-5), layout

        out = tmp_path / f"out-{layout}"
        assert len(json.loads((out / "model.safetensors.index.json").read_text())["weight_map"]) == len(
            list(reference.parameters())
        )
        reloaded = AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager").eval()
        torch.testing.assert_close(hf_logits(reloaded, ids), logits, atol=1e-6, rtol=1e-6)
