"""A re-plan's record is the replacement's intent (lifecycle/replan.py): every pass compares it with the
child that exists, deletes the stale child, creates the planned one, and the resync loop looks until the
new child is recorded (issue 35)."""

from __future__ import annotations

import copy
from typing import Any

from blackwell_operator.lifecycle.child_apply import Create, Creation, PreviousDeleting, StaleChild, decide
from blackwell_operator.lifecycle.convergence import needs_reconcile
from blackwell_operator.lifecycle.elastic import decide as decide_resize
from blackwell_operator.lifecycle.elastic import resize_changes
from blackwell_operator.lifecycle.replan import replaced_child_uid
from blackwell_operator.planner import plan_job
from tests.lifecycle.test_child_apply import OLD, in_cluster, rendered, wanted
from tests.lifecycle.test_elastic import RANGE, at, down, nodes, running, spec, up

CHILD = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "llama", "uid": OLD}


def resized() -> dict[str, Any]:
    """A BTJ whose resize from 4 to 3 nodes is written: its child OLD is the stale one."""
    btj = running(4)
    btj["status"]["child"] = dict(CHILD)
    btj["metadata"]["uid"] = "btj-uid"
    one_down = nodes(*up(3), down(0))
    decision = decide_resize(RANGE, 4, one_down, None, at(0))
    decision = decide_resize(RANGE, 4, one_down, decision.elastic, at(60))
    change, entry = resize_changes(btj, decision, lambda n: plan_job(spec(), schedulable=n), now="T")
    assert entry is not None
    btj["status"] = {**btj["status"], **change.model_dump(by_alias=True, mode="json", exclude_unset=True)}
    return btj


def test_the_written_resize_names_the_stale_child_and_the_loop_looks_until_it_is_replaced() -> None:
    btj = resized()
    assert replaced_child_uid(btj["status"]) == OLD
    assert needs_reconcile(btj) == f"a re-plan replaces its child {OLD}, which has not been replaced yet"
    # The new child recorded: the intent is done, nothing left to look for.
    done = copy.deepcopy(btj)
    done["status"]["child"]["uid"] = "new-child-uid"
    done["status"]["conditions"] = [
        {"type": "ChildCreated", "status": "True", "reason": "Created", "lastTransitionTime": "T"}
    ]
    assert replaced_child_uid(done["status"]) is None and needs_reconcile(done) is None


def test_a_pass_that_finds_the_stale_child_deletes_it_and_creates_once_it_is_gone() -> None:
    btj = resized()
    job = rendered(wanted().kind, digest="h2")
    stale = in_cluster(rendered(wanted().kind, digest="h1"), status={"conditions": []})
    found = decide(wanted(digest="h2"), stale, btj["status"])
    assert isinstance(found, StaleChild) and found.uid == OLD
    # Terminating: its end is not the job's, so the pass lets it go without waiting for the watcher.
    going = decide(wanted(digest="h2"), in_cluster(job, deleting=True), btj["status"])
    assert isinstance(going, PreviousDeleting) and going.release
    gone = decide(wanted(digest="h2"), None, btj["status"])
    assert isinstance(gone, Create) and gone.previous_uid == OLD and gone.why is Creation.AFTER_RESIZE


def test_a_child_of_another_uid_is_never_taken_for_the_stale_one() -> None:
    btj = resized()
    newer = in_cluster(rendered(wanted().kind, digest="h2"))
    newer["metadata"]["uid"] = "new-child-uid"
    assert not isinstance(decide(wanted(digest="h2"), newer, btj["status"]), StaleChild)
