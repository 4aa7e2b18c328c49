"""Running one Slurm command with a deadline: its output, or why not, and nothing left
running behind it."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest

from gpuwatch.jobs.command import Commands, run_command
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


def test_a_command_blocks_no_signal_though_its_caller_does(tmp_path: Path) -> None:
    # GIVEN a caller thread blocking SIGTERM, SIGINT and SIGHUP (as the daemon's threads do)
    pids = tmp_path / "pid"
    command = script(tmp_path, f"echo $$ > {pids}; exec grep SigBlk /proc/self/status")
    answers: list[tuple[str | None, str | None]] = []

    def call() -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT, signal.SIGHUP})
        answers.append(run_command([command], ENV, 5.0, 1 << 16))

    caller = threading.Thread(target=call)
    caller.start()
    caller.join(30)
    # WHEN it runs a command THEN the command blocks nothing: SIGTERM stops it
    ((out, why),) = answers
    assert why is None and out is not None
    assert int(out.split()[1], 16) == 0


def test_closing_kills_a_command_under_way_at_once(tmp_path: Path) -> None:
    # GIVEN a command that hangs, with a child of its own, run by a `Commands`
    pids = tmp_path / "child.pid"
    command = script(tmp_path, f"sleep 60 & echo $! > {pids}; wait")
    commands = Commands()
    answers: list[tuple[str | None, str | None]] = []
    caller = threading.Thread(
        target=lambda: answers.append(commands.run([command], ENV, 60.0, 1 << 16))
    )
    caller.start()
    wait_until(lambda: pids.exists() and pids.read_text().strip(), "the command to start")
    # WHEN the commands are closed (the daemon stops)
    commands.close()
    caller.join(10)
    # THEN it ends at once, saying so, its child killed; and nothing more is started
    assert answers == [(None, "closed")]
    wait_until(lambda: gone(pids), "the command's child to be killed")
    assert commands.run(["true"], ENV, 5.0, 1024) == (None, "closed")
