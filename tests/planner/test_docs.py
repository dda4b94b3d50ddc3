"""docs/planner.md carries the generated reference-grid and golden tables; keep them current."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "planner.md").read_text()


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _block(start: str, end: str) -> str:
    return DOC.split(start, 1)[1].split(end, 1)[0].strip()


def test_reference_grid_table_is_current() -> None:
    report = _script("reference_grid_report")
    grid = yaml.safe_load(report.GRID.read_text())
    assert _block(report.START, report.END) == report.report(grid).strip(), (
        "run: python benchmarks/reference_grid_report.py --write"
    )


def test_golden_table_is_current() -> None:
    report = _script("golden_report")
    assert _block(report.START, report.END) == report.report().strip(), (
        "run: python benchmarks/golden_report.py --write"
    )
