"""BlackwellTrainingJob manifests the render tests use: the embedded default, examples/, bad/."""

from __future__ import annotations

from typing import Any

import yaml

from blackwell_operator.cli.manifest import read_manifest_text
from tests.support.k8s_schema import ROOT

EXAMPLES = ROOT / "examples"
BAD = ROOT / "tests" / "render" / "bad"


def btj_documents(text: str) -> list[dict[str, Any]]:
    """The BlackwellTrainingJob documents in a YAML text."""
    return [
        doc
        for doc in yaml.safe_load_all(text)
        if isinstance(doc, dict) and doc.get("kind") == "BlackwellTrainingJob"
    ]


def good_manifests() -> dict[str, dict[str, Any]]:
    """id -> manifest: the embedded default and every BTJ under examples/ (written by another helper)."""
    found = {"embedded-default": btj_documents(read_manifest_text(None)[0])[0]}
    for path in sorted(EXAMPLES.rglob("*.yaml")) if EXAMPLES.is_dir() else []:
        for index, doc in enumerate(btj_documents(path.read_text())):
            found[f"{path.relative_to(ROOT)}#{index}"] = doc
    return found


def bad_manifests() -> dict[str, tuple[dict[str, Any] | None, str, bool]]:
    """id -> (manifest, expected error text, whether the pydantic models also reject it)."""
    cases = {}
    for path in sorted(BAD.glob("*.yaml")):
        text = path.read_text()
        header = dict(
            line[2:].split(": ", 1) for line in text.splitlines() if line.startswith("# ") and ": " in line
        )
        docs = [doc for doc in yaml.safe_load_all(text) if doc is not None]
        cases[path.stem] = (docs[0], header["expect"], header["models"].startswith("reject"))
    return cases
