"""requirements.lock pins every package the project asks for, inside pyproject.toml's ranges."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]


def _locked() -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        match = re.match(r"^([A-Za-z0-9_.\-]+)==(\S+)", line)
        if match:
            pins[canonicalize_name(match[1])] = Version(match[2])
    return pins


def _asked_for() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        lines.extend(extra)
    return [Requirement(line) for line in lines]


def test_every_requirement_is_locked_inside_its_range() -> None:
    pins = _locked()
    outside = []
    for requirement in _asked_for():
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement.name} is not in requirements.lock: run bash scripts/lock.sh"
        if not requirement.specifier.contains(pins[name], prereleases=True):
            outside.append(f"{requirement} but locked {pins[name]}")
    assert not outside, f"requirements.lock is outside pyproject's ranges: {outside}; run scripts/lock.sh"


def test_the_lock_takes_the_cpu_torch_and_no_cuda_packages() -> None:
    pins = _locked()
    assert pins[canonicalize_name("torch")] == Version("2.13.0+cpu")
    assert not [name for name in pins if name.startswith("nvidia-") or name == "triton"]


def test_bootstrap_installs_through_the_lock() -> None:
    bootstrap = (ROOT / "scripts" / "bootstrap.sh").read_text()
    assert "LOCK=(-c requirements.lock)" in bootstrap
    assert '"${LOCK[@]}" "$@"' in bootstrap
