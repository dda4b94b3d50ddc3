"""Memory figures (and parameter counts) as people read them: one rounding rule, comparisons that read
right, parts that add up.

The rule: GiB with one decimal, rounded to nearest; where a need is compared with a limit it cannot
meet, the need is rounded up and the limit down, so the text never reads `170.1 GiB > 170.1 GiB`; a
budget is a limit wherever it is shown, always rounded down, so one plan never shows two budgets; and
the parts of a total are rounded so that the parts shown add up to the total shown.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from blackwell_operator.units import GIB

_STEP = 10  # tenths of a GiB


def parameters_text(count: int) -> str:
    """A parameter count: `8.03B` from 100M on (as presets are named), `27.5M` from 1M, `106.8K` from 1,000,
    else exact: a test model of 106,816 parameters never reads `0.00B` (issue 39)."""
    if count >= 10**8:
        return f"{count / 1e9:.2f}B"
    if count >= 10**6:
        return f"{count / 1e6:.1f}M"
    if count >= 10**3:
        return f"{count / 1e3:.1f}K"
    return str(count)


def memory_budget(gpu_memory_bytes: float, headroom: float) -> float:
    """The bytes a plan may use per GPU: the GPU's memory less the spec's memoryHeadroom share."""
    return gpu_memory_bytes * (1.0 - headroom)


def gib(n: float) -> str:
    """Bytes as GiB with one decimal, rounded to nearest."""
    return f"{n / GIB:.1f} GiB"


def need(n: float) -> str:
    """A need that a limit misses, rounded up: beside `limit()` it never reads `x > x`."""
    return f"{math.ceil(n / GIB * _STEP) / _STEP:.1f} GiB"


def limit(n: float) -> str:
    """A limit (a memory budget, wherever it is shown), rounded down."""
    return f"{limit_gib(n):.1f} GiB"


def limit_gib(n: float) -> float:
    """A limit's GiB, rounded down to a tenth: the one figure of a budget in every table and line."""
    return math.floor(n / GIB * _STEP) / _STEP


def over(needed: float, limit_bytes: float) -> str:
    """`X GiB > Y GiB`: the need rounded up, the limit down (distinct whenever needed > limit)."""
    return f"{need(needed)} > {limit(limit_bytes)}"


def tenths(parts: Sequence[float], total: float | None = None) -> list[float]:
    """Each part in GiB to one decimal such that they sum to the total rounded (largest remainder)."""
    exact = [p / GIB * _STEP for p in parts]
    target = round((sum(parts) if total is None else total) / GIB * _STEP)
    floors = [math.floor(x) for x in exact]
    short = target - sum(floors)
    order = sorted(range(len(exact)), key=lambda i: exact[i] - floors[i], reverse=True)
    for i in order[: max(0, short)]:
        floors[i] += 1
    return [f / _STEP for f in floors]
