"""The two Dockerfiles stay pinned and agree with the chart and pyproject.toml (static checks: no
Docker daemon is available here to build them)."""

from __future__ import annotations

import re
import tomllib

import yaml

from tests.support.helm import CHART, ROOT

OPERATOR = (ROOT / "operator" / "Dockerfile").read_text()
TRAINER = (ROOT / "trainer_image" / "Dockerfile").read_text()
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def arg(text: str, name: str) -> str:
    match = re.search(rf"^ARG {name}=(\S+)$", text, flags=re.MULTILINE)
    assert match, f"ARG {name} missing"
    return match.group(1)


def test_operator_image_is_pinned_non_root_and_runs_btj() -> None:
    base = arg(OPERATOR, "PYTHON_IMAGE")
    assert re.fullmatch(r"python:3\.\d+\.\d+-slim-\w+", base), base
    assert 'pip install ".[operator]"' in OPERATOR
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    user = f"{values['podSecurityContext']['runAsUser']}:{values['podSecurityContext']['runAsGroup']}"
    assert re.search(rf"^USER {user}$", OPERATOR, flags=re.MULTILINE), "USER must match the chart's runAsUser"
    assert 'ENTRYPOINT ["btj", "run"]' in OPERATOR
    assert "EXPOSE 8080" in OPERATOR


def test_trainer_image_is_pinned_and_has_no_entrypoint() -> None:
    assert re.fullmatch(r"nvcr\.io/nvidia/pytorch:\d\d\.\d\d-py3", arg(TRAINER, "BASE_IMAGE"))
    assert re.fullmatch(r"\d+\.\d+\.\d+", arg(TRAINER, "EFA_INSTALLER_VERSION"))
    assert re.fullmatch(r"\d+\.\d+\.\d+", arg(TRAINER, "AWS_OFI_NCCL_VERSION"))
    assert "ENTRYPOINT" not in re.sub(r"#.*", "", TRAINER)
    assert "pip install --no-deps ." in TRAINER  # never let pip replace the base image's torch
    assert "EXPOSE 9400" in TRAINER
    assert "latest" not in re.sub(r"#.*", "", TRAINER + OPERATOR)


def test_trainer_image_runs_as_the_non_root_user_the_pods_run_as() -> None:
    """The pods' runAsUser/runAsGroup (render/pod.py) are the image's USER, numeric, and not root."""
    from blackwell_operator.render.pod import TRAINER_GID, TRAINER_UID

    assert int(arg(TRAINER, "TRAINER_UID")) == TRAINER_UID > 0
    assert int(arg(TRAINER, "TRAINER_GID")) == TRAINER_GID > 0
    users = re.findall(r"^USER (\S+)$", TRAINER, flags=re.MULTILINE)
    assert users == ["${TRAINER_UID}:${TRAINER_GID}"], users
    # The user is the last word: nothing after it runs as root again.
    assert TRAINER.index("USER ") > TRAINER.rindex("RUN ")


def test_trainer_image_installs_the_runtime_dependencies_pyproject_declares() -> None:
    # torch, numpy and torchao are the image's own (kept from the base, or pinned by the Dockerfile).
    installed = {
        spec
        for spec in re.findall(r'"([A-Za-z0-9_.-]+[<>=!~][^"]*)"', TRAINER)
        if not spec.startswith(("torch", "numpy"))
    }
    declared = set(PYPROJECT["project"]["dependencies"])
    declared |= {
        d
        for d in PYPROJECT["project"]["optional-dependencies"]["trainer"]
        if not d.startswith(("torch", "numpy"))
    }
    assert installed == declared


def test_build_contexts_send_what_the_images_copy() -> None:
    for folder in ("operator", "trainer_image"):
        ignore = (ROOT / folder / "Dockerfile.dockerignore").read_text().splitlines()
        assert ignore[1:2] == ["*"] or "*" in ignore
        for needed in ("!pyproject.toml", "!README.md", "!operator/src/", "!trainer_image/src/"):
            assert needed in ignore, f"{folder}/Dockerfile.dockerignore must let {needed[1:]} through"
