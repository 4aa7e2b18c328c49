"""Random scenario files never crash status, pick or the daemon's sampling, nor break JSON."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from tests.helpers.scenario_strategies import abuse, scenario_texts

pytestmark = pytest.mark.slow


@given(scenario_texts())
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_no_scenario_file_crashes_a_command_or_breaks_json(text: bytes) -> None:
    # GIVEN any scenario file, however wrong
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "node.toml"
        path.write_bytes(text)
        # WHEN status, pick and the daemon's sampling read it
        problems = [f"{name}: {problem}" for name, problem in abuse(path) if problem]
    # THEN each answers (or refuses in one line), and every JSON output is strict JSON
    assert problems == []
