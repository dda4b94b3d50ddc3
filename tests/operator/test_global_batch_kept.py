"""The global batch stored with the job (status.globalBatch) under the real operator (KopfRunner, KMock):
the same tokens per step after an operator restart, an out-of-memory re-plan, an edit of another field, a
cluster-calibration change, a probe result and a resize; an edit of the node count that the stored batch
no longer divides is refused, never re-rounded; only an edit of globalBatchTokens changes it, and
status.planHistory records that (docs/global-batch.md).

To show that each plan keeps the stored value rather than choosing it again, the planner's rule is made to
choose another value after the first plan (as a later operator's rule might): the job keeps its own.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from blackwell_operator.calibration.cluster import MIN_RUNS, Sample
from blackwell_operator.handlers import cluster_calibration as store
from blackwell_operator.handlers.api import KubeApi, load_api_client
from blackwell_operator.planner import global_batch as rule
from blackwell_operator.testing.kubeconfig import write_kubeconfig
from blackwell_trainer.plan.config import ActivationCheckpointing, Plan, PrecisionRecipe
from tests.operator.harness import NAMESPACE, Cluster, btj, running_operator, wait_for
from tests.operator.test_elastic import elastic_btj, four_nodes, replicas, set_health, started
from tests.operator.test_probe_result import HOME, probed_events, probed_job
from tests.operator.test_replan import _new_child, _oom_pod, _replanned_status
from tests.support.pods import T1

pytestmark = pytest.mark.integration
__all__ = ["four_nodes"]  # the fixture, imported for the resize test

RULE = 2**21  # the rule's choice for Llama 3.1 8B and Mistral 7B (the probed job's) at 8192: 256 sequences
# What the rule would choose for it once changed: a later operator's rule, say.
OTHER_RULE = ((1.5e9, 2**18), (5e9, 2**19), (20e9, 2**20))


def _tokens(cluster: Cluster, name: str) -> int:
    return int(cluster.status(name)["plan"]["globalBatchTokens"])


def _reached(cluster: Cluster, name: str) -> int:
    """The tokens per step the plan's own configuration trains."""
    plan = Plan.model_validate(cluster.status(name)["plan"])
    c = plan.chosen
    ranks = plan.nodes * plan.gpus_per_node // c.context_parallel
    return c.micro_batch_size * c.gradient_accumulation_steps * ranks * plan.sequence_length


def _edits(cluster: Cluster, name: str) -> list[dict[str, Any]]:
    return [e for e in cluster.status(name).get("planHistory") or [] if e.get("reason") == "SpecEdit"]


async def _first_plan(cluster: Cluster, name: str, **spec: Any) -> dict[str, Any]:
    await cluster.apply(btj(name, **spec))
    await wait_for(lambda: cluster.job(name), what=f"{name}'s PyTorchJob")
    batch: dict[str, Any] = await wait_for(
        lambda: cluster.status(name).get("globalBatch"), what="status.globalBatch"
    )
    return batch


async def test_a_restart_an_oom_re_plan_and_other_edits_keep_it_and_only_its_edit_changes_it(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with running_operator(cluster):
        stored = await _first_plan(cluster, "w")
    assert (stored["tokens"], stored["source"], stored["rule"], stored["generation"]) == (
        RULE,
        "Rule",
        rule.RULE_VERSION,
        1,
    )
    monkeypatch.setattr(rule, "BUCKETS", OTHER_RULE)
    async with running_operator(cluster):
        # An operator restart (with a rule that would now choose 1 Mi tokens): the job keeps its batch.
        await cluster.settle("w")
        assert _tokens(cluster, "w") == _reached(cluster, "w") == RULE
        assert cluster.status("w")["globalBatch"] == stored
        # An out-of-memory run: the micro-batch moves, the tokens per step do not.
        before = cluster.status("w")["plan"]["chosen"]
        child = cluster.job("w")
        assert child is not None
        await _oom_pod(cluster, "PyTorchJob", "w", "w-worker-0", T1)
        await _replanned_status(cluster, 1)
        await _new_child(cluster, "PyTorchJob", child["metadata"]["uid"])
        assert cluster.status("w")["plan"]["chosen"] != before
        assert _tokens(cluster, "w") == _reached(cluster, "w") == RULE
        # An edit of another field: the same batch, nothing in planHistory.
        await cluster.patch_spec("w", {"training": {"steps": 1200}})
        await wait_for(lambda: cluster.status("w").get("observedGeneration") == 2, what="the edit")
        await cluster.settle("w")
        assert _tokens(cluster, "w") == RULE and cluster.status("w")["globalBatch"] == stored
        assert not _edits(cluster, "w")
        # The user's edit of globalBatchTokens: the new value, recorded once in planHistory.
        await cluster.patch_spec("w", {"training": {"globalBatchTokens": 2 * RULE}})
        await wait_for(
            lambda: cluster.status("w").get("globalBatch", {}).get("tokens") == 2 * RULE, what="the pin"
        )
        await cluster.settle("w")
    status = cluster.status("w")
    assert status["globalBatch"]["source"] == "Pinned" and status["globalBatch"]["generation"] == 3
    assert _tokens(cluster, "w") == _reached(cluster, "w") == 2 * RULE
    (edit,) = _edits(cluster, "w")
    assert (edit["globalBatchBefore"], edit["globalBatchAfter"], edit["generation"]) == (RULE, 2 * RULE, 3)
    assert f"spec.training.globalBatchTokens set to {2 * RULE}" in edit["message"]


async def test_a_node_count_the_batch_does_not_divide_is_refused_never_re_rounded(cluster: Cluster) -> None:
    async with running_operator(cluster):
        stored = await _first_plan(cluster, "n")
        # 3 nodes of 8 GPUs: 24 ranks do not divide 256 sequences (on main: silently 264).
        await cluster.patch_spec("n", {"cluster": {"nodes": 3}})
        await wait_for(lambda: cluster.status("n").get("observedGeneration") == 2, what="the edit")
        await cluster.settle("n")
        status = cluster.status("n")
        assert status["globalBatch"] == stored
        assert (status.get("plan") or {}).get("globalBatchTokens", RULE) == RULE
        said = " ".join(c.get("message", "") for c in status["conditions"] if c["status"] == "False")
        assert "spec.training.globalBatchTokens: 1966080 or 2162688" in said, said
        # The user picks one: that is the edit that changes it.
        await cluster.patch_spec("n", {"training": {"globalBatchTokens": 2162688}})
        await wait_for(lambda: cluster.status("n").get("globalBatch", {}).get("tokens") == 2162688)
        await cluster.settle("n")
    assert _tokens(cluster, "n") == _reached(cluster, "n") == 2162688
    (edit,) = _edits(cluster, "n")
    assert (edit["globalBatchBefore"], edit["globalBatchAfter"]) == (RULE, 2162688)


def _slow(uid: str) -> Sample:
    """One run of the job's family measured at half the modelled speed on this cluster."""
    return Sample(
        job=f"{NAMESPACE}/{uid}",
        uid=uid,
        instance_type="ml.p6-b200.48xlarge",
        precision_recipe=PrecisionRecipe.NONE,
        activation_checkpointing=ActivationCheckpointing.SELECTIVE,
        tokens_ratio=0.5,
        memory_ratio=1.05,
        observed_at="2026-12-01T10:00:00Z",
    )


async def test_a_cluster_calibration_change_keeps_it(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(store.NAMESPACE_ENV, HOME)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KUBECONFIG", str(write_kubeconfig(tmp_path / "kubeconfig", cluster.url)))
        api = KubeApi(load_api_client())
    family = {"precision": "bf16", "activationCheckpointing": "selective"}
    async with running_operator(cluster):
        stored = await _first_plan(cluster, "c", tuning=family)
        assert cluster.status("c")["plan"].get("clusterCorrection") is None
        monkeypatch.setattr(rule, "BUCKETS", OTHER_RULE)
        for i in range(MIN_RUNS):  # the cluster measures this family slower: the next plan is corrected
            await asyncio.to_thread(store.record, api, HOME, _slow(f"run-{i}"))
        await cluster.patch_spec("c", {"training": {"steps": 1500}})
        await wait_for(lambda: cluster.status("c")["plan"].get("clusterCorrection"), what="a corrected plan")
        await cluster.settle("c")
    assert _tokens(cluster, "c") == _reached(cluster, "c") == RULE
    assert cluster.status("c")["globalBatch"] == stored and not _edits(cluster, "c")


async def test_a_probe_result_keeps_it(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(store.NAMESPACE_ENV, HOME)
    async with running_operator(cluster):
        plan, result, _ = await probed_job(cluster, "p")
        stored = await wait_for(lambda: cluster.status("p").get("globalBatch"), what="status.globalBatch")
        monkeypatch.setattr(rule, "BUCKETS", OTHER_RULE)
        await wait_for(lambda: probed_events(cluster, "p"), what="the Probed Event")
        await wait_for(lambda: cluster.status("p").get("probe"), what="status.probe")
        await cluster.settle("p")
    status = cluster.status("p")
    assert status["probe"]["winner"] == result.winner
    # The winner the job trains with reaches the same tokens per step as the plan it was probed from.
    assert plan.probe is not None
    won = plan.probe.options[result.winner].candidate
    ranks = plan.nodes * plan.gpus_per_node // won.context_parallel
    assert won.micro_batch_size * won.gradient_accumulation_steps * ranks * plan.sequence_length == RULE
    assert _tokens(cluster, "p") == plan.global_batch_tokens == RULE
    assert status["globalBatch"] == stored and not _edits(cluster, "p")


async def test_a_resize_keeps_it(four_nodes: Cluster) -> None:
    cluster = four_nodes
    async with running_operator(cluster):
        await cluster.apply(elastic_btj("e"))
        first = await started(cluster, "e", 4)
        stored = first["globalBatch"]
        assert stored["source"] == "Pinned"
        await set_health(cluster, 3, "Unschedulable")
        await wait_for(lambda: replicas(cluster, "e") == 3, timeout=40.0, what="the child on 3 nodes")
        await wait_for(lambda: cluster.status("e")["plan"]["nodes"] == 3, what="the 3-node plan")
        await cluster.settle("e")
    assert _tokens(cluster, "e") == _reached(cluster, "e") == stored["tokens"]
    assert cluster.status("e")["globalBatch"] == stored and not _edits(cluster, "e")
