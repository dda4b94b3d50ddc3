"""The global batch stored with a job (status.globalBatch): what every later plan keeps, and the record of
the user's edit that changes it (docs/global-batch.md)."""

from __future__ import annotations

import hashlib
import json

from blackwell_operator.models.spec import BlackwellTrainingJobSpec
from blackwell_operator.models.status import BatchSource, BlackwellTrainingJobStatus, GlobalBatch, PlanChange
from blackwell_operator.planner.global_batch import RULE_DOC, RULE_VERSION
from blackwell_trainer.plan.config import Plan

# status.planHistory's reason for a user's edit that changed the global batch.
SPEC_EDIT = "SpecEdit"


def chosen_for(spec: BlackwellTrainingJobSpec) -> str:
    """SHA-256 of what the rule chooses from: the model (spec.model) and the sequence length."""
    picked = {
        "model": spec.model.model_dump(mode="json", by_alias=True, exclude_none=True),
        "sequenceLength": spec.training.sequence_length,
    }
    text = json.dumps(picked, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def _rule_kept(spec: BlackwellTrainingJobSpec, stored: BlackwellTrainingJobStatus) -> GlobalBatch | None:
    """status.globalBatch when the rule (or an earlier plan) chose it for this spec's model and sequence
    length, and the spec still leaves globalBatchTokens to the planner."""
    batch = stored.global_batch
    if spec.training.global_batch_tokens is not None or batch is None or batch.source is BatchSource.PINNED:
        return None
    return batch if batch.chosen_for == chosen_for(spec) else None


def _earlier_plan(
    spec: BlackwellTrainingJobSpec, stored: BlackwellTrainingJobStatus, generation: int
) -> int | None:
    """The tokens of this generation's running plan, written by an operator that did not store
    status.globalBatch yet (an upgrade): kept, so that the upgrade never changes a running job's batch."""
    if spec.training.global_batch_tokens is not None or stored.global_batch is not None:
        return None
    if stored.plan is None or stored.observed_generation != generation:
        return None
    return stored.plan.global_batch_tokens


def kept_tokens(
    spec: BlackwellTrainingJobSpec, stored: BlackwellTrainingJobStatus, generation: int
) -> int | None:
    """The tokens per step every plan of `spec` must train when the spec does not pin them: those stored
    with the job (status.globalBatch), chosen for this model and sequence length; else this generation's
    running plan's, where an earlier operator stored none. None: the spec pins them, or the rule chooses
    (the first plan, or an edit of the model, the sequence length or globalBatchTokens)."""
    kept = _rule_kept(spec, stored)
    return kept.tokens if kept is not None else _earlier_plan(spec, stored, generation)


def recorded(
    spec: BlackwellTrainingJobSpec, plan: Plan, stored: BlackwellTrainingJobStatus, generation: int
) -> GlobalBatch:
    """status.globalBatch for `plan` of `spec` (planned with kept_tokens): the stored one where it
    still describes it (with the generation that set it), else a new one set on `generation`."""
    tokens, fingerprint, before = plan.global_batch_tokens, chosen_for(spec), stored.global_batch
    if spec.training.global_batch_tokens is not None:
        source, rule = BatchSource.PINNED, None
    elif _rule_kept(spec, stored) is not None:
        assert before is not None
        source, rule = before.source, before.rule
    elif _earlier_plan(spec, stored, generation) == tokens:
        source, rule = BatchSource.EARLIER_PLAN, None
    else:
        source, rule = BatchSource.RULE, RULE_VERSION
    if before is not None and (before.tokens, before.source, before.rule) == (tokens, source, rule):
        return before.model_copy(update={"chosen_for": fingerprint})
    return GlobalBatch(tokens=tokens, source=source, rule=rule, chosen_for=fingerprint, generation=generation)


def _why(before: GlobalBatch, after: GlobalBatch) -> str:
    if after.source is BatchSource.PINNED:
        return f"spec.training.globalBatchTokens set to {after.tokens}"
    if before.source is BatchSource.PINNED:
        return f"spec.training.globalBatchTokens removed: the planner's rule chose it ({RULE_DOC})"
    return f"spec.model or spec.training.sequenceLength edited: the planner's rule chose again ({RULE_DOC})"


def batch_edit(
    before: GlobalBatch | None, after: GlobalBatch, old: Plan | None, new: Plan, *, at: str
) -> PlanChange | None:
    """The status.planHistory entry of a user's edit that changed the global batch (None: unchanged)."""
    if before is None or before.tokens == after.tokens:
        return None
    return PlanChange(
        at=at,
        generation=after.generation,
        reason=SPEC_EDIT,
        message=f"global batch {before.tokens:,} -> {after.tokens:,} tokens per step: {_why(before, after)}",
        failed=None if old is None else old.chosen,
        replacement=new.chosen,
        global_batch_before=before.tokens,
        global_batch_after=after.tokens,
    )
