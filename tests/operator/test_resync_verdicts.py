"""The resync loop asks whether a BTJ has converged once per resourceVersion, not every round."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import pytest

from blackwell_operator.handlers.resync import Resync
from blackwell_operator.lifecycle.convergence import needs_reconcile


class _Seen:
    """The part of OperatorContext the loop's bookkeeping reads."""

    def __init__(self) -> None:
        self.btjs: dict[str, Mapping[str, Any]] = {}

    def known_btjs(self) -> dict[str, Mapping[str, Any]]:
        return dict(self.btjs)


def _btj(uid: str, rv: str, generation: int, observed: int | None) -> dict[str, Any]:
    # Invalid: a BTJ that has converged once its generation is observed (it wants no child).
    status = {} if observed is None else {"observedGeneration": observed, "phase": "Invalid"}
    return {"metadata": {"uid": uid, "resourceVersion": rv, "generation": generation}, "status": status}


def test_a_verdict_is_asked_once_per_resource_version(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []

    def counting(btj: Mapping[str, Any]) -> str | None:
        asked.append(str(btj["metadata"]["resourceVersion"]))
        return needs_reconcile(btj)

    monkeypatch.setattr("blackwell_operator.handlers.resync.needs_reconcile", counting)
    seen = _Seen()
    loop = Resync(seen, 60.0, logging.getLogger("test"))  # type: ignore[arg-type]
    seen.btjs = {"a": _btj("a", "1", 1, None), "b": _btj("b", "5", 1, 1)}
    for now in (0.0, 0.5, 1.0, 1.5):
        due = loop.due(now)
    assert sorted(asked) == ["1", "5"]  # four rounds, one question per BTJ
    assert [btj["metadata"]["uid"] for btj in due] == ["a"]  # not reconciled, quiet for a second
    seen.btjs["a"] = _btj("a", "2", 1, 1)  # reconciled: a new version, a new answer
    assert loop.due(2.0) == [] and asked[-1] == "2"
    del seen.btjs["b"]
    loop.due(2.5)
    assert set(loop._verdicts) == {"a"}  # a BTJ gone is forgotten
