"""Running one Slurm command with a deadline: its output, or why not, and nothing left
running behind it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuwatch.jobs.command import run_command
from tests.helpers.wait import wait_until


def script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "command"
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


def gone(pid_file: Path) -> bool:
    pid = int(pid_file.read_text())
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state == "Z"


ENV = {"PATH": os.environ["PATH"]}


@pytest.mark.parametrize(
    ("body", "answer"),
    [
        ("echo hello; echo there >&2", ("hello\n", None)),
        ("echo half; exit 3", (None, "failed")),
    ],
    ids=["answers", "fails"],
)
def test_the_output_or_why_none(
    tmp_path: Path, body: str, answer: tuple[str | None, str | None]
) -> None:
    assert run_command([script(tmp_path, body)], ENV, 5.0, 1 << 20) == answer


def test_a_command_not_on_the_commands_path_is_absent(tmp_path: Path) -> None:
    # GIVEN a PATH (the command's own environment's) without it
    env = {"PATH": str(tmp_path)}
    # THEN it is absent, whatever this process's PATH holds
    assert run_command(["sh", "-c", "echo no"], env, 5.0, 1 << 20) == (None, "absent")


def test_the_commands_environment_is_its_own(tmp_path: Path) -> None:
    env = {**ENV, "SLURM_CONF": "/x/slurm.conf"}
    assert run_command([script(tmp_path, 'echo "$SLURM_CONF"')], env, 5.0, 1024) == (
        "/x/slurm.conf\n",
        None,
    )


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ("sleep 60 & echo $! > {pids}; wait", "timeout"),
        ("sleep 60 & echo $! > {pids}; yes", "failed"),
    ],
    ids=["hung", "floods"],
)
def test_a_command_past_its_deadline_or_limit_is_killed_with_its_children(
    tmp_path: Path, body: str, why: str
) -> None:
    # GIVEN a command that hangs, or prints without end, with a child of its own
    pids = tmp_path / "child.pid"
    command = script(tmp_path, body.format(pids=pids))
    # WHEN it is run with a deadline and a limit on its output
    answer = run_command([command], ENV, 0.5, 1 << 16)
    # THEN it answers nothing, saying why, and its child is not left running
    assert answer == (None, why)
    wait_until(lambda: gone(pids), "the command's child to be killed")
