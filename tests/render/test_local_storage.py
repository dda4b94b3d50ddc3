"""The trainer pod declares the node-local disk it writes (issue 24), sized from the plan.

Every rendered pod, of every backend and every example and golden case, carries an ephemeral-storage request
equal to its limit and a bounded /local, both from the plan's estimate, and the S3 cache's cap in its
environment; what the plan expects on /local fits the sizeLimit, and /local with the container's own files
fits the limit. Bad values are refused naming spec.cluster.localStorageGiB and the fix.
"""

from __future__ import annotations

from typing import Any

import pytest

from blackwell_operator.discovery.capacity import count_capacity, parse_quantity
from blackwell_operator.errors import PlanningError
from blackwell_operator.models import BlackwellTrainingJobSpec
from blackwell_operator.models.spec import Backend
from blackwell_operator.nodelabels import INSTANCE_TYPE_LABEL, NODE_HEALTH_LABEL, SCHEDULABLE
from blackwell_operator.planner.local_disk import (
    CHECKPOINT_BYTES_PER_PARAMETER,
    CONTAINER_BYTES,
    DEFAULT_SHARD_CACHE_BYTES,
    LOCAL_STORAGE_FIELD,
    MIN_SHARD_CACHE_BYTES,
)
from blackwell_operator.render.pod import EPHEMERAL_STORAGE, resources
from blackwell_operator.units import GIB
from blackwell_trainer.plan.config import (
    CACHE_MAX_BYTES_ENV,
    NODE_DISK_KEEP_FREE_FRACTION,
    LocalStorage,
    Plan,
)
from tests.render.test_pod_security import BACKENDS, example_specs, rendered_pods
from tests.support.golden_plans import CASES as GOLDEN_CASES
from tests.support.plans import plan_for
from tests.support.specs import make_spec

P6 = "ml.p6-b200.48xlarge"


def spec_of(**fields: Any) -> BlackwellTrainingJobSpec:
    """An 8B job on one P6-B200 node with `fields` merged into its spec (camelCase)."""
    spec: dict[str, Any] = {"model": {"preset": "llama3.1-8b"}, "cluster": {"instanceType": P6, "nodes": 1}}
    for key, value in fields.items():
        spec[key] = {**spec.get(key, {}), **value} if isinstance(value, dict) else value
    return BlackwellTrainingJobSpec.model_validate(spec)


# S3 weights and shards, single-node checkpoints on /local, an export to S3: every part of the estimate.
EVERYTHING = {
    "model": {"preset": "llama3.1-8b", "weights": {"uri": "s3://models/llama-3.1-8b"}},
    "training": {
        "dataset": {"kind": "shards", "uri": "s3://tokens/corpus"},
        "checkpoint": {"path": "/local/checkpoints", "keepLatest": 2},
        "output": {"uri": "s3://models/trained"},
    },
}


def check_pod(pod: dict[str, Any], storage: LocalStorage) -> None:
    """The pod declares what the plan says, and the plan's parts fit the declaration."""
    (container,) = pod["spec"]["containers"]
    requests, limits = container["resources"]["requests"], container["resources"]["limits"]
    assert requests[EPHEMERAL_STORAGE] == limits[EPHEMERAL_STORAGE]
    limit = int(parse_quantity(limits[EPHEMERAL_STORAGE]))
    local = next(v for v in pod["spec"]["volumes"] if v["name"] == "local")
    size_limit = int(parse_quantity(local["emptyDir"]["sizeLimit"]))
    assert (limit, size_limit) == (storage.limit_bytes, storage.volume_bytes)
    on_local = (
        storage.weights_cache_bytes
        + storage.shard_cache_bytes
        + storage.checkpoint_bytes
        + storage.export_staging_bytes
        + storage.scratch_bytes
    )
    assert on_local <= size_limit and size_limit + storage.container_bytes <= limit
    assert storage.cache_max_bytes == storage.weights_cache_bytes + storage.shard_cache_bytes
    env = {item["name"]: item["value"] for item in container["env"]}
    assert env[CACHE_MAX_BYTES_ENV] == str(storage.cache_max_bytes)


def _planned(spec: BlackwellTrainingJobSpec) -> LocalStorage:
    storage = plan_for(spec).local_storage
    assert storage is not None
    return storage


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.value)
def test_every_example_pod_declares_its_plans_node_local_disk(backend: Backend) -> None:
    for name, spec in example_specs().values():
        for pod in rendered_pods(name, spec, backend):
            check_pod(pod, _planned(spec))


def test_every_golden_case_declares_its_plans_node_local_disk() -> None:
    checked = 0
    for case in GOLDEN_CASES:
        spec = make_spec(*case)
        try:
            (pod, *_) = rendered_pods("golden", spec, Backend.PYTORCH_JOB)
        except PlanningError:
            continue  # the golden record of this case is a planning error: nothing is rendered
        check_pod(pod, _planned(spec))
        checked += 1
    assert checked >= len(GOLDEN_CASES) // 2


def test_the_estimate_holds_every_part_the_job_writes_on_its_node() -> None:
    spec = spec_of(**EVERYTHING)
    plan = plan_for(spec)
    storage = plan.local_storage
    assert storage is not None and plan.weights is not None and plan.weights.load is not None
    assert storage.weights_cache_bytes == plan.weights.load.node_disk_bytes > 0  # the whole checkpoint
    assert storage.shard_cache_bytes == DEFAULT_SHARD_CACHE_BYTES
    # keepLatest, the newest known good one and the one being written: fp32 weights and Adam moments.
    assert storage.checkpoint_bytes == 4 * CHECKPOINT_BYTES_PER_PARAMETER * plan.parameter_count
    assert storage.export_staging_bytes >= 2 * GIB  # one export file (2 GiB) or the largest tensor
    assert storage.container_bytes == CONTAINER_BYTES and not storage.from_spec
    assert storage.limit_bytes % GIB == 0
    (pod, *_) = rendered_pods("job", spec, Backend.PYTORCH_JOB)
    check_pod(pod, storage)


def test_nothing_on_the_node_but_scratch_declares_little() -> None:
    # Checkpoints on a volume, synthetic data, no weights: the NCCL dumps and the container's own files.
    spec = spec_of(
        volumes=[{"name": "fsx", "claimName": "fsx-claim", "mountPath": "/fsx"}],
        training={"checkpoint": {"path": "/fsx/checkpoints"}},
    )
    storage = _planned(spec)
    assert storage.cache_max_bytes == 0
    assert storage.limit_bytes == 21 * GIB


def test_the_spec_sets_the_limit_and_the_shard_cache_gets_the_rest() -> None:
    spec = spec_of(**EVERYTHING, cluster={"localStorageGiB": 2000})
    storage = _planned(spec)
    assert storage.from_spec and storage.limit_bytes == 2000 * GIB
    rest = (
        storage.weights_cache_bytes
        + storage.checkpoint_bytes
        + storage.export_staging_bytes
        + storage.scratch_bytes
        + storage.container_bytes
    )
    assert storage.shard_cache_bytes == 2000 * GIB - rest > DEFAULT_SHARD_CACHE_BYTES
    (pod, *_) = rendered_pods("job", spec, Backend.TRAIN_JOB)
    check_pod(pod, storage)


def test_too_little_local_storage_names_the_field_and_the_least_that_works() -> None:
    with pytest.raises(PlanningError) as refused:
        plan_for(spec_of(**EVERYTHING, cluster={"localStorageGiB": 100}))
    error = refused.value
    assert error.field == LOCAL_STORAGE_FIELD
    assert "100 GiB is less than this job writes" in error.problem
    assert "checkpoints under /local" in error.problem
    assert f"at least {MIN_SHARD_CACHE_BYTES // GIB} GiB for the S3 shard cache" in error.problem
    least = error.remedies[0][LOCAL_STORAGE_FIELD]
    assert f"set {LOCAL_STORAGE_FIELD} to at least {least}" in error.fix
    storage = _planned(spec_of(**EVERYTHING, cluster={"localStorageGiB": least}))  # the remedy plans
    assert storage.shard_cache_bytes >= MIN_SHARD_CACHE_BYTES
    with pytest.raises(PlanningError, match=LOCAL_STORAGE_FIELD):
        plan_for(spec_of(**EVERYTHING, cluster={"localStorageGiB": least - 1}))


def test_more_than_the_node_can_give_is_refused_naming_what_to_change() -> None:
    with pytest.raises(PlanningError) as refused:
        plan_for(spec_of(cluster={"localStorageGiB": 100_000}))
    assert refused.value.field == LOCAL_STORAGE_FIELD
    usable = f"{100 * (1 - NODE_DISK_KEEP_FREE_FRACTION):.0f}% of its 30,720 GB of NVMe"
    assert usable in refused.value.problem
    # The estimate too: a thousand 8B checkpoints on /local name the checkpoint field.
    many = {"checkpoint": {"path": "/local/checkpoints", "keepLatest": 1000}}
    with pytest.raises(PlanningError) as refused:
        plan_for(spec_of(training=many))
    assert refused.value.field == "spec.training.checkpoint.path"
    assert "keepLatest" in refused.value.fix


def test_the_capacity_check_names_a_node_whose_disk_cannot_hold_the_pod() -> None:
    spec = spec_of(**EVERYTHING)
    plan: Plan = plan_for(spec)
    requests = resources(spec, plan)["requests"]
    labels = {INSTANCE_TYPE_LABEL: P6, NODE_HEALTH_LABEL: SCHEDULABLE}

    def node(allocatable: dict[str, Any]) -> dict[str, Any]:
        return {"metadata": {"labels": labels}, "status": {"allocatable": allocatable}}

    roomy = node({key: str(value) for key, value in requests.items()})  # exactly the pod's requests
    small = node({**roomy["status"]["allocatable"], EPHEMERAL_STORAGE: "100Gi"})
    capacity = count_capacity([roomy, small], P6, requests)
    assert capacity.fitting == 1
    assert capacity.why_not.startswith(f"{EPHEMERAL_STORAGE}: 100Gi allocatable < ")
    assert "spec.cluster.localStorageGiB" in capacity.why_not
