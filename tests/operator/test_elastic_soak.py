"""A short, bounded elastic soak: nodes lost and regained at random while three jobs train (loopback)."""

from __future__ import annotations

import pytest
from benchmarks.elastic_soak import GLOBAL_BATCH, elastic_soak

pytestmark = pytest.mark.integration


@pytest.mark.timeout(300)
async def test_every_job_ends_with_each_step_trained_once_with_one_global_batch() -> None:
    result = await elastic_soak(3, 150, chaos_s=20.0, finish_s=90.0, seed=27, step_s=0.1, checkpoint_every=5)
    assert result["node_changes"] > 0 and result["resizes"] >= 1, result
    for name, job in result["per_job"].items():
        assert job["phase"] == "Succeeded", (name, job)
        # Only checkpoints commit steps: a child a resize deleted loses the steps since its last one, and
        # its successor trains them again; the committed history is every step, once, in order.
        assert job["every_step_once"], (name, job["steps_trained_twice"], job["steps_missing"])
        assert job["global_batches"] == [GLOBAL_BATCH], (name, job)
        assert all(before != after for before, after in job["resizes_in_history"]), job
    assert result["operator_error_lines"] == 0 and result["tracebacks_logged"] == 0, result
