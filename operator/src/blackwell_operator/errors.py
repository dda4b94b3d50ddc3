"""Errors that carry the offending field and the fix, so every surface can show one clear line."""

from __future__ import annotations


class SpecError(ValueError):
    """A spec the operator cannot act on: names the field, what is wrong, and how to fix it."""

    def __init__(self, field: str, problem: str, fix: str = "") -> None:
        self.field = field
        self.problem = problem
        self.fix = fix
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
