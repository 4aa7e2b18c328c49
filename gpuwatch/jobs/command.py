"""Runs one scheduler command with a deadline and a cap on its output: its output, or why
there is none.

`subprocess.Popen`, read through a pipe until the deadline: `communicate()` would take any
amount of output, and a squeue of a big cluster is not to fill the daemon's memory. The
command runs in a session of its own, so that at its deadline, or when its `Commands` is
closed (the daemon stops), it is killed with everything it started, and it is always
reaped. It starts with no signal blocked: the daemon blocks SIGTERM, SIGINT and SIGHUP in
all its threads (one waits for them), and a child inherits that mask through exec, so
without this a squeue would ignore the SIGTERM that stops the service.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence

_CHUNK_BYTES = 1 << 16
_REAP_AFTER_KILL_S = 1.0


def _unblock_signals() -> None:
    """In the child, before exec: the mask of a process of its own (see the module notes).
    Only `pthread_sigmask` runs there, no lock is taken, so the warning about
    `preexec_fn` in threaded programs does not apply."""
    signal.pthread_sigmask(signal.SIG_SETMASK, ())


class Commands:
    """Runs commands one at a time per caller, and kills those under way at `close()`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: set[subprocess.Popen[bytes]] = set()
        self._closed = False

    def run(
        self, argv: Sequence[str], env: Mapping[str, str], timeout_s: float, max_bytes: int
    ) -> tuple[str | None, str | None]:
        """(`argv`'s standard output, `None`), or (`None`, why): "absent" (not found on
        `env`'s PATH, or not runnable), "failed" (a non-zero exit, or more than `max_bytes`
        of output), "timeout" (not done within `timeout_s`: then killed) or "closed"."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        try:
            child = self._start(argv, env)
        except OSError:
            return None, "absent"
        if child is None:
            return None, "closed"
        try:
            out, why = _read(child, deadline, max_bytes)
            if why is None and _wait(child, deadline) is None:
                why = "timeout"
        finally:
            _kill(child)
            with self._lock:
                self._running.discard(child)
        if why is None and child.returncode == 0:
            return out.decode(errors="replace"), None
        return None, "closed" if self._closed else (why or "failed")

    def close(self) -> None:
        """Kills the commands under way (each is reaped by its caller) and starts no more."""
        with self._lock:
            self._closed = True
            running = list(self._running)
        for child in running:
            _signal_group(child)

    def _start(self, argv: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen[bytes] | None:
        path = _find(argv[0], env)
        if path is None:
            raise FileNotFoundError(argv[0])
        with self._lock:
            if self._closed:
                return None
            child = subprocess.Popen(
                [path, *argv[1:]],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env=dict(env),
                start_new_session=True,
                preexec_fn=_unblock_signals,  # noqa: PLW1509  # see _unblock_signals
            )
            self._running.add(child)
            return child


def run_command(
    argv: Sequence[str], env: Mapping[str, str], timeout_s: float, max_bytes: int
) -> tuple[str | None, str | None]:
    """`Commands().run(...)`, for a caller that never closes early."""
    return Commands().run(argv, env, timeout_s, max_bytes)


def _find(command: str, env: Mapping[str, str]) -> str | None:
    """Where `command` is on `env`'s PATH (the command's own environment decides, not
    this process's)."""
    if os.sep in command:
        return command
    for folder in os.get_exec_path(env):
        candidate = os.path.join(folder, command)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def _read(
    child: subprocess.Popen[bytes], deadline: float, max_bytes: int
) -> tuple[bytes, str | None]:
    assert child.stdout is not None
    chunks: list[bytes] = []
    size = 0
    with selectors.DefaultSelector() as selector:
        selector.register(child.stdout, selectors.EVENT_READ)
        while True:
            left_s = deadline - time.monotonic()
            if left_s <= 0:
                return b"", "timeout"
            if not selector.select(left_s):
                continue
            chunk = os.read(child.stdout.fileno(), _CHUNK_BYTES)
            if not chunk:
                return b"".join(chunks), None
            size += len(chunk)
            if size > max_bytes:
                return b"", "failed"
            chunks.append(chunk)


def _wait(child: subprocess.Popen[bytes], deadline: float) -> int | None:
    """Its exit code once it ends (it closed its output: that is soon); `None` when it is
    still running at `deadline`."""
    try:
        return child.wait(max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return None


def _signal_group(child: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(OSError):  # gone already
        os.killpg(child.pid, signal.SIGKILL)


def _kill(child: subprocess.Popen[bytes]) -> None:
    """Kills a command still running, with what it started, and reaps it; one stuck in the
    kernel past `_REAP_AFTER_KILL_S` is left, not waited for. (Once reaped, its id may be
    another's: it is never signalled then.)"""
    if child.returncode is None:
        _signal_group(child)
    if child.stdout is not None:
        child.stdout.close()
    with contextlib.suppress(subprocess.TimeoutExpired):
        child.wait(_REAP_AFTER_KILL_S)
