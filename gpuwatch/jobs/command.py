"""Runs one Slurm command with a deadline: its output, or why there is none.

`posix_spawn`, a pipe and `select` rather than `subprocess`: a one-shot `gpuwatch status` on
a Slurm node runs one command, and `subprocess` would load `selectors` and `locale` with it
(about 7 ms of a two-core node's start-up). The command runs in a session of its own, so
that at its deadline it is killed with everything it started, and is always reaped.
"""

from __future__ import annotations

import contextlib
import os
import select
import time
from collections.abc import Mapping, Sequence

_CHUNK_BYTES = 1 << 16
_REAP_AFTER_KILL_S = 1.0
_SIGKILL = 9
"""POSIX's number, not `signal.SIGKILL`: importing `signal` (an enum) on the reader's thread,
while the main thread imports too, could hand either a module half made."""


def run_command(
    argv: Sequence[str], env: Mapping[str, str], timeout_s: float, max_bytes: int
) -> tuple[str | None, str | None]:
    """(`argv`'s standard output, `None`), or (`None`, why): "absent" (not found on `env`'s
    PATH, or not runnable), "failed" (a non-zero exit, or more than `max_bytes` of output)
    or "timeout" (not done within `timeout_s`: then killed)."""
    deadline = time.monotonic() + max(0.0, timeout_s)
    path = _find(argv[0], env)
    if path is None:
        return None, "absent"
    read_end, write_end = os.pipe()
    try:
        pid = _spawn(path, argv, env, write_end)
    except OSError:
        os.close(read_end)
        return None, "absent"
    finally:
        os.close(write_end)
    try:
        out, why = _read(read_end, deadline, max_bytes)
    finally:
        os.close(read_end)
    if why is not None:  # still running: past its deadline, or flooding its output
        _kill(pid)
        return None, why
    code = _wait(pid, deadline)
    if code is None:
        _kill(pid)
        return None, "timeout"
    return (out.decode(errors="replace"), None) if code == 0 else (None, "failed")


def _find(command: str, env: Mapping[str, str]) -> str | None:
    """Where `command` is on `env`'s PATH (as `subprocess` looks it up: the command's own
    environment decides)."""
    if os.sep in command:
        return command
    for folder in os.get_exec_path(env):
        candidate = os.path.join(folder, command)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def _spawn(path: str, argv: Sequence[str], env: Mapping[str, str], stdout: int) -> int:
    devnull = os.open(os.devnull, os.O_RDWR)
    try:
        actions = [
            (os.POSIX_SPAWN_DUP2, devnull, 0),
            (os.POSIX_SPAWN_DUP2, stdout, 1),
            (os.POSIX_SPAWN_DUP2, devnull, 2),
        ]
        # setsid: its own session and group, so that a kill at the deadline reaches what
        # it started too
        return os.posix_spawn(path, list(argv), dict(env), file_actions=actions, setsid=True)
    finally:
        os.close(devnull)


def _read(fd: int, deadline: float, max_bytes: int) -> tuple[bytes, str | None]:
    chunks: list[bytes] = []
    size = 0
    poller = select.poll()  # not select.select: a daemon's descriptors may pass 1023
    poller.register(fd, select.POLLIN)
    while True:
        left_s = deadline - time.monotonic()
        if left_s <= 0:
            return b"", "timeout"
        if not poller.poll(max(1, int(left_s * 1000))):
            continue
        chunk = os.read(fd, _CHUNK_BYTES)
        if not chunk:
            return b"".join(chunks), None
        size += len(chunk)
        if size > max_bytes:
            return b"", "failed"
        chunks.append(chunk)


def _wait(pid: int, deadline: float) -> int | None:
    """Its exit code once it ends (it closed its output: that is soon); `None` when it is
    still running at `deadline`."""
    pause_s = 0.001
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() >= deadline:
            return None
        time.sleep(pause_s)
        pause_s = min(pause_s * 2, 0.05)


def _kill(pid: int) -> None:
    """Kills `pid`'s session (its group: `setsid` made it the leader) and reaps it; a
    process stuck in the kernel past `_REAP_AFTER_KILL_S` is left, not waited for."""
    with contextlib.suppress(OSError):  # gone already
        os.killpg(pid, _SIGKILL)
    give_up = time.monotonic() + _REAP_AFTER_KILL_S
    while True:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # reaped already
            return
        if done or time.monotonic() >= give_up:
            return
        time.sleep(0.005)
