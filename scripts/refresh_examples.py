"""Rewrite each example's `# PLANNER:` comment from what the planner says now (`--check`: only report drift).

The examples tell a reader what the planner chooses for them; a planner or calibration change makes those
comments stale, so tests/helm/test_examples.py compares them with `planner_comment` and fails on drift.

    python scripts/refresh_examples.py            # rewrite the comments in examples/*.yaml
    python scripts/refresh_examples.py --check    # exit 1 and name the stale examples
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

from blackwell_operator.cli.manifest import load_manifest
from blackwell_operator.planner import plan_job

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
MARK = "# PLANNER:"
CLOSING = "#   The numbers are predictions from the planner's models, not measurements."
WIDTH = 110
RUNNERS_UP = 2


def _bullet(text: str) -> list[str]:
    return textwrap.wrap(
        text, WIDTH, initial_indent="#   - ", subsequent_indent="#     ", break_on_hyphens=False
    )


def planner_comment(path: Path) -> list[str]:
    """The `# PLANNER:` block for one example, as the current planner and default calibration see it."""
    job = load_manifest(path)
    plan = plan_job(job.spec, job_name=job.metadata.name)
    relative = path.relative_to(ROOT).as_posix()
    lines = [f"{MARK} `btj plan {relative}` says (kept current by scripts/refresh_examples.py):"]
    for line in plan.explanation:
        lines += _bullet(line)
    for alt in plan.alternatives[:RUNNERS_UP]:
        c = alt.candidate
        recipe = f"{c.precision.value}/{c.precision_recipe.value}"
        lines += _bullet(
            f"runner-up: {recipe}, AC {c.activation_checkpointing.value}, mbs {c.micro_batch_size}, "
            f"{c.sharding.value} sharding, cp {c.context_parallel}: {alt.reason}"
        )
    return [*lines, CLOSING]


def current_comment(text: str) -> tuple[int, int]:
    """Line range [start, end) of the existing block (from the mark through the closing line)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(MARK))
    end = next(i for i in range(start, len(lines)) if lines[i] == CLOSING) + 1
    return start, end


def refreshed(path: Path, text: str | None = None) -> str:
    """The example's text (read from `path` unless given) with its block replaced by the current one."""
    text = path.read_text() if text is None else text
    lines = text.splitlines()
    start, end = current_comment(text)
    return "\n".join([*lines[:start], *planner_comment(path), *lines[end:]]) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="report stale examples, change nothing")
    args = parser.parse_args(argv)
    stale = []
    for path in sorted(EXAMPLES.glob("*.yaml")):
        text = path.read_text()
        if MARK not in text:
            continue
        new = refreshed(path, text)
        if new != text:
            stale.append(path.name)
            if not args.check:
                path.write_text(new)
    verb = "stale" if args.check else "refreshed"
    print(f"{verb}: {', '.join(stale) if stale else 'none'}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
