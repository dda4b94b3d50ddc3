"""Grid coverage: which harness families stop their micro-batch ladder short of its first OOM."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from blackwell_operator.calibrate.records import CalibrationRecord, family_key

# The harness doubles micro-batch sizes up to this one (its --max-mbs default): a family whose largest
# size ran is complete without an OOM.
LADDER_TOP = 64


@dataclass(frozen=True)
class OpenLadder:
    """A family whose next doubling after its largest run was never measured (cut, timed out, not run)."""

    family: str
    largest_ran: int
    next_size: int
    next_status: str
    # The planner's prediction for the missing rung, when the harness left a record of it.
    next_predicted_reserved: int | None


def _label(rec: CalibrationRecord) -> str:
    c = rec.candidate
    precision = c.precision.value if c.precision_recipe.value == "none" else c.precision_recipe.value
    return (
        f"{rec.scenario.label()} {precision} ac-{c.activation_checkpointing.value} shard-{c.sharding.value}"
    )


def open_ladders(records: Sequence[CalibrationRecord]) -> list[OpenLadder]:
    """Harness families whose ladder neither reached an OOM at the next doubling nor the top size."""
    families: dict[tuple[object, ...], dict[int, CalibrationRecord]] = defaultdict(dict)
    for rec in records:
        if rec.source != "harness":
            continue  # imported runs were not ladders
        sizes = families[family_key(rec)]
        mbs = rec.candidate.micro_batch_size
        # A later call's measurement replaces an earlier cut or timeout of the same configuration.
        if mbs not in sizes or not (sizes[mbs].ran or sizes[mbs].oom):
            sizes[mbs] = rec
    out = []
    for sizes in families.values():
        ran = [m for m, r in sizes.items() if r.ran]
        if not ran:
            continue  # nothing ran: the criteria report the family's OOMs, and the pick table its absence
        top = max(ran)
        nxt = sizes.get(top * 2)
        if top >= LADDER_TOP or (nxt is not None and nxt.oom):
            continue
        pred = nxt.predicted if nxt is not None else None
        out.append(
            OpenLadder(
                family=_label(sizes[top]),
                largest_ran=top,
                next_size=top * 2,
                next_status=nxt.status.value if nxt is not None else "not run",
                next_predicted_reserved=pred.memory.peak_reserved if pred is not None else None,
            )
        )
    return sorted(out, key=lambda o: o.family)
