"""What the host knows of a process the GPU driver reports: user, command, CPU, RSS, start.

The driver gives only pids, as the host's initial PID namespace numbers them.
A pid may have exited since, or be hidden from this user (`hidepid`): it then
gets no details, never an error. When gpuwatch itself runs in another PID
namespace (a container without `--pid=host`), the same numbers name other,
unrelated processes here (the driver's pid 1 is the host's init, not the
container's), so no pid gets details at all.

A process is learnt through psutil once, the first time it is seen: its user and its
command line, which are kept for its lifetime. Its CPU time and RSS are read again at
each look with one `pread` of its /proc/PID/stat, kept open (`gpuwatch.procfs.read_usage`
says why), and the start time read there tells whether the pid still names the same
process. At most `MAX_OPEN_STAT_FILES` are kept open, so that a node of thousands of GPU
processes never runs the daemon out of descriptors (each client connection needs one): a
process beyond them costs an open, a read and a close of its stat instead. A command line
is free text another user wrote: it is made printable here, where it enters.
"""

from __future__ import annotations

import os
import shlex
import time
from collections.abc import Iterable

import msgspec
import psutil

from gpuwatch import procfs
from gpuwatch.text import printable

MAX_OPEN_STAT_FILES = 512
"""At most this many /proc/PID/stat files are kept open (a quarter of the unit's
LimitNOFILE=4096 in all, and a small part of it)."""


class HostProcess(msgspec.Struct, frozen=True):
    """Host-side details of one process; `None` where the host would not tell."""

    user: str | None
    command: str | None
    cpu_pct: float | None
    rss_bytes: int | None
    started_at: float | None


class _Known(msgspec.Struct):
    """A process seen before: what does not change, and where its CPU clock stood."""

    start_ticks: int
    user: str
    command: str
    stat_fd: int | None
    """Its /proc/PID/stat, open; `None` past `MAX_OPEN_STAT_FILES`, when it is opened for
    each look."""
    cpu_s: float = 0.0
    wall_s: float = 0.0


class HostProcessTable:
    """Looks up pids, remembering each process so CPU use can be measured between looks.

    CPU use is never measured by sleeping: the first look at a process gives its
    lifetime average (as `ps` does), later looks the average since the last one
    (as `top` does).
    """

    def __init__(self, *, max_open_files: int = MAX_OPEN_STAT_FILES) -> None:
        self._max_open_files = max_open_files
        self._known: dict[int, _Known] = {}
        self._open_files = 0
        self._boot_time_s: float | None = None
        self.pids_are_local = procfs.in_initial_pid_namespace()
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
        usage = self._again(pid, known) if known is not None else None
        if known is None or usage is None:
            try:
                known, usage = self._learn(pid)
            except (OSError, ValueError, IndexError, psutil.Error):  # exited, or hidden from us
                return None
        started_at = boot_time_s + usage.start_ticks / procfs.CLOCK_TICKS_PER_S
        if known.wall_s == 0.0:  # first look: the average over the process's life, as ps
            cpu_pct = _percent(usage.cpu_s, now - started_at)
        else:  # since the last look, as top
            cpu_pct = _percent(usage.cpu_s - known.cpu_s, now - known.wall_s)
        known.cpu_s, known.wall_s = usage.cpu_s, now
        return HostProcess(known.user, known.command, cpu_pct, usage.rss_bytes, started_at)

    def _again(self, pid: int, known: _Known) -> procfs.Usage | None:
        """`pid`'s usage now; `None` (and it is forgotten) when it has exited, or when the
        pid now names another process."""
        try:  # a process that exited fails the read of its open stat
            usage = _usage(pid, known.stat_fd)
        except (OSError, ValueError, IndexError):
            usage = None
        if usage is None or usage.start_ticks != known.start_ticks:
            self._forget(pid)
            return None
        return usage

    def _learn(self, pid: int) -> tuple[_Known, procfs.Usage]:
        stat_fd = procfs.open_stat(pid)
        try:
            usage = procfs.read_usage(stat_fd)
            user, command = _identity(pid)
        except BaseException:
            os.close(stat_fd)
            raise
        known = _Known(usage.start_ticks, user, command, stat_fd)
        if self._open_files >= self._max_open_files:
            os.close(stat_fd)
            known.stat_fd = None
        else:
            self._open_files += 1
        self._known[pid] = known
        return known, usage

    def _forget(self, pid: int) -> None:
        known = self._known.pop(pid)
        if known.stat_fd is not None:
            os.close(known.stat_fd)
            self._open_files -= 1

    def _boot_time(self) -> float:
        if self._boot_time_s is None:
            self._boot_time_s = psutil.boot_time()
        return self._boot_time_s


def _usage(pid: int, stat_fd: int | None) -> procfs.Usage:
    return procfs.read_usage(stat_fd) if stat_fd is not None else procfs.read_usage_of(pid)


def _identity(pid: int) -> tuple[str, str]:
    """What stays true of `pid` for its life, made printable: its user, and its command line
    (or, where that is empty or not readable, its name, as for a kernel thread)."""
    process = psutil.Process(pid)
    with process.oneshot():
        user = process.username()
        try:
            command = shell_command(process.cmdline())
        except (psutil.AccessDenied, psutil.ZombieProcess):  # another user's; exited
            command = ""
        return printable(user), printable(command or process.name())


class Link(msgspec.Struct, frozen=True):
    """One process as its family tree needs it: parent, effective user's uid and name."""

    pid: int
    ppid: int
    uid: int
    name: str
    """The kernel's name of the process (at most 15 characters), made printable."""


def read_lineage(pids: Iterable[int], limit: int = 4096) -> list[Link]:
    """Each of `pids` and its ancestors below init; one not visible ends its chain there
    (gone, hidden, or in another PID namespace). At most `limit` processes in all."""
    found: dict[int, Link] = {}
    for start in pids:
        pid = start
        while pid > 1 and pid not in found and len(found) < limit:
            try:
                process = psutil.Process(pid)
                with process.oneshot():
                    ppid, uid, name = process.ppid(), process.uids().effective, process.name()
            except psutil.Error:
                break
            found[pid] = Link(pid, ppid, uid, printable(name))
            pid = ppid
    return list(found.values())


def shell_command(argv: list[str]) -> str:
    """A command line as a shell would take it back: `python3 -c 'import time; ...'`.

    `argv` is a process's command line (psutil's `cmdline()`). A process that rewrote
    its command line into one string (`postgres: checkpointer`, padded with NULs) is
    shown as it wrote it, as `ps` and nvitop show it.
    """
    while argv and not argv[-1]:
        argv = argv[:-1]
    if len(argv) == 1:
        return argv[0]
    return shlex.join(argv)


def _percent(cpu_s: float, wall_s: float) -> float | None:
    return round(100.0 * cpu_s / wall_s, 1) if wall_s > 0 else None
