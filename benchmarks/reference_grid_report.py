"""Predicted vs measured on the H200 reference grid, as a Markdown table (for docs/planner.md).

Usage: python benchmarks/reference_grid_report.py [--write]
--write replaces the block between the reference-grid markers in docs/planner.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml

from blackwell_operator.calibrate.grid import compare, grid_plan
from blackwell_operator.calibration import load_calibration

ROOT = Path(__file__).resolve().parents[1]
GRID = ROOT / "tests" / "planner" / "data" / "h200_reference_grid.yaml"
DOC = ROOT / "docs" / "planner.md"
START, END = "<!-- reference-grid:start -->", "<!-- reference-grid:end -->"


def report(grid: dict[str, Any]) -> str:
    """The Markdown block: every run, then the planner's choice per model."""
    cal = load_calibration("h200-reference")
    rows = compare(grid, cal)
    out = [
        "| model | mbs | AC | measured tok/s | predicted tok/s | err | measured reserved GiB | "
        "predicted reserved GiB | err | predicted fits | peak phase |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.oom:
            out.append(
                f"| {r.model} | {r.mbs} | {r.ac} | OOM | {r.predicted_tps:,.0f} | | OOM | "
                f"{r.predicted_reserved_gib:.1f} | | {'yes' if r.predicted_fits else 'no'} | {r.peak_phase} |"
            )
            continue
        assert r.tps_error is not None and r.reserved_error is not None
        out.append(
            f"| {r.model} | {r.mbs} | {r.ac} | {r.measured_tps:,.0f} | {r.predicted_tps:,.0f} | "
            f"{r.tps_error:+.1%} | {r.measured_reserved_gib:.1f} | {r.predicted_reserved_gib:.1f} | "
            f"{r.reserved_error:+.1%} | {'yes' if r.predicted_fits else 'no'} | {r.peak_phase} |"
        )
    ran = [r for r in rows if not r.oom]
    worst_mem = max(abs(r.reserved_error or 0) for r in ran)
    worst_tps = max(abs(r.tps_error or 0) for r in ran)
    mean_tps = sum(abs(r.tps_error or 0) for r in ran) / len(ran)
    out += [
        "",
        f"Worst reserved-memory error {worst_mem:.1%}; throughput error worst {worst_tps:.1%}, "
        f"mean {mean_tps:.1%}; OOMs predicted not to fit: "
        f"{sum(not r.predicted_fits for r in rows if r.oom)} of {sum(r.oom for r in rows)}.",
        "",
        "The planner's choice with this calibration (1 GPU, sequence 4096, no headroom; the grid ran one "
        "micro-batch a step, so the global batch is pinned to the largest measured micro-batch that plans):",
        "",
        "| model | chosen | predicted tok/s | best measured | measured for the choice |",
        "|---|---|---|---|---|",
    ]
    for model in grid["models"]:
        runs = [r for r in grid["runs"] if r["model"] == model and not r.get("oom")]
        best = max(runs, key=lambda r: r["tokens_per_second"])
        plan = grid_plan(grid, model, cal)
        c = plan.chosen
        same = [r for r in runs if r["ac"] == c.activation_checkpointing.value]
        exact = [r for r in same if r["mbs"] == c.micro_batch_size]
        if exact:
            measured = f"{exact[0]['tokens_per_second']:,}"
        else:
            below = max((r for r in same if r["mbs"] < c.micro_batch_size), key=lambda r: r["mbs"])
            measured = f"not run; >= {below['tokens_per_second']:,} (mbs {below['mbs']})"
        out.append(
            f"| {model} | AC {c.activation_checkpointing.value}, mbs {c.micro_batch_size} | "
            f"{plan.predicted.tokens_per_second_per_gpu:,.0f} | {best['tokens_per_second']:,} "
            f"({best['ac']}, mbs {best['mbs']}) | {measured} |"
        )
    return "\n".join(out)


def with_table(doc: str, text: str) -> str:
    """`doc` with the block between the markers replaced by `text`."""
    head, rest = doc.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{text}\n{END}{tail}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"update {DOC.relative_to(ROOT)}")
    args = parser.parse_args()
    text = report(yaml.safe_load(GRID.read_text()))
    if args.write:
        DOC.write_text(with_table(DOC.read_text(), text))
    print(text)


if __name__ == "__main__":
    main()
