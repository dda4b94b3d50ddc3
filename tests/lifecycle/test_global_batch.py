"""lifecycle/global_batch.py: the global batch stored with a job, kept by every later plan, and a user's
edit that changes it recorded in status.planHistory (docs/global-batch.md)."""

from __future__ import annotations

from functools import cache

from blackwell_operator.lifecycle.global_batch import SPEC_EDIT, batch_edit, kept_tokens, recorded
from blackwell_operator.lifecycle.outcome import PassOutcome, status_change
from blackwell_operator.models.spec import BlackwellTrainingJobSpec
from blackwell_operator.models.status import BatchSource, BlackwellTrainingJobStatus, GlobalBatch
from blackwell_operator.planner import plan_job
from blackwell_operator.planner.global_batch import RULE_VERSION
from blackwell_trainer.plan.config import Plan
from tests.support.specs import make_spec

NOW = "2026-12-01T10:00:00Z"


@cache
def _plan(seq: int = 8192, pinned: int | None = None, kept: int | None = None) -> Plan:
    return plan_job(_spec(seq, pinned), global_batch=kept)


def _spec(seq: int = 8192, pinned: int | None = None) -> BlackwellTrainingJobSpec:
    spec = make_spec(seq=seq, nodes=2)
    spec.training.global_batch_tokens = pinned
    return spec


def _first(spec: BlackwellTrainingJobSpec, plan: Plan) -> BlackwellTrainingJobStatus:
    """The status after the job's first plan."""
    return BlackwellTrainingJobStatus(
        plan=plan, observed_generation=1, global_batch=recorded(spec, plan, BlackwellTrainingJobStatus(), 1)
    )


def test_the_first_plan_records_the_rule_s_batch_and_its_version() -> None:
    spec = _spec()
    batch = _first(spec, _plan()).global_batch
    assert batch is not None
    assert (batch.tokens, batch.source, batch.rule, batch.generation) == (
        2**21,
        BatchSource.RULE,
        RULE_VERSION,
        1,
    )
    pinned = _spec(pinned=2**20)
    assert recorded(pinned, _plan(pinned=2**20), BlackwellTrainingJobStatus(), 1).source is BatchSource.PINNED


def test_a_stored_batch_is_kept_by_every_later_plan_of_the_same_model_and_sequence() -> None:
    spec = _spec()
    stored = _first(spec, _plan())
    # As if an earlier rule had chosen 1 Mi tokens: this operator keeps them, whatever its rule says now.
    assert stored.global_batch is not None
    stored.global_batch.tokens = 2**20
    assert kept_tokens(spec, stored, 2) == 2**20
    again = recorded(spec, _plan(kept=2**20), stored, 2)
    assert again == stored.global_batch  # unchanged, with the generation that set it
    # An edit of the sequence length (or the model) chooses again; one of globalBatchTokens pins it.
    assert kept_tokens(_spec(seq=4096), stored, 2) is None
    assert kept_tokens(_spec(pinned=2**22), stored, 2) is None


def test_unpinning_chooses_by_the_rule_again() -> None:
    pinned = _spec(pinned=2**20)
    stored = _first(pinned, _plan(pinned=2**20))
    assert kept_tokens(_spec(), stored, 2) is None


def test_an_earlier_operator_s_running_plan_is_kept_on_upgrade() -> None:
    # No status.globalBatch (written before it existed): this generation's running plan's batch is kept.
    stored = BlackwellTrainingJobStatus(plan=_plan(kept=2**20), observed_generation=3)
    assert kept_tokens(_spec(), stored, 3) == 2**20
    batch = recorded(_spec(), _plan(kept=2**20), stored, 3)
    assert (batch.tokens, batch.source) == (2**20, BatchSource.EARLIER_PLAN)
    assert kept_tokens(_spec(), stored, 4) is None  # a new generation: chosen by the rule


def test_a_user_s_edit_that_changes_the_batch_is_in_plan_history() -> None:
    spec, edited = _spec(), _spec(pinned=2**22)
    stored = _first(spec, _plan())
    assert stored.global_batch is not None
    outcome = PassOutcome(
        2, plan=_plan(pinned=2**22), global_batch=recorded(edited, _plan(pinned=2**22), stored, 2)
    )
    change = status_change(outcome, stored, NOW)
    assert change.global_batch is not None and change.global_batch.tokens == 2**22
    assert change.plan_history is not None
    entry = change.plan_history[-1]
    assert (entry.reason, entry.global_batch_before, entry.global_batch_after) == (SPEC_EDIT, 2**21, 2**22)
    assert "spec.training.globalBatchTokens set to 4194304" in entry.message
    assert entry.failed_child_uid is None  # no child is being replaced for it
    # Written once: the next pass finds it stored and adds nothing.
    after = stored.model_copy(
        update={"global_batch": change.global_batch, "plan_history": change.plan_history}
    )
    assert status_change(outcome, after, NOW).plan_history is None


def test_an_unchanged_batch_adds_no_history() -> None:
    batch = GlobalBatch(
        tokens=2**21, source=BatchSource.RULE, rule=RULE_VERSION, chosen_for="x", generation=1
    )
    pinned = batch.model_copy(update={"source": BatchSource.PINNED, "rule": None, "generation": 2})
    assert batch_edit(batch, pinned, None, _plan(), at=NOW) is None
    assert batch_edit(None, batch, None, _plan(), at=NOW) is None


def test_an_edit_of_the_sequence_length_chooses_again_and_says_why() -> None:
    spec, edited = _spec(), _spec(seq=4096)
    stored = _first(spec, _plan())
    before = stored.global_batch
    assert before is not None
    plan = plan_job(edited)  # the rule at 4096: 512 sequences, the same 2 Mi tokens
    assert kept_tokens(edited, stored, 2) is None
    after = recorded(edited, plan, stored, 2)
    assert after.tokens == before.tokens and after.chosen_for != before.chosen_for
    assert batch_edit(before, after, stored.plan, plan, at=NOW) is None  # the same tokens: no entry
    smaller = after.model_copy(update={"tokens": 2**20})
    entry = batch_edit(before, smaller, stored.plan, plan, at=NOW)
    assert entry is not None and "spec.model or spec.training.sequenceLength edited" in entry.message
