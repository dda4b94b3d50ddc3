"""The Argo CD health check (the chart's files/btj-health.lua) run by a real Lua 5.1 interpreter.

Argo CD runs health checks in gopher-lua (Lua 5.1) with the standard library off unless useOpenLibs is
set, so the script runs here in Lua 5.1 with only Lua's base functions visible, `obj` as a global.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

lupa = pytest.importorskip(
    "lupa.lua51",
    reason="lupa (Lua 5.1, the dev extra) runs the Lua health check: bash scripts/bootstrap.sh --all",
)

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "helm" / "btj-operator" / "files" / "btj-health.lua"  # the one source
FIXTURES = Path(__file__).parent / "argocd"
CASES = yaml.safe_load((FIXTURES / "health_test.yaml").read_text())["tests"]
# Lua base library only: what a sandbox without useOpenLibs offers.
_SANDBOX = "ipairs pairs next type tostring tonumber select error assert unpack"


def run_health_check(obj: dict[str, Any]) -> dict[str, str]:
    """Evaluate the script with `obj` bound, in a sandboxed Lua 5.1 environment."""
    runtime = lupa.LuaRuntime(unpack_returned_tuples=True)
    env = runtime.table_from({name: runtime.globals()[name] for name in _SANDBOX.split()})
    env["obj"] = runtime.table_from(obj, recursive=True)
    chunk = runtime.globals().loadstring(SCRIPT.read_text(), "btj-health")
    runtime.globals().setfenv(chunk, env)
    result = chunk()
    return {"status": result["status"], "message": result["message"]}


@pytest.mark.parametrize("case", CASES, ids=[Path(c["inputPath"]).stem for c in CASES])
def test_health_of_fixture(case: dict[str, Any]) -> None:
    obj = yaml.safe_load((FIXTURES / case["inputPath"]).read_text())
    assert run_health_check(obj) == case["healthStatus"]


def test_every_health_status_is_covered() -> None:
    assert {c["healthStatus"]["status"] for c in CASES} == {"Healthy", "Progressing", "Degraded", "Suspended"}


def test_the_script_needs_no_standard_library() -> None:
    # os/io/table/math would be nil in Argo CD without useOpenLibs; the sandbox above has none of them.
    source = SCRIPT.read_text()
    for library in ("os.", "io.", "require", "table.", "math."):
        assert library not in source


@pytest.mark.integration
async def test_health_of_live_operator_status(cluster: Any) -> None:
    """The check over what the real operator writes, not only over hand-made fixtures."""
    from tests.operator.harness import btj, running_operator, wait_for

    def health(name: str) -> dict[str, str]:
        return run_health_check(cluster.btj(name))

    async with running_operator(cluster):
        await cluster.apply(btj("live", queueName="q"))
        await cluster.apply(btj("nope", model={"preset": "gpt-7"}))
        await wait_for(lambda: cluster.job("live"), what="the PyTorchJob")
        await wait_for(lambda: health("nope")["status"] == "Degraded", what="Degraded for an invalid spec")
        steps = [
            (
                {"type": "Suspended", "status": "True", "reason": "PyTorchJobSuspended", "message": "held"},
                "Suspended",
            ),
            (
                {"type": "Running", "status": "True", "reason": "PyTorchJobRunning", "message": "go"},
                "Progressing",
            ),
            (
                {"type": "Succeeded", "status": "True", "reason": "PyTorchJobSucceeded", "message": "done"},
                "Healthy",
            ),
        ]
        for condition, expected in steps:
            await cluster.set_child_status("live", {"conditions": [condition]})
            await wait_for(lambda expected=expected: health("live")["status"] == expected, what=expected)
    assert health("live")["message"] == "done"
