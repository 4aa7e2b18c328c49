"""`gpuwatch status` names its columns in a terminal, as nvidia-smi and nvitop do: one line,
within the terminal's width; not in JSON, and not when piped unless asked (`--header`)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess

import pytest

from gpuwatch.cli.exit_codes import ExitCode
from tests.helpers.tmux import GPUWATCH, Tmux

NAMES = "GPU name                    memory              util   temp   power / limit"
"""The line over a simulated node's GPUs, 80 columns wide."""

in_a_terminal = pytest.mark.skipif(
    shutil.which("tmux") is None and not os.environ.get("GPUWATCH_REQUIRE_TMUX"),
    reason="needs tmux (apt-get install tmux)",
)


def status(*args: str) -> subprocess.CompletedProcess[str]:
    """The installed `gpuwatch status ARGS`, its output piped."""
    return subprocess.run(
        [GPUWATCH, "status", "--sim", "4", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "COLUMNS": "80"},
    )


def screen_of(*args: str) -> list[str]:
    """What the installed `gpuwatch status ARGS` shows in an 80x24 terminal."""
    terminal = Tmux(shlex.join([GPUWATCH, "status", "--sim", "4", *args]), (80, 24))
    try:
        return terminal.wait_for("EXIT=").splitlines()
    finally:
        terminal.close()


@in_a_terminal
def test_in_a_terminal_one_line_names_the_columns() -> None:
    lines = screen_of()
    # THEN the line under the host's names each column of the GPU lines below it
    assert lines[1] == NAMES
    assert lines[2].startswith("[0] NVIDIA H100 80GB HBM3 | ")
    assert lines[1].index("util") + len("util") == lines[2].index("%") + 1
    assert max(len(line) for line in lines) <= 80


@in_a_terminal
@pytest.mark.parametrize("args", [["--no-header"], ["--json"]], ids=["no-header", "json"])
def test_in_a_terminal_no_header_and_json_name_no_columns(args: list[str]) -> None:
    assert not any(line.startswith("GPU name") for line in screen_of(*args))


def test_piped_the_table_has_no_column_names_unless_asked() -> None:
    plain, asked = status(), status("--header")
    assert plain.returncode == asked.returncode == 0, plain.stderr + asked.stderr
    assert plain.stdout.splitlines()[1].startswith("[0] ")
    assert asked.stdout.splitlines()[1] == NAMES
    assert len(asked.stdout.splitlines()) == len(plain.stdout.splitlines()) + 1


def test_json_with_header_is_refused_in_one_line() -> None:
    result = status("--json", "--header")
    assert result.returncode == ExitCode.USAGE
    assert result.stderr.startswith("gpuwatch: error: --header names the table's columns")
    assert result.stderr.count("\n") == 1
