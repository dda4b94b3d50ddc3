"""The golden plans (tests/planner/golden/plans.json) as a Markdown table for docs/planner.md.

Usage: python benchmarks/golden_report.py [--write]
--write replaces the block between the golden markers in docs/planner.md.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "planner" / "golden" / "plans.json"
DOC = ROOT / "docs" / "planner.md"
START, END = "<!-- golden:start -->", "<!-- golden:end -->"


def report(plans: dict[str, Any] | None = None) -> str:
    """One row per golden case (of the committed golden file unless `plans` is given)."""
    plans = json.loads(GOLDEN.read_text()) if plans is None else plans
    out = [
        "| case (preset/instance/nodes/sequence) | precision | AC | mbs | sharding | cp | tok/s/GPU | MFU "
        "| peak GiB |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for case, v in plans.items():
        if "error" in v:
            out.append(f"| {case} | rejected: {v['error'].split(': ', 1)[1]} | | | | | | | |")
            continue
        out.append(
            f"| {case} | {v['precision']}/{v['recipe']} | {v['ac']} | {v['mbs']} | {v['sharding']} | "
            f"{v['cp']} | {v['tokens_per_second_per_gpu']:,} | {v['mfu']:.0%} | {v['peak_reserved_gib']} |"
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
    text = report()
    if args.write:
        DOC.write_text(with_table(DOC.read_text(), text))
    print(text)


if __name__ == "__main__":
    main()
