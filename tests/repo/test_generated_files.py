"""scripts/generate.sh: the committed generated files are current, and `--check` names a stale one."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
CRD = "training.blackwell.dev_blackwelltrainingjobs.yaml"


def _generate() -> ModuleType:
    spec = importlib.util.spec_from_file_location("generate", ROOT / "scripts" / "generate.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def generate() -> ModuleType:
    """scripts/generate.py with its generators computed once for this module (the golden plans alone take
    seconds). Each generated text is a function of the code and of the file's own text only, so every
    `main()` below checks or writes exactly what a fresh computation would; `.ci/run` and
    test_the_shell_entry_point_fails_on_a_stale_file compute them afresh."""
    module = _generate()
    computed = module.generators()
    module.generators = lambda: computed
    return module


@pytest.fixture
def tree(tmp_path: Path, generate: ModuleType) -> Path:
    """A copy of every generated file, as committed, under a fresh root."""
    for gen in generate.generators():
        target = tmp_path / gen.path
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ROOT / gen.path, target)
    return tmp_path


def test_the_committed_generated_files_are_current(generate: ModuleType) -> None:
    assert generate.main(["--check"]) == 0, "run scripts/generate.sh and commit the result"


def test_every_generator_is_covered(generate: ModuleType) -> None:
    paths = {gen.path for gen in generate.generators()}
    assert {f"crds/{CRD}", f"helm/btj-operator/crds/{CRD}", "tests/planner/golden/plans.json"} <= paths
    assert {"docs/planner.md", "examples/argocd/argocd-cm-health.yaml", "examples/dry-run.yaml"} <= paths
    assert len(paths) == len(generate.generators()), "each file has one generator"


@pytest.mark.parametrize(
    ("path", "old", "new"),
    [
        (f"helm/btj-operator/crds/{CRD}", "BlackwellTrainingJob", "BlackwellTrainingJobs"),
        ("examples/dry-run.yaml", "says (kept current", "said (kept current"),
        ("examples/argocd/argocd-cm-health.yaml", "Waiting for the operator", "Waiting"),
    ],
)
def test_check_names_the_stale_file_and_changes_nothing(
    path: str, old: str, new: str, tree: Path, generate: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    stale = (tree / path).read_text().replace(old, new, 1)
    assert stale != (ROOT / path).read_text()
    (tree / path).write_text(stale)
    assert generate.main(["--check", "--root", str(tree)]) == 1
    err = capsys.readouterr().err
    assert f"stale: {path} (run scripts/generate.sh" in err
    named = {line.split()[1] for line in err.splitlines() if line.startswith("stale: ")}
    assert named == {path}
    assert (tree / path).read_text() == stale


def test_stale_golden_plans_are_named(
    tree: Path, generate: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    golden = tree / "tests" / "planner" / "golden" / "plans.json"
    golden.write_text(golden.read_text().replace('"mbs": 16', '"mbs": 15', 1))
    assert generate.main(["--check", "--root", str(tree)]) == 1
    assert "stale: tests/planner/golden/plans.json" in capsys.readouterr().err


def test_a_stale_doc_table_is_named(
    tree: Path, generate: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = tree / "docs" / "planner.md"
    doc.write_text(
        doc.read_text().replace("| llama3.2-1b/p6-b200/n1/s4096 |", "| llama3.2-1b/p6-b200/n1/s4096 | x |")
    )
    assert generate.main(["--check", "--root", str(tree)]) == 1
    assert "stale: docs/planner.md" in capsys.readouterr().err


def test_a_missing_generated_file_is_stale(tree: Path, generate: ModuleType) -> None:
    (tree / "crds" / CRD).unlink()
    assert generate.main(["--check", "--root", str(tree)]) == 1


def test_writing_makes_the_stale_file_current_again(tree: Path, generate: ModuleType) -> None:
    original = (ROOT / "examples" / "dry-run.yaml").read_text()
    (tree / "examples" / "dry-run.yaml").write_text(original.replace("# PLANNER:", "# PLANNER: old", 1))
    (tree / "crds" / CRD).write_text("stale\n")
    assert generate.main(["--root", str(tree)]) == 0
    assert (tree / "examples" / "dry-run.yaml").read_text() == original
    assert (tree / "crds" / CRD).read_bytes() == (ROOT / "crds" / CRD).read_bytes()
    assert generate.main(["--check", "--root", str(tree)]) == 0


def test_the_shell_entry_point_fails_on_a_stale_file(tree: Path) -> None:
    (tree / "helm" / "btj-operator" / "crds" / CRD).write_text("stale\n")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(
        ["bash", str(ROOT / "scripts" / "generate.sh"), "--check", "--root", str(tree)],
        capture_output=True, text=True, env=env, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"stale: helm/btj-operator/crds/{CRD}" in result.stderr


def test_ci_runs_the_check() -> None:
    assert "bash scripts/generate.sh --check" in (ROOT / ".ci" / "run").read_text()
