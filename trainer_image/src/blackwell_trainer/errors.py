"""Error types that several trainer modules raise or catch: the data source, the plan, a non-finite step."""

from __future__ import annotations


class DataError(ValueError):
    """A data source that cannot be built or resumed; the message names the field and the fix."""


class PlanError(ValueError):
    """A plan this job cannot execute; the message is one line naming the field and the fix."""


class NonFiniteStep(RuntimeError):
    """A step whose loss, gradient norm or parameters are not finite; raised on every rank alike.

    Not a permanent error: a restart resumes from the newest checkpoint, which was followed by finite
    steps. A non-finite value from a faulty GPU or link (silent data corruption) or from a kernel that
    is not deterministic is gone after it; one that recurs at the same step (a loss spike the learning
    rate cannot take) recurs only until the pods' restart budget is spent, one interval each time.
    """

    KINDS = ("the loss is", "the gradient norm is", "the parameters after the optimizer step are")

    def __init__(self, step: int, loss: float, ranks: list[list[int]]) -> None:
        self.step, self.loss, self.ranks = step, loss, ranks
        # Name the first non-finite value in the order they arise: loss, then gradients, then weights.
        kind, where = next(((k, r) for k, r in zip(self.KINDS, ranks, strict=True) if r), (self.KINDS[0], []))
        shown = ", ".join(str(r) for r in where[:8])
        shown += f" and {len(where) - 8} more" if len(where) > 8 else ""
        on = f" on rank{'s' if len(where) > 1 else ''} {shown}" if where else ""
        super().__init__(f"step {step}: {kind} not finite{on} (loss {loss:g})")

    def explained(self, detail: str) -> NonFiniteStep:
        """The same stop with what it means for the checkpoints and what to do, on the same line."""
        self.args = (f"{self.args[0]}; {detail}",)
        return self
