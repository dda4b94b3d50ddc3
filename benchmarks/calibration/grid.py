"""The calibration grids: families of configurations (everything but the micro-batch) and their Plans.

A configuration's Plan is built with the planner's `evaluate()` of the pinned candidate, so the record
carries the prediction next to the measurement.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from typing import Any

from blackwell_operator.calibrate.records import CalibrationRecord, RecordStatus
from blackwell_operator.calibration import Calibration
from blackwell_operator.catalogs import get_gpu, get_instance, resolve_model
from blackwell_operator.models.spec import BlackwellTrainingJobSpec, ModelSpec
from blackwell_operator.planner import evaluate
from blackwell_trainer.plan.config import (
    ActivationCheckpointing,
    Architecture,
    Candidate,
    GpuInfo,
    OptimizerConfig,
    Plan,
    Precision,
    PrecisionRecipe,
    Sharding,
)

H200_INSTANCE = "ml.p5en.48xlarge"
H100_INSTANCE = "ml.p5.48xlarge"
PRESETS = {"1b": "llama3.2-1b", "3b": "llama3.2-3b", "8b": "llama3.1-8b"}
# Custom architectures (Llama-3 vocabulary and GQA): a 13B class (Llama-2-13B widths) and a ~30B class
# (LLaMA-33B widths); tiny is the CPU smoke model.
CUSTOM: dict[str, dict[str, Any]] = {
    "custom-13b": dict(
        hidden_size=5120,
        num_layers=40,
        num_attention_heads=40,
        num_key_value_heads=8,
        intermediate_size=13824,
        vocab_size=128256,
    ),
    "custom-30b": dict(
        hidden_size=6656,
        num_layers=60,
        num_attention_heads=52,
        num_key_value_heads=4,
        intermediate_size=17920,
        vocab_size=128256,
    ),
    "tiny": dict(
        hidden_size=256,
        num_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=512,
        vocab_size=1024,
        tie_word_embeddings=True,
    ),
}
FP8_RECIPE = "torchao-tensorwise"  # TE is not installed on the H200 machines; torchao is carried as a wheel


@dataclass(frozen=True)
class Family:
    """Everything but the micro-batch size."""

    model: str
    sequence_length: int
    gpus: int
    precision: str
    recipe: str
    ac: str
    sharding: str = "full"
    compile: bool = True
    # Micro-batches per optimizer step: with more than one, gradients accumulate across them (a phase of
    # its own in memory, and the step's fixed work spread over more tokens).
    accumulation: int = 1

    def candidate(self, mbs: int, loss_chunk: int) -> Candidate:
        shard = self.gpus if self.sharding == "full" else 1
        return Candidate(
            precision=Precision(self.precision),
            precision_recipe=PrecisionRecipe(self.recipe),
            activation_checkpointing=ActivationCheckpointing(self.ac),
            micro_batch_size=mbs,
            gradient_accumulation_steps=self.accumulation,
            sharding=Sharding(self.sharding),
            shard_degree=shard,
            replicate_degree=self.gpus // shard,
            compile=self.compile,
            loss_chunk_tokens=loss_chunk,
        )

    def label(self) -> str:
        prec = self.precision if self.recipe == "none" else self.recipe
        ga = f" ga{self.accumulation}" if self.accumulation > 1 else ""
        return (
            f"{self.model} s{self.sequence_length} g{self.gpus} {prec} ac-{self.ac} shard-{self.sharding}{ga}"
        )


def _families(
    models: list[str],
    seqs: list[int],
    gpus: int,
    precisions: list[str],
    acs: list[str],
    shardings: tuple[str, ...] = ("full",),
    compile_blocks: bool = True,
) -> list[Family]:
    out = []
    for seq in seqs:
        for model in models:
            for sharding in shardings:
                for prec in precisions:
                    recipe = "none" if prec == "bf16" else FP8_RECIPE
                    for ac in acs:
                        out.append(Family(model, seq, gpus, prec, recipe, ac, sharding, compile_blocks))
    return out


ACS = ["none", "selective", "full"]
PRECS = ["bf16", "fp8"]
# Priority order (lanes take from the front): sequence 4096 first (it matches the reference grid),
# then 8192, 2048.
GRIDS: dict[str, list[Family]] = {
    "issue6": [
        *_families(["1b", "3b", "8b"], [4096, 8192, 2048], 1, PRECS, ACS),
        *_families(["8b", "custom-13b"], [4096, 8192, 2048], 2, PRECS, ACS),
    ],
    "issue7": [
        *_families(["8b"], [4096, 8192], 8, PRECS, ACS, ("full", "none")),
        *_families(["custom-13b", "custom-30b"], [4096, 8192], 8, PRECS, ACS),
    ],
    # Issue 37: the H100 profile. One GPU (the kind lent here), the two models that train on one 80 GB
    # card; sequence 4096 with every AC mode first, then 8192 and 2048 without full AC (never faster there).
    "h100": [
        *_families(["1b", "3b"], [4096], 1, PRECS, ACS),
        # Jobs accumulate: on one H100 (2026-12-06, docs/benchmarks/probe_h100.md) 3B FP8 at micro-batch 2
        # and 12 micro-batches a step reserved 72.2-72.5 GiB with AC none and selective alike, 3 GiB over
        # the model, while micro-batch 3 met it: a phase of accumulation no one-micro-batch record shows.
        *[replace(f, accumulation=4) for f in _families(["3b"], [4096], 1, ["fp8"], ["none", "selective"])],
        *[replace(f, accumulation=4) for f in _families(["1b"], [4096], 1, ["bf16"], ["none"])],
        *_families(["1b", "3b"], [8192], 1, PRECS, ["none", "selective"]),
        *_families(["3b", "1b"], [2048], 1, PRECS, ["none"]),
        # Full AC beside 4096 (added 2026-12-07 for the held-out check): with full AC measured only at 4096, a
        # refit without the 1B 4096 records learns the FP8 recompute transient from one 3B run at the
        # allocator's capacity, and put 1B FP8 full AC 5.1% under its measured memory (docs/calibration/h100).
        *_families(["1b", "3b"], [8192, 2048], 1, PRECS, ["full"]),
    ],
    "cpu-smoke": [
        Family("tiny", 128, 1, "bf16", "none", "none", compile=False),
        Family("tiny", 128, 2, "bf16", "none", "full", compile=False),
        Family("tiny", 128, 1, "bf16", "none", "none", compile=False, accumulation=2),
    ],
}


def single_device(fam: Family, cal: Calibration) -> bool:
    """Whether the trainer runs the family without FSDP2: its default on one GPU since 2026-12-02 (the
    worker reports what it really ran)."""
    return fam.gpus == 1 and cal.trainer.single_device_path


def architecture(model: str) -> tuple[str, Architecture]:
    """Catalog name and architecture of a grid model."""
    if model in CUSTOM:
        return model, Architecture(**CUSTOM[model])
    return resolve_model(ModelSpec(preset=PRESETS.get(model, model)))


def build_plan(fam: Family, mbs: int, cal: Calibration, instance: str) -> tuple[Plan, CalibrationRecord]:
    """The Plan the trainer executes (the planner's evaluate() of the pinned candidate) and a record stub."""
    name, arch = architecture(fam.model)
    spec = BlackwellTrainingJobSpec.model_validate(
        {
            "model": {"architecture": arch.model_dump(by_alias=True)},
            "cluster": {"instanceType": instance, "nodes": 1, "gpusPerNode": fam.gpus},
            "training": {"sequenceLength": fam.sequence_length},
            "tuning": {"memoryHeadroom": 0.0, "compile": fam.compile},
        }
    )
    ev = evaluate(spec, fam.candidate(mbs, cal.trainer.loss_chunk_tokens), calibration=cal)
    gpu = get_gpu(get_instance(instance).gpu)
    data_parallel = fam.gpus // ev.candidate.context_parallel
    plan = Plan(
        job_name="calibration",
        model_name=name,
        architecture=arch,
        parameter_count=arch.parameter_count(),
        gpu=GpuInfo(
            name=gpu.name,
            compute_capability=gpu.compute_capability,
            memory_bytes=gpu.memory_bytes,
            peak_bf16_flops=gpu.peak_flops["bf16"],
        ),
        instance_type=instance,
        nodes=1,
        gpus_per_node=fam.gpus,
        sequence_length=fam.sequence_length,
        global_batch_tokens=mbs * fam.sequence_length * data_parallel * fam.accumulation,
        steps=1000,
        chosen=ev.candidate,
        predicted=ev.prediction,
        calibration=f"{cal.name} ({cal.status})",
        optimizer=OptimizerConfig(warmup_steps=10),
    )
    stub = CalibrationRecord(
        source="harness",
        trainer="btj-trainer",
        model_name=name,
        architecture=arch,
        instance_type=instance,
        gpus_per_node=fam.gpus,
        sequence_length=fam.sequence_length,
        candidate=ev.candidate,
        status=RecordStatus.ERROR,
        predicted=ev.prediction,
        predicted_calibration=cal.name,
        single_device_path=single_device(fam, cal),
        command=" ".join(sys.argv),
    )
    return plan, stub
