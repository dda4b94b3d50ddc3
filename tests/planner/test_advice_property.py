"""Property (issue 26): a refusal's advice, applied to the spec as written, gives a plan; node-count advice
is the fewest nodes that plan, given every knob auto may change (context parallelism included).

Generated over models x sequence lengths x instance types x node counts x pins. A refusal carries its
remedies as data (SpecError.remedies) and its Fix names each value; each is applied literally and
planned; a node count is checked minimal by planning one node fewer, which must be refused.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from blackwell_operator.catalogs import list_instances, list_presets
from blackwell_operator.errors import PlanningError
from blackwell_operator.models.spec import BlackwellTrainingJobSpec
from blackwell_operator.planner import plan_job
from tests.support.specs import with_remedy

NODES = "spec.cluster.nodes"
SEQUENCES = (1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)


@st.composite
def specs(draw: st.DrawFn) -> dict[str, Any]:
    seq = draw(st.sampled_from(SEQUENCES))
    cluster: dict[str, Any] = {
        "instanceType": draw(st.sampled_from([i.instance_type for i in list_instances()])),
        "nodes": draw(st.sampled_from([1, 1, 2, 3, 4, 6, 8, 16, 32])),
    }
    if draw(st.booleans()) and draw(st.booleans()):
        cluster["gpusPerNode"] = draw(st.integers(1, 8))
    training: dict[str, Any] = {"sequenceLength": seq}
    if draw(st.booleans()) and draw(st.booleans()):
        training["globalBatchTokens"] = seq * draw(st.sampled_from([8, 16, 64, 96, 256, 1000]))
    tuning: dict[str, Any] = {
        "precision": draw(st.sampled_from(["auto", "auto", "bf16", "fp8"])),
        "activationCheckpointing": draw(st.sampled_from(["auto", "auto", "none", "full"])),
        "microBatchSize": draw(st.sampled_from(["auto", "auto", "auto", 1, 2, 8, 64])),
        "sharding": draw(st.sampled_from(["auto", "auto", "full", "hybrid"])),
        "contextParallel": draw(st.sampled_from(["auto", "auto", "auto", 1, 2, 8])),
    }
    if draw(st.booleans()) and draw(st.booleans()):
        tuning["memoryHeadroom"] = draw(st.sampled_from([0.0, 0.2, 0.4]))
    return {
        "model": {"preset": draw(st.sampled_from([p.name for p in list_presets()]))},
        "cluster": cluster,
        "training": training,
        "tuning": tuning,
    }


def _plan(spec: dict[str, Any]) -> None:
    plan_job(BlackwellTrainingJobSpec.model_validate(spec))


def _current(spec: dict[str, Any], path: str) -> Any:
    node: Any = spec
    for key in path.removeprefix("spec.").split("."):
        node = (
            node.get(key, "auto" if key in spec.get("tuning", {}) else None)
            if isinstance(node, dict)
            else None
        )
    return node


def check_advice(spec: dict[str, Any]) -> PlanningError | None:
    """Plan `spec`; for a refusal with remedies, hold each to the property. The refusal, if any."""
    try:
        _plan(spec)
    except PlanningError as error:
        refusal = error
    else:
        return None
    if not refusal.remedies:  # only where no change of the spec within the catalog fits
        assert "use a smaller model" in refusal.fix, refusal.message
    for remedy in refusal.remedies:
        for path, value in remedy.items():
            assert ("unset" if value is None else str(value)) in refusal.fix, (path, value, refusal.fix)
            assert _current(spec, path) != value, f"advises {path}: {value}, which it already is"
        _plan(with_remedy(spec, remedy))  # raises, and fails the test, where the advice does not plan
        nodes = remedy.get(NODES)
        if nodes is not None and nodes > 1:
            with pytest.raises(PlanningError):
                _plan(with_remedy(spec, {**remedy, NODES: nodes - 1}))
    return refusal


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs())
# Found by CI's draw (2026-12-06): a pin whose "auto" still plans nothing says what does (a smaller model).
@example(
    {
        "model": {"preset": "llama3.1-70b"},
        "cluster": {"instanceType": "ml.p5.48xlarge", "nodes": 1, "gpusPerNode": 1},
        "training": {"sequenceLength": 8192, "globalBatchTokens": 65536},
        "tuning": {
            "precision": "auto",
            "activationCheckpointing": "auto",
            "microBatchSize": "auto",
            "sharding": "auto",
            "contextParallel": 2,
        },
    }
)
def test_every_remedy_plans_and_node_counts_are_minimal(spec: dict[str, Any]) -> None:
    check_advice(spec)


@st.composite
def hard_specs(draw: st.DrawFn) -> dict[str, Any]:
    """Large models, long sequences and few nodes: mostly refusals, whose advice is the point."""
    spec = draw(specs())
    spec["model"] = {"preset": draw(st.sampled_from(["llama3.1-70b", "qwen2.5-72b", "qwen2.5-32b"]))}
    spec["training"]["sequenceLength"] = draw(st.sampled_from([8192, 32768, 131072]))
    spec["training"].pop("globalBatchTokens", None)
    spec["cluster"]["nodes"] = draw(st.integers(1, 4))
    return spec


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(hard_specs())
def test_the_advice_holds_where_the_models_are_too_big_for_the_nodes(spec: dict[str, Any]) -> None:
    check_advice(spec)


@pytest.mark.parametrize("nodes", [1, 2, 3, 4, 8, 64, 258])
def test_llama70b_at_32k_on_h100_names_the_nodes_that_fit_with_context_parallel(nodes: int) -> None:
    # Issue 26: everything auto, this said "use at least 259 nodes" on 1 to 258 nodes, while 4 nodes with
    # contextParallel 4 fit. Now auto splits the sequence where nothing else fits, and the advice on fewer
    # nodes is the fewest on which it does.
    spec = {
        "model": {"preset": "llama3.1-70b"},
        "cluster": {"instanceType": "ml.p5.48xlarge", "nodes": nodes},
        "training": {"sequenceLength": 32768},
    }
    refusal = check_advice(spec)
    if refusal is not None:
        assert refusal.remedies and refusal.remedies[0][NODES] <= 4, refusal.message


def test_a_model_that_fits_nowhere_blames_no_auto_knob() -> None:
    # Issue 26: with everything auto this blamed contextParallel ("Fix: use auto or at most 4").
    arch = {
        "hiddenSize": 32768,
        "numLayers": 200,
        "numAttentionHeads": 128,
        "numKeyValueHeads": 8,
        "intermediateSize": 131072,
        "vocabSize": 128256,
    }
    for seq in (2048, 4096, 8192):
        spec = {
            "model": {"architecture": arch},
            "cluster": {"instanceType": "ml.p5.48xlarge", "nodes": 1},
            "training": {"sequenceLength": seq},
        }
        refusal = check_advice(spec)
        assert refusal is not None
        assert refusal.field != "spec.tuning.contextParallel", refusal.message
        assert "use auto" not in refusal.fix and "use a smaller model" in refusal.fix, refusal.message


def test_a_refusal_searches_node_counts_without_planning_each() -> None:
    # A model that fits on no node count up to 1024 is the worst case of the node search: every CP
    # degree is probed at its bound (one probe each) and shorter sequences and larger GPUs planned once
    # each. Planning every count would take seconds; measured 16 ms of CPU (2-core machine).
    arch = {
        "hiddenSize": 32768,
        "numLayers": 200,
        "numAttentionHeads": 128,
        "numKeyValueHeads": 8,
        "intermediateSize": 131072,
        "vocabSize": 128256,
    }
    spec = {
        "model": {"architecture": arch},
        "cluster": {"instanceType": "ml.p5.48xlarge", "nodes": 1},
        "training": {"sequenceLength": 8192},
    }
    started = time.process_time()
    with pytest.raises(PlanningError):
        _plan(spec)
    assert time.process_time() - started < 1.0
