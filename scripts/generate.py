"""Regenerate every generated file in the repository, or (`--check`) name each committed one that is stale.

Run it through scripts/generate.sh, which puts the repository root on the import path (the golden plans
are computed by tests/support/golden_plans.py). Each generator maps a file's committed text to the text
it should have, so `--check` compares without writing and `--root` can check another copy of the tree.
`--calibration` also reruns docs/calibration/regenerate.sh (minutes of fitting; its reports reproduce
within the tolerances docs/calibration/README.md states, not byte for byte, so `--check` never runs it).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import NamedTuple

import yaml

from blackwell_operator.calibrate.measured import build_coverage
from blackwell_operator.calibration.measured import MEASURED_FOLDER
from blackwell_operator.render.crd import crd_yaml

ROOT = Path(__file__).resolve().parents[1]
CRD = "training.blackwell.dev_blackwelltrainingjobs.yaml"
LUA = "helm/btj-operator/files/btj-health.lua"
ARGOCD_SNIPPET = "examples/argocd/argocd-cm-health.yaml"
HEALTH_KEY = "resource.customizations.health.training.blackwell.dev_BlackwellTrainingJob"


class Generated(NamedTuple):
    """One generated file: its path from the root, and its text as a function of its committed text."""

    path: str
    make: Callable[[str], str]


def _script(relative: str) -> ModuleType:
    """A repository script (benchmarks/, scripts/) as a module, without putting its folder on the path."""
    name = Path(relative).stem
    spec = importlib.util.spec_from_file_location(name, ROOT / relative)
    assert spec and spec.loader, relative
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _with_lua(snippet: str) -> str:
    """The Argo CD argocd-cm snippet with its health-check block scalar replaced by the chart's Lua file."""
    lines = snippet.splitlines()
    key = next(i for i, line in enumerate(lines) if line.strip() == f"{HEALTH_KEY}: |")
    indent = len(lines[key]) - len(lines[key].lstrip()) + 2
    end = key + 1
    while end < len(lines) and (not lines[end].strip() or lines[end].startswith(" " * indent)):
        end += 1
    lua = [f"{' ' * indent}{line}" if line else "" for line in (ROOT / LUA).read_text().splitlines()]
    return "\n".join([*lines[: key + 1], *lua, *lines[end:]]) + "\n"


def generators() -> list[Generated]:
    """Every generated file, in the order they must be written (the golden table reads the golden plans)."""
    refresh = _script("scripts/refresh_examples.py")
    golden_report = _script("benchmarks/golden_report.py")
    grid_report = _script("benchmarks/reference_grid_report.py")
    from tests.support import golden_plans

    crd = crd_yaml()
    out = [
        Generated(f"crds/{CRD}", lambda _: crd),
        # helm reads nothing outside the chart, so the chart carries a byte-identical copy.
        Generated(f"helm/btj-operator/crds/{CRD}", lambda _: crd),
        Generated(ARGOCD_SNIPPET, _with_lua),
    ]
    # What each trainer ran on a GPU here, from the records: the planner's measured/modelled provenance.
    for trainer, coverage in build_coverage(ROOT).items():
        text = coverage.to_json()
        path = f"operator/src/blackwell_operator/calibration/{MEASURED_FOLDER}/{trainer}.json"
        out.append(Generated(path, lambda _, t=text: t))
    for path in sorted((ROOT / "examples").glob("*.yaml")):
        if refresh.MARK in path.read_text():
            out.append(
                Generated(path.relative_to(ROOT).as_posix(), lambda text, p=path: refresh.refreshed(p, text))
            )
    golden = golden_plans.golden_text()
    out.append(Generated(golden_plans.GOLDEN.relative_to(ROOT).as_posix(), lambda _: golden))
    golden_table = golden_report.report(json.loads(golden))
    grid = grid_report.report(yaml.safe_load(grid_report.GRID.read_text()))
    out.append(
        Generated(
            "docs/planner.md",
            # The golden table shows the golden plans as they are now, like the file above.
            lambda doc: grid_report.with_table(golden_report.with_table(doc, golden_table), grid),
        )
    )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 naming each stale file")
    parser.add_argument(
        "--calibration", action="store_true", help="also rerun docs/calibration/regenerate.sh"
    )
    parser.add_argument(
        "--root", type=Path, default=ROOT, help="the tree to check or write (default: this one)"
    )
    args = parser.parse_args(argv)
    stale = []
    for gen in generators():
        target = args.root / gen.path
        old = target.read_text() if target.exists() else ""
        new = gen.make(old)
        if new != old:
            stale.append(gen.path)
            if not args.check:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(new)
    if args.check:
        for path in stale:
            print(f"stale: {path} (run scripts/generate.sh and commit the result)", file=sys.stderr)
        if not stale:
            print("generated files: all current")
        return 1 if stale else 0
    print(f"regenerated: {', '.join(stale) if stale else 'nothing changed'}")
    if args.calibration:
        return subprocess.call(["bash", str(ROOT / "docs" / "calibration" / "regenerate.sh")], cwd=args.root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
