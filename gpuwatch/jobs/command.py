"""Runs one scheduler command with a deadline and a cap on its output: its output, or why
there is none, and nothing of it left running.

`subprocess.Popen`, its output and errors read through pipes until the command ends or
the deadline: `communicate()` would take any amount of output, and a squeue of a big
cluster is not to fill the daemon's memory. Output is kept in one buffer, never past
`max_bytes` (one chunk more is read to tell that the cap is passed): memory is the cap,
plus the text decoded from it. The command's answer is whole once it has exited: what it
wrote is in the pipe by then, which is read to its end without waiting, even where a
child of the command still holds the pipe open.

It starts with no signal blocked: the daemon blocks SIGTERM, SIGINT and SIGHUP in all its
threads (one waits for them), and a child inherits that mask through exec, so without
this a squeue would ignore the SIGTERM that stops the service.

Nothing it started outlives it. It runs in a session and process group of its own, which
is killed once it has ended (or at the deadline, past the cap, or when its `Commands` is
closed: the daemon stops), before it is reaped: until then its pid, and so the group's
id, cannot be another process's. A child that left the group (`setsid`, `setpgid`) is
out of the group's reach; where it still holds the command's output or error pipe (a
shell's `setsid cmd &` inherits them), it is found by that pipe: the processes whose
`/proc/PID/fd` names the pipe's inode are killed. That is sound: the pipe was made for
this command alone, so only the command and what it started can hold it (or what they
handed it to); this process keeps its own end open while it looks, so the inode is the
same pipe's throughout; and each holder is killed through a pidfd opened before its
descriptors are read, so a pid reused meanwhile is never the one killed. Processes are
looked through only where a pipe was not seen to close: a command that closes its output
and exits costs nothing more. A child that leaves the session and closes the pipes as
well is a daemon started on purpose, no longer the command's: it can neither delay nor
alter an answer.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence

import msgspec

from gpuwatch.text import printable

PROC = "/proc"
_CHUNK_BYTES = 1 << 16
_ERROR_BYTES = 4096
"""How much of a command's standard error is kept, for a message."""
_REAP_AFTER_KILL_S = 1.0
_POLL_S = (0.001, 0.05)
"""How often to look whether the command has exited, at first and at most: between
chunks of output it is asked after every chunk."""


class Answer(msgspec.Struct, frozen=True):
    """A command's answer: `out`, its standard output where it exited 0 within the
    limits; else `None` and `why`: "absent" (not found on the environment's PATH, or not
    runnable), "failed" (a non-zero exit), "too large" (more than its `max_bytes` of
    output), "timeout" (not done by its deadline: then killed) or "closed"."""

    out: str | None
    why: str | None = None
    error: str = ""
    """The first line of its standard error, printable and short, for a message."""


def _unblock_signals() -> None:
    """In the child, before exec: the mask of a process of its own (see the module notes).
    Only `pthread_sigmask` runs there, no lock is taken, so the warning about
    `preexec_fn` in threaded programs does not apply."""
    signal.pthread_sigmask(signal.SIG_SETMASK, ())


class Commands:
    """Runs commands, and kills those under way at `close()`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: set[subprocess.Popen[bytes]] = set()
        self._closed = False

    def run(
        self, argv: Sequence[str], env: Mapping[str, str], timeout_s: float, max_bytes: int
    ) -> Answer:
        """`argv`'s answer (see `Answer`), run with `env` as its whole environment."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        try:
            child = self._start(argv, env)
        except OSError:
            return Answer(None, "absent")
        if child is None:
            return Answer(None, "closed")
        reading = _Reading(child, max_bytes)
        try:
            why = reading.read(deadline)
        finally:
            reading.end()
            with self._lock:
                self._running.discard(child)
        if self._closed:
            why = "closed"
        elif why is None and child.returncode != 0:
            why = "failed"
        error = _first_line(reading.error.decode(errors="replace"))
        if why is not None:
            return Answer(None, why, error)
        return Answer(reading.out.decode(errors="replace"), None, error)

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
                stderr=subprocess.PIPE,
                env=dict(env),
                start_new_session=True,
                preexec_fn=_unblock_signals,  # noqa: PLW1509  # see _unblock_signals
            )
            self._running.add(child)
            return child


def run_command(
    argv: Sequence[str], env: Mapping[str, str], timeout_s: float, max_bytes: int
) -> Answer:
    """`Commands().run(...)`, for a caller that never closes early."""
    return Commands().run(argv, env, timeout_s, max_bytes)


def _first_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return printable(lines[0].strip()[:200]) if lines else ""


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


class _Reading:
    """One command's pipes read until it exits, and what it leaves ended."""

    def __init__(self, child: subprocess.Popen[bytes], max_bytes: int) -> None:
        assert child.stdout is not None and child.stderr is not None
        self.child = child
        self.max_bytes = max_bytes
        self.out = bytearray()
        self.error = bytearray()
        self.open = {child.stdout.fileno(): self.out, child.stderr.fileno(): self.error}
        for fd in self.open:
            os.set_blocking(fd, False)

    def read(self, deadline: float) -> str | None:
        """Until the command exits (then what is left in the pipes), the deadline or the
        cap: `None`, "timeout" or "too large"."""
        with selectors.DefaultSelector() as selector:
            for fd in self.open:
                selector.register(fd, selectors.EVENT_READ)
            wait_s = _POLL_S[0]
            while not self._exited():
                left_s = deadline - time.monotonic()
                if left_s <= 0:
                    return "timeout"
                ready = selector.select(min(left_s, wait_s))
                wait_s = _POLL_S[0] if ready else min(2 * wait_s, _POLL_S[1])
                for key, _ in ready:
                    self._take(key.fd)
                    if key.fd not in self.open:  # closed
                        selector.unregister(key.fd)
                if len(self.out) > self.max_bytes:
                    return "too large"
        while any(self._take(fd) for fd in list(self.open)):  # what it left in the pipes
            if len(self.out) > self.max_bytes:
                return "too large"
            if time.monotonic() > deadline:  # a child of it still writing
                return "timeout"
        return "too large" if len(self.out) > self.max_bytes else None

    def end(self) -> None:
        """Kills what is left of the command (the group while the command is not yet
        reaped; then the holders of a pipe not seen closed), and reaps it; one stuck in
        the kernel past `_REAP_AFTER_KILL_S` is left, not waited for."""
        _signal_group(self.child)
        for fd in self.open:
            _kill_holders(os.fstat(fd).st_ino)
        for pipe in (self.child.stdout, self.child.stderr):
            if pipe is not None:
                pipe.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.child.wait(_REAP_AFTER_KILL_S)

    def _take(self, fd: int) -> bool:
        """Reads what `fd` holds now into its buffer (standard error: its start only);
        False once it has nothing now, or is closed (then it is forgotten)."""
        try:
            chunk = os.read(fd, _CHUNK_BYTES)
        except BlockingIOError:
            return False
        if not chunk:
            del self.open[fd]
            return False
        buffer = self.open[fd]
        if buffer is self.out or len(buffer) < _ERROR_BYTES:
            buffer += chunk
        return True

    def _exited(self) -> bool:
        """Whether the command has exited, leaving it unreaped (`WNOWAIT`)."""
        try:
            done = os.waitid(os.P_PID, self.child.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return True
        return done is not None


def _signal_group(child: subprocess.Popen[bytes]) -> None:
    """Kills the command's process group, unless the command has been reaped (its pid,
    and so the group's id, may be another's then)."""
    if child.returncode is None:
        with contextlib.suppress(OSError):  # gone already
            os.killpg(child.pid, signal.SIGKILL)


def _kill_holders(inode: int, proc: str = PROC) -> None:
    """Kills every other process holding the pipe `inode` (see the module notes)."""
    for pid in _holders(inode, proc):
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:  # gone; or a kernel before 5.3, where the pid is signalled
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            continue
        try:
            if pid in _holders(inode, proc, (pid,)):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        except OSError:
            pass  # gone meanwhile
        finally:
            os.close(pidfd)


def _holders(inode: int, proc: str, pids: Sequence[int] = ()) -> Iterator[int]:
    """The processes (of `pids`, by default all but this one) whose open files include the
    pipe `inode`; those whose files this user may not see are passed over."""
    name = f"pipe:[{inode}]"
    own = os.getpid()
    candidates = pids or [int(e.name) for e in os.scandir(proc) if e.name.isdigit()]
    for pid in candidates:
        if pid == own:
            continue
        try:
            links = (os.readlink(f"{proc}/{pid}/fd/{fd}") for fd in os.listdir(f"{proc}/{pid}/fd"))
            if any(link == name for link in links):
                yield pid
        except OSError:  # gone, or another user's
            continue
