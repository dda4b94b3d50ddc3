"""Errors that carry the offending field and the fix, so every surface can show one clear line."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# One change a fix advises, as the manifest spells it: a dotted path ("spec.cluster.nodes") to the value it
# sets (None: leave the field out). A fix may advise several alternatives, each a set of such changes.
Changes = Mapping[str, Any]


class SpecError(ValueError):
    """A spec the operator cannot act on: names the field, what is wrong, and how to fix it.

    `remedies`: the fix as data, the alternatives it names, each of which makes the spec plan when applied
    to it as written (tests apply them literally); empty where the fix is no change of the spec.
    """

    def __init__(self, field: str, problem: str, fix: str = "", *, remedies: Sequence[Changes] = ()) -> None:
        self.field = field
        self.problem = problem
        self.fix = fix
        self.remedies = tuple(dict(r) for r in remedies)
        super().__init__(self.message)

    @property
    def message(self) -> str:
        """One line: field, problem, fix."""
        text = f"{self.field}: {self.problem}"
        return f"{text}. Fix: {self.fix}" if self.fix else text

    @property
    def reason(self) -> str:
        """CamelCase condition reason."""
        return "InvalidSpec"


class PlanningError(SpecError):
    """The spec is well-formed but no configuration fits or a pinned value is impossible."""

    @property
    def reason(self) -> str:
        return "NoFeasiblePlan"
