"""Every "Fix:" is followed: for each rejection the planner gives, the advised change makes the spec plan.

Each case builds a spec that triggers one rejection, reads the numbers out of the Fix text (so the test
follows the advice the user sees, whatever it says), applies them and plans again; where the refusal
carries its remedies as data (nothing fits), it applies those and checks the Fix names each.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any

import pytest

from blackwell_operator.calibration import load_calibration
from blackwell_operator.errors import PlanningError, SpecError
from blackwell_operator.models.spec import BlackwellTrainingJobSpec
from blackwell_operator.planner import plan_job
from blackwell_operator.planner.candidates import MIN_TOKENS_PER_CP_RANK
from tests.support.specs import with_remedy

B200, H100, H200 = "ml.p6-b200.48xlarge", "ml.p5.48xlarge", "ml.p5en.48xlarge"
FSX = {"name": "fsx", "claimName": "fsx-claim", "mountPath": "/fsx"}

Spec = dict[str, Any]


def spec(
    preset: str = "llama3.1-8b",
    instance: str = B200,
    nodes: int = 1,
    seq: int = 4096,
    gpus: int | None = None,
    gbt: int | None = None,
    **tuning: Any,
) -> Spec:
    cluster: dict[str, Any] = {"instanceType": instance, "nodes": nodes}
    if gpus is not None:
        cluster["gpusPerNode"] = gpus
    training: dict[str, Any] = {"sequenceLength": seq}
    if gbt is not None:
        training["globalBatchTokens"] = gbt
    return {"model": {"preset": preset}, "cluster": cluster, "training": training, "tuning": tuning}


def _set(s: Spec, path: str, value: Any) -> Spec:
    out = copy.deepcopy(s)
    node = out
    *parents, leaf = path.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value
    return out


def _number(fix: str, pattern: str) -> int:
    found = re.search(pattern, fix)
    assert found, f"the Fix no longer says {pattern!r}: {fix}"
    return int(found.group(1).replace(",", ""))


def _float(fix: str, pattern: str) -> float:
    found = re.search(pattern, fix)
    assert found, f"the Fix no longer says {pattern!r}: {fix}"
    return float(found.group(1))


def _words(fix: str, pattern: str) -> list[str]:
    found = re.search(pattern, fix)
    assert found, f"the Fix no longer says {pattern!r}: {fix}"
    return re.split(r", | or ", found.group(1))


def _cp_divides(s: Spec, fix: str) -> list[Spec]:
    assert "power of two that divides both" in fix
    world = s["cluster"].get("gpusPerNode", 8) * s["cluster"]["nodes"]
    seq = s["training"]["sequenceLength"]
    fitting = max(c for c in (1, 2, 4, 8) if world % c == 0 and seq % (2 * c) == 0)
    return [_set(s, "tuning.contextParallel", "auto"), _set(s, "tuning.contextParallel", fitting)]


# case -> (spec, calibration, the field the error names, the changes its Fix advises; None: its remedies)
Follow = Callable[[Spec, str], list[Spec]]
CASES: dict[str, tuple[Spec, str | None, str, Follow | None]] = {
    "precision-the-gpu-lacks": (
        spec(instance=H100, precision="mxfp8"),
        None,
        "spec.tuning.precision",
        lambda s, fix: [
            _set(s, "tuning.precision", p) for p in _words(fix, r"use ([a-z0-9]+(?: or [a-z0-9]+)*)(?:;|$)")
        ],
    ),
    "precision-the-trainer-lacks": (
        spec(instance=H200, precision="fp8"),
        "h200-reference",
        "spec.tuning.precision",
        lambda s, fix: [_set(s, "tuning.precision", p) for p in _words(fix, r"use one of (.+?)(?:;|$)")],
    ),
    "checkpointing-the-trainer-lacks": (
        spec(instance=H200, activationCheckpointing="selective"),
        "h200-reference",
        "spec.tuning.activationCheckpointing",
        lambda s, fix: [
            _set(s, "tuning.activationCheckpointing", m) for m in ["auto", *_words(fix, r"one of (.+)$")]
        ],
    ),
    "context-parallel-with-chat-data": (
        _set(
            spec(nodes=2, seq=8192, contextParallel=2),
            "training.dataset",
            {"kind": "chat", "uri": "/fsx/chats", "tokenDtype": "uint32"},
        ),
        None,
        "spec.tuning.contextParallel",
        lambda s, fix: [
            _set(s, "tuning.contextParallel", v) for v in (_number(fix, r"use (\d+) or auto"), "auto")
        ],
    ),
    "context-parallel-the-trainer-lacks": (
        spec(instance=H200, contextParallel=2),
        "h200-reference",
        "spec.tuning.contextParallel",
        lambda s, fix: [
            _set(s, "tuning.contextParallel", v) for v in ("auto", _number(fix, r"auto or (\d+)"))
        ],
    ),
    "context-parallel-not-dividing": (
        spec(gpus=6, contextParallel=4),
        None,
        "spec.tuning.contextParallel",
        _cp_divides,
    ),
    "context-parallel-too-few-tokens": (
        spec(nodes=8, seq=4096, contextParallel=64),
        None,
        "spec.tuning.contextParallel",
        lambda s, fix: [
            _set(s, "tuning.contextParallel", v) for v in ("auto", _number(fix, r"at most (\d+)"))
        ],
    ),
    "micro-batch-over-the-global-batch": (
        spec(nodes=2, gbt=65536, microBatchSize=4),
        None,
        "spec.tuning.microBatchSize",
        lambda s, fix: [
            _set(s, "tuning.microBatchSize", _number(fix, r"microBatchSize: (\d+)")),
            _set(s, "tuning.microBatchSize", "auto"),
            _set(s, "training.globalBatchTokens", _number(fix, r"globalBatchTokens: ([\d,]+)")),
        ],
    ),
    "micro-batch-missing-the-global-batch": (
        spec(gbt=3 * 4096 * 8, microBatchSize=2),
        None,
        "spec.tuning.microBatchSize",
        lambda s, fix: [
            _set(s, "tuning.microBatchSize", "auto"),
            _set(s, "training.globalBatchTokens", _number(fix, r"multiple of ([\d,]+)")),
            _set(s, "training.globalBatchTokens", 3 * _number(fix, r"multiple of ([\d,]+)")),
        ],
    ),
    "global-batch-under-one-sequence-per-rank": (
        spec(nodes=2, gbt=4096),
        None,
        "spec.training.globalBatchTokens",
        lambda s, fix: [
            _set(s, "training.globalBatchTokens", _number(fix, r"multiple of ([\d,]+)")),
            _set(s, "training.globalBatchTokens", None),
        ],
    ),
    "global-batch-unreachable": (
        spec(gbt=4096 * 8 * 3 + 4096 * 4),
        None,
        "spec.training.globalBatchTokens",
        lambda s, fix: [_set(s, "training.globalBatchTokens", _number(fix, r"globalBatchTokens: (\d+) or"))],
    ),
    "micro-batch-too-big-for-memory": (
        spec(preset="llama3.1-70b", nodes=2, microBatchSize=64),
        None,
        "spec.tuning.microBatchSize",
        None,
    ),
    "gpus-per-node-left-idle": (
        # One sequence a GPU of the node a step: on all its GPUs no gradients are held across micro-steps.
        spec(preset="llama3.1-70b", gpus=1, gbt=8 * 4096),
        None,
        "spec.cluster.gpusPerNode",
        lambda s, fix: [_set(s, "cluster.gpusPerNode", _number(fix, r"gpusPerNode: (\d+)"))],
    ),
    "too-few-nodes": (
        spec(preset="llama3.1-70b", instance=H100),
        None,
        "spec.cluster.nodes",
        None,
    ),
    "less-headroom-would-fit": (
        spec(preset="llama3.1-70b", memoryHeadroom=0.3),
        None,
        "spec.cluster.nodes",
        None,
    ),
    # Issue 16's Llama-3.1-70B at 128K on 8 B200 nodes, refused under auto until issue 15 (advice: pin
    # contextParallel), now plans under auto: test_auto_splits_a_sequence_nothing_else_fits below. On one
    # node it names the fewest nodes on which auto splits the sequence (issue 26).
    "context-parallel-and-more-nodes": (
        spec(preset="llama3.1-70b", nodes=1, seq=131072),
        None,
        "spec.cluster.nodes",
        None,
    ),
    "sequence-too-long-without-context-parallel": (
        spec(instance=H200, seq=131072),
        "h200-reference",
        "spec.training.sequenceLength",
        lambda s, fix: [_set(s, "training.sequenceLength", _number(fix, r"sequenceLength: (\d+)"))],
    ),
    "checkpoint-not-on-a-shared-volume": (
        {**spec(nodes=2), "training": {"checkpoint": {"path": "/tmp/ckpt"}}},
        None,
        "spec.training.checkpoint.path",
        lambda s, fix: [
            {**s, "volumes": [FSX], "training": {"checkpoint": {"path": f"{FSX['mountPath']}/ckpt"}}}
            if "mountPath: /fsx" in fix
            else s
        ],
    ),
    "checkpoint-on-a-read-only-volume": (
        {**spec(), "volumes": [{**FSX, "readOnly": True}], "training": {"checkpoint": {"path": "/fsx/c"}}},
        None,
        "spec.training.checkpoint.path",
        lambda s, fix: [{**s, "volumes": [{**FSX, "readOnly": False}]}] if "readOnly: false" in fix else [s],
    ),
    "shards-not-on-a-shared-volume": (
        {**spec(nodes=2), "training": {"dataset": {"kind": "shards", "uri": "/data/tokens"}}},
        None,
        "spec.training.dataset.uri",
        lambda s, fix: [
            {**s, "training": {"dataset": {"kind": "shards", "uri": "s3://bucket/tokens/"}}}
            if "s3:// prefix" in fix
            else s,
            {
                **s,
                "volumes": [{**FSX, "readOnly": True}],
                "training": {"dataset": {"kind": "shards", "uri": "/fsx/t"}},
            },
        ],
    ),
}


def _plan(s: Spec, calibration: str | None) -> None:
    plan_job(
        BlackwellTrainingJobSpec.model_validate(s),
        calibration=load_calibration(calibration) if calibration else None,
    )


@pytest.mark.parametrize("case", sorted(CASES))
def test_following_the_fix_makes_it_plan(case: str) -> None:
    base, calibration, field, follow = CASES[case]
    with pytest.raises(SpecError) as caught:
        _plan(base, calibration)
    error = caught.value
    assert error.field == field, error.message
    assert error.fix, f"no Fix: {error.message}"
    if follow is None:
        assert error.remedies, f"no remedies: {error.message}"
        for remedy in error.remedies:
            for path, value in remedy.items():
                assert f"{path}: {value}" in error.fix, (path, value, error.fix)
        changes = [with_remedy(base, remedy) for remedy in error.remedies]
    else:
        changes = follow(base, error.fix)
    assert changes
    for changed in changes:
        assert changed != base, "the advice changes nothing"
        _plan(changed, calibration)  # raises (and fails the test) if the advice does not work


def test_every_planning_error_site_has_a_case() -> None:
    # The rejection sites of the planner: a new one without a case here fails this count.
    import inspect

    from blackwell_operator.planner import candidates, inputs, rejections, solve, storage

    sites = sum(
        inspect.getsource(m).count("PlanningError(") + inspect.getsource(m).count("SpecError(")
        for m in (candidates, rejections, solve, storage)
    )
    # inputs.py's gpusPerNode > instance: the CRD (at most 8) refuses that spec before the planner.
    sites += inspect.getsource(inputs).count("PlanningError(") - 1
    # no_plan() raises one PlanningError for several kinds of advice, each a case of its own above.
    assert len(CASES) >= sites, (len(CASES), sites)


def test_no_message_calls_an_auto_field_pinned() -> None:
    # Llama-3.1-70B at 128K with CP 8 on B200: bf16 fits nowhere, so the planner picks a low precision
    # with precision on auto; its explanation must not call that choice pinned.
    s = _set(spec(preset="llama3.1-70b", nodes=8, seq=131072), "tuning.contextParallel", 8)
    plan = plan_job(BlackwellTrainingJobSpec.model_validate(s))
    text = " ".join(plan.explanation)
    assert "pinned" not in text, text
    pinned = plan_job(
        BlackwellTrainingJobSpec.model_validate(_set(s, "tuning.precision", plan.chosen.precision.value))
    )
    assert "pinned by spec.tuning.precision" in " ".join(pinned.explanation)


def test_min_tokens_per_rank_is_what_the_message_says() -> None:
    with pytest.raises(PlanningError, match=f"fewer than {MIN_TOKENS_PER_CP_RANK}"):
        _plan(spec(nodes=8, seq=4096, contextParallel=64), None)


def test_auto_splits_a_sequence_nothing_else_fits() -> None:
    # Issue 15: where no plan without context parallelism fits, auto chooses a (modelled) CP degree rather
    # than refuse, and the plan says CP is modelled and why auto chose it; pinning that degree plans too.
    s = spec(preset="llama3.1-70b", nodes=8, seq=131072)
    plan = plan_job(BlackwellTrainingJobSpec.model_validate(s))
    assert plan.chosen.context_parallel > 1
    cp = next(c for c in plan.provenance if c.choice == "contextParallel")
    assert cp.basis.value == "modelled"
    assert "no plan without context parallelism fits" in cp.detail
    cp_pinned = _set(s, "tuning.contextParallel", plan.chosen.context_parallel)
    pinned = plan_job(BlackwellTrainingJobSpec.model_validate(cp_pinned))
    assert pinned.chosen.context_parallel == plan.chosen.context_parallel
    assert "no plan without context parallelism fits" not in " ".join(c.detail for c in pinned.provenance)
