"""Fit the allocator-fragmentation constants of the h200-reference calibration to the measured grid.

Usage: python benchmarks/fit_reference_calibration.py [GRID_YAML]
Prints the constants that minimise the worst relative error of predicted reserved memory over the runs
that did not OOM (ties broken by mean error). The other memory constants are hand-derived (see the
sources in the calibration file); this only fits reserved - allocated.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path
from typing import Any

import yaml

from blackwell_operator.calibrate.grid import grid_candidate, grid_spec
from blackwell_operator.calibration import load_calibration
from blackwell_operator.planner import evaluate

GIB = 1 << 30
DEFAULT_GRID = Path(__file__).resolve().parents[1] / "tests" / "planner" / "data" / "h200_reference_grid.yaml"


def internals(grid: dict[str, Any]) -> list[tuple[float, float, float, float, float, float]]:
    """Per run that ran: (measured reserved, backward alloc, optimizer alloc, saved, transient, gradients)."""
    cal = load_calibration("h200-reference")
    rows = []
    for run in grid["runs"]:
        if run.get("oom"):
            continue
        ev = evaluate(grid_spec(grid, run["model"]), grid_candidate(run["mbs"], run["ac"]), calibration=cal)
        m = ev.memory
        rows.append(
            (
                run["reserved_gib"] * GIB,
                m.backward_allocated,
                m.optimizer_allocated,
                m.saved_activations,
                m.transient,
                m.gradient_bytes,
            )
        )
    return rows


def main() -> None:
    grid = yaml.safe_load(Path(sys.argv[1] if len(sys.argv) > 1 else DEFAULT_GRID).read_text())
    rows = internals(grid)
    steps = [i / 100 for i in range(0, 41, 2)]
    grad_steps = [i / 100 for i in range(0, 121, 4)]
    best: tuple[float, float, tuple[float, ...]] | None = None
    for base_gib, dyn, trans, static, opt in itertools.product(
        [x / 2 for x in range(0, 13)], steps, steps, grad_steps, [i / 100 for i in range(0, 21)]
    ):
        base = base_gib * GIB
        errors = []
        for measured, bwd, optim, saved, transient, stat in rows:
            reserved = max(
                bwd + base + dyn * saved + trans * transient + static * stat,
                optim + base + opt * optim,
                bwd,
                optim,
            )
            errors.append(abs(reserved / measured - 1.0))
        key = (max(errors), sum(errors) / len(errors), (base_gib, dyn, trans, static, opt))
        if best is None or key[:2] < best[:2]:
            best = key
    assert best is not None
    worst, mean, (base_gib, dyn, trans, static, opt) = best
    print(f"worst |error| {worst:.1%}, mean {mean:.1%} over {len(rows)} runs")
    print(f"fragmentation_base_bytes: {int(base_gib * GIB)}  # {base_gib} GiB")
    print(f"fragmentation_dynamic: {dyn}")
    print(f"fragmentation_transient: {trans}")
    print(f"fragmentation_gradients: {static}")
    print(f"fragmentation_optimizer: {opt}")


if __name__ == "__main__":
    main()
