"""scripts/fetch_crd_schemas.py fetches every CRD the render tests read, pinned to the copies CI uses."""

from __future__ import annotations

import hashlib
import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

from tests.support.k8s_schema import ROOT, SCHEMA_MISSING, SHARED_SCHEMAS


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "fetch_crd_schemas", ROOT / "scripts" / "fetch_crd_schemas.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_schema_a_test_reads_is_fetched() -> None:
    read = set()
    for test in [*(ROOT / "tests" / "render").glob("*.py"), *(ROOT / "tests" / "support").glob("*.py")]:
        read |= set(re.findall(r'SHARED_SCHEMAS\s*/\s*"([^"]+)"', test.read_text()))
    assert len(read) >= 5, read  # both PyTorchJob CRDs, TrainJob, TrainingRuntime, the upstream runtime
    assert read <= set(_script().SCHEMAS), read - set(_script().SCHEMAS)


def test_the_pinned_digests_are_those_of_the_copies_the_tests_read() -> None:
    schemas = _script().SCHEMAS
    present = [name for name in schemas if (SHARED_SCHEMAS / name).is_file()]
    if not present:
        pytest.skip(f"{SHARED_SCHEMAS} {SCHEMA_MISSING}")
    for name in present:
        assert hashlib.sha256((SHARED_SCHEMAS / name).read_bytes()).hexdigest() == schemas[name][1], name


def test_a_skip_names_the_command_that_makes_the_check_run() -> None:
    assert "python3 scripts/fetch_crd_schemas.py" in SCHEMA_MISSING


def test_a_download_that_differs_is_not_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = _script()

    class Answer:
        def __enter__(self) -> Answer:
            return self

        def __exit__(self, *args: object) -> None:
            return None

        def read(self) -> bytes:
            return b"apiVersion: v1\nkind: Other\n"

    monkeypatch.setattr(script.urllib.request, "urlopen", lambda url, timeout: Answer())
    problems = script.fetch(tmp_path)
    assert len(problems) == len(script.SCHEMAS)
    assert all("differs from the copy CI validates against" in line for line in problems)
    assert list(tmp_path.iterdir()) == []
