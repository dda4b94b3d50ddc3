"""Kopf's private modules (`kopf._cogs`) are imported by one module only, handlers/kopf_private.py (issue
34): a Kopf release that renames them breaks one import, not the operator and its tests here and there."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HOME = "operator/src/blackwell_operator/handlers/kopf_private.py"
SEARCHED = ["operator", "trainer_image", "tests", "scripts", "benchmarks"]
PRIVATE = "kopf._cogs"


def private_imports(source: str) -> list[str]:
    """The `kopf._cogs` modules `source` imports (a function-level import too)."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found += [name for name in names if name == PRIVATE or name.startswith(PRIVATE + ".")][:1]
    return found


def test_only_one_module_imports_kopfs_private_modules() -> None:
    importers = sorted(
        str(path.relative_to(ROOT))
        for folder in SEARCHED
        for path in (ROOT / folder).rglob("*.py")
        if private_imports(path.read_text())
    )
    assert importers == [HOME], f"import Kopf's private modules through {HOME}, not in {importers}"


def test_the_check_sees_each_form_of_import() -> None:
    assert private_imports("from kopf._cogs.structs import patches") == ["kopf._cogs.structs"]
    assert private_imports("def f():\n    import kopf._cogs.clients.errors") == ["kopf._cogs.clients.errors"]
    assert private_imports("from kopf import _cogs") == ["kopf._cogs"]
    assert private_imports("import kopf\nfrom kopf.testing import KopfRunner") == []
