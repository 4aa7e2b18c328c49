"""README.md is the front door: it must say what the code does."""

from __future__ import annotations

import re
from pathlib import Path

from gpuwatch.cli.app import _COMMANDS
from gpuwatch.cli.exit_codes import ExitCode

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_ci_runs_the_readme_test_command() -> None:
    quick_start = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    commands = re.findall(r"```sh\n(.*?)\n```", quick_start, re.DOTALL)
    assert len(commands) == 2, "the quick start has two commands"
    test_command = commands[1].strip()
    assert "torch==2.13.0" in test_command
    assert test_command in (ROOT / ".ci" / "run").read_text().splitlines()


def test_every_command_has_a_readme_section() -> None:
    for name in _COMMANDS:
        assert f"### `gpuwatch {name}" in README, f"README lacks a section for {name}"


def test_exit_code_table_matches_the_code() -> None:
    table = README.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    documented = {int(code) for code in re.findall(r"^\| (\d+) \|", table, re.MULTILINE)}
    assert documented == {int(code) for code in ExitCode}
