"""Plans for render tests, from the real planner (pure and fast, so no hand-built fixtures)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from blackwell_operator.models import BlackwellTrainingJobSpec
from blackwell_operator.planner import plan_job
from blackwell_trainer.plan.config import Plan


def plan_for(spec: BlackwellTrainingJobSpec, job_name: str = "btj") -> Plan:
    """The plan the operator would write to status for this spec."""
    return plan_job(spec, job_name=job_name)


TINY_ARCHITECTURE: dict[str, Any] = {
    "hiddenSize": 64,
    "numLayers": 2,
    "numAttentionHeads": 4,
    "numKeyValueHeads": 2,
    "intermediateSize": 128,
    "vocabSize": 256,
}


def tiny_plan_dict(**chosen: Any) -> dict[str, Any]:
    """A complete plan (wire form, camelCase) for the tiny model on 2 CPU processes.

    Keyword arguments override fields of `chosen` (e.g. activationCheckpointing="full").
    """
    candidate: dict[str, Any] = {
        "precision": "bf16",
        "precisionRecipe": "none",
        "activationCheckpointing": "none",
        "microBatchSize": 4,
        "gradientAccumulationSteps": 1,
        "sharding": "full",
        "shardDegree": 2,
        "replicateDegree": 1,
        "contextParallel": 1,
        "compile": False,
        "lossChunkTokens": 64,
    }
    candidate.update(chosen)
    memory = {
        "parameters": 1000,
        "gradients": 1000,
        "optimizerStates": 2000,
        "activations": 3000,
        "loss": 100,
        "fsdpTransient": 100,
        "precisionOverhead": 0,
        "workspace": 100,
        "fragmentation": 100,
        "peakPhase": "backward",
        "peakAllocated": 7_000_000,
        "peakReserved": 8_000_000,
    }
    return {
        "apiVersion": "training.blackwell.dev/v1alpha1",
        "jobName": "tiny",
        "modelName": "custom",
        "architecture": dict(TINY_ARCHITECTURE),
        "parameterCount": 1,
        "gpu": {"name": "CPU", "computeCapability": "0.0", "memoryBytes": 0, "peakBf16Flops": 1e12},
        "instanceType": "local",
        "nodes": 1,
        "gpusPerNode": 2,
        "sequenceLength": 32,
        "globalBatchTokens": 2 * 4 * 32,
        "steps": 20,
        "chosen": candidate,
        "predicted": {
            "tokensPerSecondPerGpu": 1234.5,
            "stepTimeSeconds": 0.1,
            "modelFlopsUtilization": 0.42,
            "memory": memory,
        },
        "dataset": {"kind": "synthetic", "seed": 7},
        "checkpoint": {"path": None, "intervalSteps": 5, "keepLatest": 2},
        "optimizer": {
            "learningRate": 3e-3,
            "warmupSteps": 2,
            "weightDecay": 0.0,
            "minLearningRateRatio": 1.0,
        },
        "metricsPort": 9400,
        "logEverySteps": 1,
    }


def tiny_plan(**chosen: Any) -> Plan:
    """The tiny plan as the pydantic model (parameterCount made exact)."""
    plan = Plan.model_validate(tiny_plan_dict(**chosen))
    plan.parameter_count = plan.architecture.parameter_count()
    return plan


def probed_plan() -> Plan:
    """A plan whose trainer probes before training (`probe: auto` on a long BF16 job of 8B on two B200
    nodes, whose candidates are modelled): the planner's pick and its AC-none neighbour, at least."""
    from tests.support.specs import make_spec

    raw = make_spec(nodes=2, seq=4096, precision="bf16").model_dump(by_alias=True, mode="json")
    raw["training"]["steps"] = 20_000
    plan = plan_job(BlackwellTrainingJobSpec.model_validate(raw))
    assert plan.probe is not None and plan.probe.enabled and len(plan.probe.options) > 1, plan.probe
    return plan


def one_gpu_plan_file(folder: Path) -> Path:
    """The tiny plan for one process (one GPU, nothing sharded), written as `folder`/plan.json, as the
    trainer's `--plan` reads it."""
    plan = tiny_plan_dict(shardDegree=1)
    plan.update(gpusPerNode=1, parameterCount=tiny_plan().architecture.parameter_count())
    path = folder / "plan.json"
    path.write_text(json.dumps(plan))
    return path
