"""Running one Slurm command with a deadline: its output, or why not, and nothing left
running behind it."""

from __future__ import annotations

import os
import signal
import threading
import tracemalloc
from pathlib import Path

import pytest

from gpuwatch.jobs.command import Answer, Commands, run_command
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
        ("echo hello; echo there >&2", Answer("hello\n", None, "there")),
        (
            "echo half; printf '\\n  no \\033[31mway\\n' >&2; exit 3",
            Answer(None, "failed", "no ?[31mway"),
        ),
    ],
    ids=["answers", "fails-saying-why"],
)
def test_the_output_or_why_none(tmp_path: Path, body: str, answer: Answer) -> None:
    assert run_command([script(tmp_path, body)], ENV, 5.0, 1 << 20) == answer


def test_a_command_not_on_the_commands_path_is_absent(tmp_path: Path) -> None:
    # GIVEN a PATH (the command's own environment's) without it
    env = {"PATH": str(tmp_path)}
    # THEN it is absent, whatever this process's PATH holds
    assert run_command(["sh", "-c", "echo no"], env, 5.0, 1 << 20) == Answer(None, "absent")


def test_the_commands_environment_is_its_own(tmp_path: Path) -> None:
    env = {**ENV, "SLURM_CONF": "/x/slurm.conf"}
    answer = run_command([script(tmp_path, 'echo "$SLURM_CONF"')], env, 5.0, 1024)
    assert answer.out == "/x/slurm.conf\n"


@pytest.mark.parametrize(
    ("body", "why"),
    [
        ("sleep 60 & echo $! > {pids}; wait", "timeout"),
        ("sleep 60 & echo $! > {pids}; yes", "too large"),
        ("setsid sleep 60 & echo $! > {pids}; yes", "too large"),
        ("setsid sleep 60 & echo $! > {pids}; exec sleep 60", "timeout"),
    ],
    ids=["hung", "floods", "floods-with-a-child-of-its-own-session", "hangs-likewise"],
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
    assert (answer.out, answer.why) == (None, why)
    wait_until(lambda: gone(pids), "the command's child to be killed")


def test_a_command_blocks_no_signal_though_its_caller_does(tmp_path: Path) -> None:
    # GIVEN a caller thread blocking SIGTERM, SIGINT and SIGHUP (as the daemon's threads do)
    pids = tmp_path / "pid"
    command = script(tmp_path, f"echo $$ > {pids}; exec grep SigBlk /proc/self/status")
    answers: list[Answer] = []

    def call() -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT, signal.SIGHUP})
        answers.append(run_command([command], ENV, 5.0, 1 << 16))

    caller = threading.Thread(target=call)
    caller.start()
    caller.join(30)
    # WHEN it runs a command THEN the command blocks nothing: SIGTERM stops it
    (answer,) = answers
    assert answer.why is None and answer.out is not None
    assert int(answer.out.split()[1], 16) == 0


def test_closing_kills_a_command_under_way_at_once(tmp_path: Path) -> None:
    # GIVEN a command that hangs, with a child of its own, run by a `Commands`
    pids = tmp_path / "child.pid"
    command = script(tmp_path, f"sleep 60 & echo $! > {pids}; wait")
    commands = Commands()
    answers: list[Answer] = []
    caller = threading.Thread(
        target=lambda: answers.append(commands.run([command], ENV, 60.0, 1 << 16))
    )
    caller.start()
    wait_until(lambda: pids.exists() and pids.read_text().strip(), "the command to start")
    # WHEN the commands are closed (the daemon stops)
    commands.close()
    caller.join(10)
    # THEN it ends at once, saying so, its child killed; and nothing more is started
    assert answers == [Answer(None, "closed")]
    wait_until(lambda: gone(pids), "the command's child to be killed")
    assert commands.run(["true"], ENV, 5.0, 1024) == Answer(None, "closed")


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(
            "setsid sleep 60 & echo $! > {pids}; echo hello", id="setsid-holding-the-pipe"
        ),
        pytest.param("sleep 60 > /dev/null & echo $! > {pids}; echo hello", id="in-its-group"),
    ],
)
def test_a_command_that_answers_leaves_no_child_behind(tmp_path: Path, body: str) -> None:
    # GIVEN a wrapper that answers, leaving a child running: in a session of its own and
    # holding the output pipe (a shell's `setsid cmd &`), or in its group with its output
    # elsewhere
    pids = tmp_path / "child.pid"
    command = script(tmp_path, body.format(pids=pids))
    # WHEN it is run THEN its answer is taken once it exits, and the child is killed
    assert run_command([command], ENV, 30.0, 1 << 16).out == "hello\n"
    wait_until(lambda: gone(pids), "the command's child to be killed")


def test_output_past_the_cap_is_never_held_beyond_it(tmp_path: Path) -> None:
    # GIVEN a command printing 64 MiB
    command = script(tmp_path, "head -c 67108864 /dev/zero")
    cap = 1 << 20
    # WHEN read with a cap of 1 MiB
    tracemalloc.start()
    try:
        answer = run_command([command], ENV, 60.0, cap)
        _, peak_bytes = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # THEN it is refused having held about the cap (a chunk more), never the whole
    assert answer == Answer(None, "too large")
    assert peak_bytes < 4 * cap
