"""Property: on any input, `btj plan` and `btj render` agree on accept/reject, quickly, never a traceback."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from blackwell_operator.cli import _register_commands, app
from tests.admission.test_verdict_property import manifests

_register_commands()
runner = CliRunner()
SETTINGS = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def _verdicts(path: Path) -> dict[str, int]:
    codes = {}
    for command in ("plan", "render"):
        started = time.process_time()
        result = runner.invoke(app, [command, str(path), "-o", "json"])
        assert time.process_time() - started < 10, f"{command} took too long"
        assert result.exit_code in (0, 2), (command, result.exception, result.output[-2000:])
        assert "Traceback" not in result.output
        if result.exit_code:
            assert result.stderr.startswith("error: "), result.stderr[:500]
        codes[command] = result.exit_code
    return codes


@SETTINGS
@given(manifests())
def test_plan_and_render_agree_on_generated_manifests(tmp_path: Path, manifest: dict[str, Any]) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest))
    codes = _verdicts(path)
    assert codes["plan"] == codes["render"], codes


@SETTINGS
@given(st.binary(max_size=300) | st.text(max_size=300).map(str.encode))
def test_plan_and_render_agree_on_any_bytes(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "job.yaml"
    path.write_bytes(b"apiVersion: training.blackwell.dev/v1alpha1\nkind: BlackwellTrainingJob\n" + data)
    codes = _verdicts(path)
    assert codes["plan"] == codes["render"], codes
