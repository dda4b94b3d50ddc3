"""The planner: a pure function from a BTJ spec and the catalogs to a tuned, explained Plan."""

from __future__ import annotations

from dataclasses import dataclass

from blackwell_operator.calibration import Calibration, load_calibration
from blackwell_operator.calibration.cluster import Corrector, speed_measured
from blackwell_operator.calibration.cluster import describe_correction as describe_cluster_correction
from blackwell_operator.calibration.measured import load_measured
from blackwell_operator.catalogs import get_instance, resolve_model
from blackwell_operator.errors import PlanningError
from blackwell_operator.models.spec import BlackwellTrainingJobSpec
from blackwell_operator.models.status import MemoryCorrection
from blackwell_operator.planner.candidates import Pins
from blackwell_operator.planner.correction import (
    corrected_calibration,
    describe_correction,
    micro_batch_limits,
)
from blackwell_operator.planner.elastic import plan_elastic
from blackwell_operator.planner.explain import describe, explain, loss_reason
from blackwell_operator.planner.figures import parameters_text
from blackwell_operator.planner.inputs import chosen_global_batch, hardware_for, problem_for
from blackwell_operator.planner.layout import Hardware, Layout, Setting
from blackwell_operator.planner.local_disk import describe_local_storage, plan_local_storage
from blackwell_operator.planner.memory import MemoryEstimate
from blackwell_operator.planner.probe import describe_probe, probe_plan
from blackwell_operator.planner.provenance import left_out_of_auto, plan_provenance, verdict
from blackwell_operator.planner.rejections import refusal, with_remedies
from blackwell_operator.planner.search import Problem, Scored, SearchResult
from blackwell_operator.planner.solve import Context, solve
from blackwell_operator.planner.storage import check_storage
from blackwell_operator.planner.weights import (
    CheckpointFacts,
    describe_load,
    plan_weights,
    with_checkpoint_architecture,
)
from blackwell_trainer.plan.config import (
    Alternative,
    Candidate,
    ChoiceProvenance,
    DatasetConfig,
    GpuInfo,
    NodeChoice,
    OutputConfig,
    Plan,
    Prediction,
    ProbePlan,
    WeightsConfig,
)

__all__ = ["CheckpointFacts", "Evaluation", "evaluate", "plan_job"]

ALTERNATIVES = 5


@dataclass(frozen=True)
class Evaluation:
    """The planner's prediction for one given candidate."""

    candidate: Candidate
    prediction: Prediction
    memory: MemoryEstimate
    fits: bool
    budget_bytes: int


def _candidate(s: Scored, hw: Hardware, cal: Calibration) -> Candidate:
    st = s.setting
    layout = Layout.of(st, hw)
    return Candidate(
        precision=st.precision,
        precision_recipe=st.recipe,
        activation_checkpointing=st.activation_checkpointing,
        micro_batch_size=st.micro_batch_size,
        gradient_accumulation_steps=s.gradient_accumulation_steps,
        sharding=st.sharding,
        shard_degree=layout.shard_degree,
        replicate_degree=layout.replicate_degree,
        context_parallel=st.context_parallel,
        compile=st.compile,
        loss_chunk_tokens=cal.trainer.loss_chunk_tokens,
    )


def _prediction(s: Scored) -> Prediction:
    assert s.time is not None
    return Prediction(
        tokens_per_second_per_gpu=round(s.time.tokens_per_second_per_gpu, 1),
        step_time_seconds=round(s.time.step_time_seconds, 6),
        model_flops_utilization=round(s.time.model_flops_utilization, 4),
        memory=s.memory.to_breakdown(),
        time_breakdown_seconds={k: round(v, 6) for k, v in s.time.breakdown.items()},
    )


def evaluate(
    spec: BlackwellTrainingJobSpec, candidate: Candidate, *, calibration: Calibration | None = None
) -> Evaluation:
    """Score one given candidate for a spec's model and hardware (no search)."""
    hw = hardware_for(spec)
    cal = (calibration or load_calibration()).for_gpu(hw.gpu.name)
    problem = problem_for(spec, cal, hw)
    if spec.training.global_batch_tokens is None:
        problem.global_batch_tokens = None  # the candidate's own accumulation is scored, not the rule's
    setting = Setting(
        candidate.precision,
        candidate.precision_recipe,
        candidate.activation_checkpointing,
        candidate.micro_batch_size,
        candidate.sharding,
        candidate.context_parallel,
        candidate.compile and cal.trainer.compile,
    )
    # Without a global batch, score the accumulation the candidate asks for (not one micro-batch).
    ga = None if spec.training.global_batch_tokens is not None else candidate.gradient_accumulation_steps
    scored = problem.score(setting, ga)
    return Evaluation(
        candidate=_candidate(scored, hw, cal),
        prediction=_prediction(scored),
        memory=scored.memory,
        fits=scored.fits,
        budget_bytes=int(problem.budget_bytes),
    )


def plan_job(
    spec: BlackwellTrainingJobSpec,
    *,
    job_name: str = "btj",
    calibration: Calibration | None = None,
    checkpoint: CheckpointFacts | None = None,
    correction: MemoryCorrection | None = None,
    cluster: Corrector | None = None,
    schedulable: int | None = None,
    current: NodeChoice | None = None,
    global_batch: int | None = None,
) -> Plan:
    """Resolve a spec into the fastest plan that fits, with alternatives and reasons.

    `global_batch`: the tokens per step stored with the job (status.globalBatch,
    lifecycle/global_batch.kept_tokens), trained exactly where the spec leaves globalBatchTokens unset,
    instead of choosing by the rule again; a value no fitting micro-batch reaches is refused.

    An elastic spec (spec.cluster.elastic) is planned for the largest node count of its range that the
    `schedulable` healthy nodes hold (spec.cluster.nodes when unknown) and that plans, reaching its
    global batch exactly (planner/elastic.py), or for `current`'s count (the stored plan's) while that
    plans; both are ignored otherwise.

    `correction`: what out-of-memory runs of this job taught (status.memoryCorrection): activation bytes
    scaled, a reserve added, and the configurations that ran out (and larger micro-batches of their
    families) never chosen again.

    `checkpoint`: what the caller could read of spec.model.weights (`btj plan` reads a local folder's
    config.json and file sizes; the operator reads nothing). `cluster`: corrections measured on the
    user's cluster per recipe family (calibration/cluster.py), applied to every candidate's prediction.

    Raises PlanningError (field, problem, fix) when a pinned value is impossible, nothing fits or the
    initial weights do not fit a node, and SpecError when the checkpoint, dataset or weights path is on
    storage the job's pods cannot use (storage.py), or the model is unknown or differs from the weights'.
    """
    check_storage(spec)

    def plan_at(fixed: BlackwellTrainingJobSpec) -> Plan:
        return _plan_fixed(
            fixed,
            job_name=job_name,
            calibration=calibration,
            checkpoint=checkpoint,
            correction=correction,
            cluster=cluster,
            global_batch=global_batch,
        )

    if spec.cluster.elastic is not None:
        return plan_elastic(spec, schedulable, plan_at, current)
    return plan_at(spec)


def _plan_fixed(
    spec: BlackwellTrainingJobSpec,
    *,
    job_name: str,
    calibration: Calibration | None,
    checkpoint: CheckpointFacts | None,
    correction: MemoryCorrection | None,
    cluster: Corrector | None,
    global_batch: int | None = None,
) -> Plan:
    """plan_job on the spec's own node count."""
    facts = checkpoint or CheckpointFacts()
    spec = with_checkpoint_architecture(spec, facts)
    # The GPU's own measured constants first: an OOM correction scales what this GPU is modelled with.
    cal = (calibration or load_calibration()).for_gpu(get_instance(spec.cluster.instance_type).gpu)
    if correction is not None:
        cal = corrected_calibration(cal, correction)
    model_name, arch = resolve_model(spec.model)
    limits = micro_batch_limits(correction) if correction is not None else {}
    ctx = Context(cal, cluster, limits, kept_batch=global_batch)
    try:
        solved = solve(spec, ctx)
    except PlanningError as error:
        raise with_remedies(spec, ctx, error) from None
    problem, pins, result = solved.problem, solved.pins, solved.result
    hw = problem.hw
    seq = spec.training.sequence_length
    best = result.best
    cp_fallback = solved.cp_fallback
    if best is None:
        pinned = pins.micro_batch_size
        fams = solved.families
        if correction is not None and pinned is not None and all(problem.max_mbs(f) < pinned for f in fams):
            raise PlanningError(
                "spec.tuning.microBatchSize",
                f"micro-batch {pinned} ran out of GPU memory on this job in every configuration the other "
                "spec.tuning pins allow (status.planHistory)",
                "use auto or a smaller micro-batch",
            )
        raise refusal(spec, ctx, solved)

    alternatives = _alternatives(best, result, problem.budget_bytes, hw, cal)
    chosen = _candidate(best, hw, cal)
    weights = spec.model.weights
    weights_plan = (
        None if weights is None else plan_weights(weights.uri, arch, hw, chosen.shard_degree, facts)
    )
    output = spec.training.output
    local_storage = plan_local_storage(
        spec,
        hw,
        arch=arch,
        parameter_count=problem.shapes.total_params,
        weights=weights_plan,
        facts=facts,
    )
    notes = [*_weights_notes(weights_plan), describe_local_storage(local_storage)]
    from_cluster = cluster(best.setting.recipe, best.setting.activation_checkpointing) if cluster else None
    if from_cluster is not None:
        notes.append(describe_cluster_correction(from_cluster))
    provenance = plan_provenance(
        load_measured(cal.name),
        cal,
        hw,
        best.setting,
        precision_pinned=pins.precision is not None,
        cp_fallback=cp_fallback,
        document_mask=problem.document_mask,
        parameters=problem.shapes.total_params,
    )
    probe = _probe(spec, best, result, problem, cal, cluster, pins)
    gpu = hw.gpu
    headline = (
        f"{model_name} ({parameters_text(problem.shapes.total_params)} params) on {hw.world} x {gpu.name} "
        f"({hw.nodes} x {hw.instance.instance_type}), sequence {seq}: {describe(best)} -> "
        f"{best.tokens_per_second:,.0f} tokens/s per GPU predicted"
    )
    return Plan(
        job_name=job_name,
        model_name=model_name,
        architecture=arch,
        parameter_count=problem.shapes.total_params,
        gpu=GpuInfo(
            name=gpu.name,
            compute_capability=gpu.compute_capability,
            memory_bytes=gpu.memory_bytes,
            peak_bf16_flops=gpu.peak_flops["bf16"],
        ),
        instance_type=hw.instance.instance_type,
        nodes=hw.nodes,
        gpus_per_node=hw.gpus_per_node,
        sequence_length=seq,
        global_batch_tokens=problem.tokens_per_micro_step(best.setting, best.setting.micro_batch_size)
        * best.gradient_accumulation_steps,
        steps=spec.training.steps,
        chosen=chosen,
        predicted=_prediction(best),
        alternatives=alternatives,
        candidates_evaluated=result.evaluations,
        explanation=[
            headline,
            *explain(best, result, problem.budget_bytes, pins, cal.trainer),
            *_left_out(pins, hw, cal),
            provenance_line(provenance),
            *describe_probe(probe, describe_candidate),
            *_batch_note(problem, spec),
            *notes,
            *([describe_correction(correction)] if correction is not None else []),
        ],
        calibration=f"{cal.name} ({cal.status})",
        cluster_correction=from_cluster,
        provenance=provenance,
        # The plan's own type (the spec's DatasetSpec adds only the uri check): the plan round-trips as JSON.
        dataset=DatasetConfig.model_validate(spec.training.dataset.model_dump()),
        checkpoint=spec.training.checkpoint.model_copy(deep=True),
        weights=weights_plan,
        output=None if output is None else OutputConfig(uri=output.uri),
        optimizer=spec.training.optimizer.model_copy(deep=True),
        probe=probe,
        local_storage=local_storage,
    )


def _probe(
    spec: BlackwellTrainingJobSpec,
    best: Scored,
    result: SearchResult,
    problem: Problem,
    cal: Calibration,
    cluster: Corrector | None,
    pins: Pins,
) -> ProbePlan:
    """The plan's probe section: its candidates, each measured (here or on this cluster) or modelled."""
    coverage = load_measured(cal.name)
    hw = problem.hw

    def measured(s: Scored) -> bool:
        if cluster is not None and speed_measured(
            cluster(s.setting.recipe, s.setting.activation_checkpointing)
        ):
            return True
        items = plan_provenance(
            coverage,
            cal,
            hw,
            s.setting,
            precision_pinned=pins.precision is not None,
            document_mask=problem.document_mask,
            parameters=problem.shapes.total_params,
        )
        return verdict(items)[0]

    return probe_plan(
        spec.tuning.probe,
        best,
        result.ranked,
        budget_bytes=problem.budget_bytes,
        steps=spec.training.steps,
        measured=measured,
        convert=lambda s: (_candidate(s, hw, cal), _prediction(s)),
        tokens_factor=lambda s: problem.factors(s.setting).tokens,
        shrink=lambda s, mbs: (
            problem.score(s.setting.with_mbs(mbs)) if problem.batch_ok(s.setting, mbs) else None
        ),
        larger=lambda s: range(s.setting.micro_batch_size + 1, problem.max_mbs(s.setting) + 1),
    )


def describe_candidate(c: Candidate) -> str:
    """A plan's candidate in a few words (explain.describe's wording)."""
    recipe = "" if c.precision_recipe.value == "none" else f"/{c.precision_recipe.value}"
    cp = f", cp {c.context_parallel}" if c.context_parallel > 1 else ""
    return (
        f"{c.precision.value}{recipe}, AC {c.activation_checkpointing.value}, mbs {c.micro_batch_size}, "
        f"{c.sharding.value} sharding{cp}"
    )


def _left_out(pins: Pins, hw: Hardware, cal: Calibration) -> list[str]:
    """Under precision auto: the recipes it did not consider, and why."""
    if pins.precision is not None:
        return []
    line = left_out_of_auto(load_measured(cal.name), cal, hw, pins.allow_unverified_recipes)
    return [line] if line else []


def provenance_line(items: list[ChoiceProvenance]) -> str:
    """The explanation's line on what the plan rests on."""
    return f"provenance: {verdict(items)[2]}"


def _weights_notes(weights: WeightsConfig | None) -> list[str]:
    """What loading the initial weights takes."""
    if weights is None or weights.load is None:
        return []
    return [describe_load(weights.uri, weights.load)]


def _batch_note(problem: Problem, spec: BlackwellTrainingJobSpec) -> list[str]:
    """The global batch, where it came from (pinned, kept, or the rule) and how to pin it."""
    tokens = problem.global_batch_tokens
    if tokens is None:
        return []
    pin = f"spec.training.globalBatchTokens: {tokens}"
    if spec.training.global_batch_tokens is not None:
        return [f"global batch {tokens:,} tokens per step, pinned ({pin})"]
    chosen = chosen_global_batch(spec, problem.shapes, problem.hw)
    # Kept where the rule chooses the same: the line the first plan had, so that the plan (and its child's
    # hash) of a restart or a re-plan reads as the one before.
    if problem.kept_batch and tokens != chosen.tokens:
        return [
            f"global batch {tokens:,} tokens per step, kept: the batch this job trains (status.globalBatch, "
            f"docs/global-batch.md); pin it with {pin}"
        ]
    return [
        f"global batch {tokens:,} tokens per step, chosen by the planner: {chosen.reason}; pin it with {pin}"
    ]


def _alternatives(
    best: Scored, result: SearchResult, budget: float, hw: Hardware, cal: Calibration
) -> list[Alternative]:
    """The best candidate of each other family, plus faster ones that did not fit, best first."""
    picks: list[Scored] = []
    seen = {best.setting.family}
    for s in result.ranked:
        if s.setting.family not in seen:
            seen.add(s.setting.family)
            picks.append(s)
        if len(picks) >= ALTERNATIVES:
            break
    too_big = [
        f.first_too_big
        for f in result.families
        if f.first_too_big is not None
        and f.first_too_big.time is not None
        and f.first_too_big.tokens_per_second > best.tokens_per_second
    ]
    too_big.sort(key=lambda s: -s.tokens_per_second)
    chosen = picks[: ALTERNATIVES - min(2, len(too_big))] + too_big[:2]
    chosen.sort(key=lambda s: (not s.fits, -s.tokens_per_second))
    return [
        Alternative(
            candidate=_candidate(s, hw, cal), prediction=_prediction(s), reason=loss_reason(best, s, budget)
        )
        for s in chosen
    ]
