"""The sample ledger: with BTJ_SAMPLE_LEDGER set, each rank appends which global samples each step trained.

An audit of exactly-once training across restarts and resizes: one JSON line per optimizer step and rank,
`{"step": s, "rank": r, "samples": [[epoch, index], ...]}`, appended to `<folder>/rank-<r>.jsonl`. A
step that ran after the last checkpoint is written again by the run that resumes before it, so a reader
keeps, per step, the line of the latest run (docs/elastic.md).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from blackwell_trainer.plan.env_vars import LEDGER_ENV


class SampleLedger:
    """Collects one step's (epoch, index) samples on this rank and appends them when the step is done."""

    def __init__(self, folder: str | None, rank: int) -> None:
        self._path = Path(folder) / f"rank-{rank}.jsonl" if folder else None
        self._rank = rank
        self._pending: list[list[int]] = []
        if self._path is not None:
            self._path.parent.mkdir(parents=True, exist_ok=True)

    @classmethod
    def from_env(cls, rank: int) -> SampleLedger:
        """The ledger BTJ_SAMPLE_LEDGER names (a folder), or one that records nothing."""
        return cls(os.environ.get(LEDGER_ENV) or None, rank)

    def took(self, epoch: int, indices: list[int]) -> None:
        """One micro-batch's samples, taken for the step in progress."""
        if self._path is not None:
            self._pending.extend([epoch, i] for i in indices)

    def trained(self, step: int) -> None:
        """The step in progress finished: append its samples (one line, flushed before the next step)."""
        if self._path is None:
            return
        line = json.dumps({"step": step, "rank": self._rank, "samples": self._pending})
        self._pending = []
        with self._path.open("a", encoding="utf-8") as out:
            out.write(line + "\n")

    def discard(self) -> None:
        """The step in progress did not finish (a non-finite one): nothing of it is recorded."""
        self._pending = []
