"""What the host knows of a process the GPU driver reports: user, command, CPU, RSS.

The driver gives only pids, as the host's initial PID namespace numbers them.
A pid may have exited since, or be hidden from this user (`hidepid`): it then
gets no details, never an error. When gpuwatch itself runs in another PID
namespace (a container without `--pid=host`), the same numbers name other,
unrelated processes here (the driver's pid 1 is the host's init, not the
container's), so no pid gets details at all.

Read from Linux's /proc (through `gpuwatch.procfs`), and cheaply, since the daemon does it for
every GPU process every second: a process seen before costs one `pread` of
its /proc/PID/stat, kept open (its user and command are remembered for its
lifetime); a new one costs three reads. At most `MAX_OPEN_STAT_FILES` are
kept open, so that a node of thousands of GPU processes never runs the
daemon out of descriptors (each client connection needs one): a process
beyond them costs an open, a read and a close of its stat instead.
"""

from __future__ import annotations

import os
import pwd
import time

from gpuwatch import procfs
from gpuwatch.procfs import STAT_RSS_PAGES as _RSS_PAGES
from gpuwatch.procfs import STAT_STARTTIME as _STARTTIME
from gpuwatch.procfs import STAT_STIME as _STIME
from gpuwatch.procfs import STAT_UTIME as _UTIME

_CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
MAX_OPEN_STAT_FILES = 512
"""At most this many /proc/PID/stat files are kept open (a quarter of the unit's
LimitNOFILE=4096 in all, and a small part of it)."""
# Characters a POSIX shell takes literally, as in shlex.quote (which would import re).
_SHELL_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789@%+=:,./-_")


class HostProcess:
    """Host-side details of one process; `None` where the host would not tell.

    A plain slotted class rather than a frozen dataclass: the daemon makes one per GPU
    process per second, and a frozen dataclass costs several times more to make.
    """

    __slots__ = ("command", "cpu_pct", "rss_bytes", "started_at", "user")

    def __init__(
        self,
        user: str | None,
        command: str | None,
        cpu_pct: float | None,
        rss_bytes: int | None,
        started_at: float | None,
    ) -> None:
        self.user = user
        self.command = command
        self.cpu_pct = cpu_pct
        self.rss_bytes = rss_bytes
        self.started_at = started_at


class _Known:
    """A process seen before: what does not change, and where its CPU clock stood."""

    __slots__ = ("command", "cpu_s", "start_ticks", "stat_fd", "user", "wall_s")

    def __init__(self, start_ticks: int, user: str, command: str, stat_fd: int | None) -> None:
        self.start_ticks = start_ticks
        self.user = user
        self.command = command
        self.stat_fd = stat_fd
        """/proc/PID/stat, open: re-read from offset 0 it describes the process afresh;
        `None` past `MAX_OPEN_STAT_FILES`, when it is opened for each look."""
        self.cpu_s = 0.0
        self.wall_s = 0.0

    def forget(self) -> None:
        if self.stat_fd is not None:
            os.close(self.stat_fd)


class HostProcessTable:
    """Looks up pids, remembering each process so CPU use can be measured between looks.

    CPU use is never measured by sleeping: the first look at a process gives its
    lifetime average (as `ps` does), later looks the average since the last one
    (as `top` does).
    """

    def __init__(self, proc: str = "/proc", *, max_open_files: int = MAX_OPEN_STAT_FILES) -> None:
        self._proc = proc
        self._max_open_files = max_open_files
        self._known: dict[int, _Known] = {}
        self._open_files = 0
        self._users: dict[int, str] = {}
        self._boot_time_s: float | None = None
        self.pids_are_local = procfs.in_initial_pid_namespace(proc)
        """Whether the driver's pids name this namespace's processes; if not, none is looked up."""

    def lookup(self, pids: set[int]) -> dict[int, HostProcess]:
        """Details for each visible pid in `pids`; forgets processes not asked for."""
        for gone in self._known.keys() - pids:
            self._forget(gone)
        if not self.pids_are_local:
            return {}
        now = time.time()
        boot_time_s = self._boot_time()
        found = {}
        for pid in pids:
            details = self._lookup_one(pid, now, boot_time_s)
            if details is not None:
                found[pid] = details
        return found

    def close(self) -> None:
        for pid in list(self._known):
            self._forget(pid)

    def _lookup_one(self, pid: int, now: float, boot_time_s: float) -> HostProcess | None:
        known = self._known.get(pid)
        fields: list[str] = []
        if known is not None:
            try:  # a process that exited fails the read of its open stat
                stat = self._stat_of(pid, known.stat_fd)
                fields = procfs.stat_fields(stat)
            except OSError:
                pass
            if not fields or int(fields[_STARTTIME]) != known.start_ticks:
                self._forget(pid)  # gone, or the pid now names another process
                known = None
        if known is None:
            try:
                known, stat = self._learn(pid)
            except OSError:  # exited, another namespace, or hidden from us
                return None
            fields = procfs.stat_fields(stat)
        cpu_s = (int(fields[_UTIME]) + int(fields[_STIME])) / _CLOCK_TICKS_PER_S
        started_at = boot_time_s + known.start_ticks / _CLOCK_TICKS_PER_S
        if known.wall_s == 0.0:  # first look: the average over the process's life, as ps
            cpu_pct = _percent(cpu_s, now - started_at)
        else:  # since the last look, as top
            cpu_pct = _percent(cpu_s - known.cpu_s, now - known.wall_s)
        known.cpu_s, known.wall_s = cpu_s, now
        return HostProcess(
            known.user, known.command, cpu_pct, int(fields[_RSS_PAGES]) * _PAGE_BYTES, started_at
        )

    def _learn(self, pid: int) -> tuple[_Known, str]:
        stat_fd = procfs.open_stat(pid, self._proc)
        try:
            stat = procfs.pread_stat(stat_fd)
            argv = procfs.read_cmdline(pid, self._proc)
            uid = os.fstat(stat_fd).st_uid
        except OSError:
            os.close(stat_fd)
            raise
        start_ticks = int(procfs.stat_fields(stat)[_STARTTIME])
        name = procfs.stat_name(stat)
        command = shell_command(argv) or name
        if self._open_files >= self._max_open_files:
            os.close(stat_fd)
            known = _Known(start_ticks, self._user(uid), command, None)
        else:
            known = _Known(start_ticks, self._user(uid), command, stat_fd)
            self._open_files += 1
        self._known[pid] = known
        return known, stat

    def _forget(self, pid: int) -> None:
        known = self._known.pop(pid)
        if known.stat_fd is not None:
            self._open_files -= 1
        known.forget()

    def _stat_of(self, pid: int, stat_fd: int | None) -> str:
        if stat_fd is not None:
            return procfs.pread_stat(stat_fd)
        return procfs.read_stat(pid, self._proc)

    def _user(self, uid: int) -> str:
        if (name := self._users.get(uid)) is None:
            try:
                name = pwd.getpwuid(uid).pw_name
            except KeyError:  # a uid with no passwd entry here, as in many containers
                name = str(uid)
            self._users[uid] = name
        return name

    def _boot_time(self) -> float:
        if self._boot_time_s is None:
            self._boot_time_s = procfs.read_boot_time(self._proc)
        return self._boot_time_s


def shell_command(argv: list[str]) -> str:
    """A command line as a shell would take it back: `python3 -c 'import time; ...'`.

    `argv` is /proc/PID/cmdline split at its NULs. A process that rewrote its
    command line into one string (`postgres: checkpointer`, padded with NULs)
    is shown as it wrote it, as `ps` and nvitop show it.
    """
    while argv and not argv[-1]:
        argv = argv[:-1]
    if len(argv) == 1:
        return argv[0]
    return shell_join(argv)


def shell_join(argv: list[str]) -> str:
    """`argv` as a shell would take it back (as `shlex.join`): lease commands are shown
    quoted the same way as the command lines read from /proc."""
    return " ".join(_shell_quote(arg) for arg in argv)


def _shell_quote(arg: str) -> str:
    if arg and all(c in _SHELL_SAFE for c in arg):
        return arg
    return "'" + arg.replace("'", "'\"'\"'") + "'"


def _percent(cpu_s: float, wall_s: float) -> float | None:
    return round(100.0 * cpu_s / wall_s, 1) if wall_s > 0 else None
