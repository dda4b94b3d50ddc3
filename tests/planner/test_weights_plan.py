"""Initial weights in the plan: load time per source, node memory and NVMe, refusals with the figures."""

from __future__ import annotations

from typing import Any

import pytest

from blackwell_operator.catalogs import get_instance, get_preset
from blackwell_operator.errors import PlanningError, SpecError
from blackwell_operator.models.spec import BlackwellTrainingJobSpec
from blackwell_operator.planner import CheckpointFacts, plan_job
from blackwell_operator.planner.weights import (
    S3_BYTES_PER_SECOND_PER_NODE,
    VOLUME_BYTES_PER_SECOND,
    largest_tensor_elements,
)
from blackwell_trainer.plan.config import EXPORT_FILE_BYTES, NODE_DISK_KEEP_FREE_FRACTION, Plan, WeightsSource

FSX = {"name": "fsx", "claimName": "fsx-claim", "mountPath": "/fsx"}
LLAMA_8B = get_preset("llama3.1-8b")


def spec(
    uri: str | None,
    *,
    nodes: int = 2,
    model: dict[str, Any] | None = None,
    sharding: str = "auto",
    **training: Any,
) -> Any:
    body: dict[str, Any] = {
        "model": {"preset": "llama3.1-8b", **(model or {})},
        "cluster": {"nodes": nodes},
        "training": {"sequenceLength": 4096, **training},
        "tuning": {"sharding": sharding},
        "volumes": [FSX],
    }
    if uri is not None:
        body["model"]["weights"] = {"uri": uri}
    return BlackwellTrainingJobSpec.model_validate(body)


@pytest.fixture(scope="module")
def random_init() -> Plan:
    return plan_job(spec(None))


def test_weights_change_only_the_weights_section(random_init: Plan) -> None:
    with_weights = plan_job(spec("s3://models/llama-3.1-8b"))
    assert with_weights.weights is not None and random_init.weights is None
    (note,) = [n for n in with_weights.explanation if n.startswith("initial weights")]
    assert note.startswith("initial weights s3://models/llama-3.1-8b: 16.1 GB, estimated from the parameters")
    # S3 weights are downloaded to the node, so the pod's declared local disk grows with them too.
    assert with_weights.local_storage is not None and random_init.local_storage is not None
    assert with_weights.local_storage != random_init.local_storage

    def without_weights(plan: Plan) -> Plan:
        notes = [n for n in plan.explanation if not n.startswith(("initial weights", "node-local disk"))]
        return plan.model_copy(update={"weights": None, "local_storage": None, "explanation": notes})

    assert without_weights(with_weights) == without_weights(random_init)


def test_s3_weights_download_whole_to_each_nodes_nvme() -> None:
    plan = plan_job(spec("s3://models/llama-3.1-8b"))
    assert plan.weights is not None and plan.weights.load is not None
    load = plan.weights.load
    size = 2 * LLAMA_8B.parameter_count  # not readable here: estimated as bf16
    assert plan.weights.size_bytes is None and load.checkpoint_bytes_estimated
    assert (load.source, load.checkpoint_bytes, load.node_disk_bytes) == (WeightsSource.S3, size, size)
    assert load.load_seconds == pytest.approx(size / S3_BYTES_PER_SECOND_PER_NODE, abs=0.1)
    assert load.load_seconds == pytest.approx(2.6, abs=0.05)  # 16 GB at 6.25 GB/s
    p6 = get_instance("ml.p6-b200.48xlarge")
    assert load.node_disk_limit_bytes == int((1 - NODE_DISK_KEEP_FREE_FRACTION) * p6.local_nvme_bytes)
    assert load.host_memory_limit_bytes == 1536 << 30  # the rendered pod's request on 8 GPUs
    # Hybrid sharding within each node: every node holds, so reads, the whole checkpoint once.
    assert (plan.chosen.sharding.value, plan.chosen.shard_degree) == ("hybrid", 8)
    assert load.node_read_bytes == size
    # Plus the export's buffer: one 2 GiB file, more than the largest tensor (the 1.05 GB bf16 embedding).
    assert 2 * largest_tensor_elements(LLAMA_8B.architecture) < EXPORT_FILE_BYTES
    assert load.host_memory_bytes == size + 2 * 2**30


@pytest.mark.parametrize(("dtype", "itemsize"), [("bfloat16", 2), ("float32", 4)])
def test_the_export_buffer_is_the_exporters_rule_in_the_checkpoints_dtype(dtype: str, itemsize: int) -> None:
    # A vocabulary of 262,144 at width 8,192: the embedding (2.1 G elements) is larger than one export file.
    arch = LLAMA_8B.architecture.model_copy(update={"hidden_size": 8192, "vocab_size": 262144})
    facts = CheckpointFacts(architecture=arch, size_bytes=40 * 10**9, export_dtype=dtype)
    named = {"preset": None, "architecture": arch.model_dump(mode="json", by_alias=True, exclude_none=True)}
    plan = plan_job(spec("/fsx/models/wide", model=named, sharding="full"), checkpoint=facts)
    assert plan.weights is not None and plan.weights.load is not None
    load = plan.weights.load
    embedding = itemsize * 262144 * 8192
    assert largest_tensor_elements(arch) == 262144 * 8192 and embedding > EXPORT_FILE_BYTES
    assert load.host_memory_bytes == load.node_read_bytes + embedding


def test_full_sharding_over_nodes_splits_what_each_node_reads() -> None:
    plan = plan_job(spec("s3://models/llama-3.1-8b", sharding="full"))
    assert plan.weights is not None and plan.weights.load is not None
    assert plan.chosen.shard_degree == 16
    assert plan.weights.load.node_read_bytes == LLAMA_8B.parameter_count  # half of 2 bytes each
    assert plan.weights.load.node_disk_bytes == 2 * LLAMA_8B.parameter_count  # the S3 cache holds all files


def test_a_volume_is_shared_by_every_node() -> None:
    plan = plan_job(spec("/fsx/models/llama-3.1-8b"), checkpoint=CheckpointFacts(size_bytes=16_060_522_496))
    assert plan.weights is not None and plan.weights.load is not None
    load = plan.weights.load
    assert plan.weights.size_bytes == 16_060_522_496 and not load.checkpoint_bytes_estimated
    assert load.source is WeightsSource.VOLUME and load.node_disk_bytes == 0
    # Two nodes (hybrid sharding: each reads it whole) through one file system of 300 MB/s.
    assert load.node_read_bytes == 16_060_522_496
    assert load.load_seconds == pytest.approx(2 * 16_060_522_496 / VOLUME_BYTES_PER_SECOND, abs=0.1)


def test_weights_in_the_pods_own_scratch_are_refused() -> None:
    # /local is an emptyDir of the pod (docs/security.md): nothing can be staged there before the job.
    with pytest.raises(SpecError) as caught:
        plan_job(spec("/local/models/llama-3.1-8b", nodes=1))
    assert caught.value.field == "spec.model.weights.uri"
    assert "starts empty" in caught.value.message


def test_output_is_rendered_into_the_plan() -> None:
    plan = plan_job(spec(None, output={"uri": "s3://exports/job-1"}))
    assert plan.output is not None and plan.output.uri == "s3://exports/job-1"
    assert plan_job(spec(None)).output is None


def test_a_checkpoint_too_large_for_the_nodes_nvme_is_refused_with_the_figures() -> None:
    with pytest.raises(PlanningError) as caught:
        plan_job(spec("s3://models/huge"), checkpoint=CheckpointFacts(size_bytes=30 * 10**12))
    assert caught.value.field == "spec.model.weights.uri"
    assert "30,000.0 GB do not fit the S3 cache on one ml.p6-b200.48xlarge node's NVMe (24,576.0 GB" in (
        caught.value.message
    )
    assert "Fix: put the checkpoint on a shared volume" in caught.value.message


def test_a_checkpoint_too_large_for_host_memory_is_refused_with_the_figures() -> None:
    with pytest.raises(PlanningError) as caught:
        plan_job(spec("/fsx/models/huge", nodes=1), checkpoint=CheckpointFacts(size_bytes=2 * 10**12))
    message = caught.value.message
    assert caught.value.field == "spec.model.weights.uri"
    assert "needs 2,002.1 GB of host memory per node" in message and "the trainer pod's 1,649.3 GB" in message
    assert "Fix: shard the model over more GPUs" in message


def test_a_spec_naming_no_model_is_refused_even_where_the_checkpoint_was_read() -> None:
    # Issue 39: the operator reads no checkpoint, so nothing read here may make such a spec plan.
    arch = LLAMA_8B.architecture.model_copy(update={"num_layers": 4})
    weights_only = spec("/fsx/models/small", model={"preset": None})
    with pytest.raises(SpecError) as caught:
        plan_job(weights_only, checkpoint=CheckpointFacts(architecture=arch))
    assert caught.value.field == "spec.model"
    assert "Fix: set spec.model.architecture: {" in caught.value.message
    assert '"numLayers": 4' in caught.value.message
    with pytest.raises(SpecError) as caught:
        plan_job(weights_only, checkpoint=CheckpointFacts(architecture=LLAMA_8B.architecture))
    fix = "Fix: set spec.model.preset: llama3.1-8b (what /fsx/models/small/config.json"
    assert fix in caught.value.message


def test_weights_only_without_a_readable_folder_names_the_fix() -> None:
    # What the operator sees: it reads no checkpoint.
    with pytest.raises(SpecError) as caught:
        plan_job(spec("/fsx/models/small", model={"preset": None}))
    assert caught.value.field == "spec.model"
    assert "weights.uri /fsx/models/small alone: the operator reads no checkpoint" in caught.value.message
    assert "Fix: set spec.model.preset or spec.model.architecture" in caught.value.message


def test_a_named_model_that_is_not_the_checkpoints_is_refused() -> None:
    other = LLAMA_8B.architecture.model_copy(update={"vocab_size": 32000})
    with pytest.raises(SpecError) as caught:
        plan_job(spec("/fsx/models/other"), checkpoint=CheckpointFacts(architecture=other))
    assert caught.value.field == "spec.model.weights.uri"
    expected = "config.json vocab_size gives vocab_size=32000, the plan's architecture.vocabSize 128256"
    assert expected in caught.value.message
