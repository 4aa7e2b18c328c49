"""What gpuwatch reads from Linux's `/proc` itself: what psutil has no reader for, and the
one read the daemon repeats every second, which psutil makes five times dearer.

psutil reads every other process detail (`gpuwatch.hostinfo`). Left here:
- `read_flock_holders`: the kernel's lock table, `/proc/locks` (psutil has no reader of it);
- `read_cgroup_paths`: a process's cgroups, `/proc/PID/cgroup` (psutil has none);
- `in_initial_pid_namespace`: whether this process sees the host's pids (psutil cannot say);
- `read_uids` and `read_parent`: a process's uids and parent, the two facts `status` and
  `pick` need of other processes when the daemon has read the GPUs (a lease's holder, a
  job's own workers). psutil would tell them, but importing it costs 50 M instructions
  (callgrind, `python -c "import click, json, socket, psutil"` against the same without):
  22 % of what `gpuwatch status` costs through the daemon beyond click, half of the 100 M
  its start-up is allowed. Every other process detail is psutil's;
- `read_usage`: the CPU time, resident memory and start of a process, from one `pread` of
  its `/proc/PID/stat`, kept open (`open_stat`). The daemon asks it of every GPU process
  every second. Over 100 live processes (`python bench/process_details_cost.py`, a loaded
  2-core machine, four runs): 8 to 12 µs a process here, against 70 to 115 µs for psutil's
  `cpu_times()` and `memory_info()` under `oneshot()`, and 105 to 175 µs with psutil's
  check that the pid still names the same process; at 1 Hz, 0.7 to 1.8 % of a core through
  psutil, where the daemon's whole figure is 0.25 to 0.5 %. Opening the file for each read
  instead costs 4 to 14 µs more a process: the daemon at 1 Hz on 8 GPUs and 100 live
  processes took 0.63 % of a core so, beside 0.52 % for the daemon that kept its files
  open (each pair over the same 60 s), a fifth of its figure; keeping them open, 0.53 %.

Everything here is input another local user controls in part (a process names itself):
nothing read is trusted beyond its type. Each function takes `proc`, the mount point, so
that a test can hand a directory of its own.
"""

from __future__ import annotations

import os
from typing import NamedTuple

PROC = "/proc"
INITIAL_PID_NAMESPACE = "pid:[4026531836]"  # the kernel's PROC_PID_INIT_INO, fixed since 3.8
CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")

# Positions in /proc/PID/stat counted from the field after the ")" that closes the
# command name (proc(5) numbers them from 1 at the pid: subtract 3).
_STAT_PPID, _STAT_UTIME, _STAT_STIME, _STAT_STARTTIME, _STAT_RSS_PAGES = 1, 11, 12, 19, 21
_STAT_BYTES = 1 << 12
_STATUS_BYTES = 1 << 14
_CGROUP_BYTES = 16 << 10
LOCKS_BYTES = 8 << 20  # a user can take many locks; never read without bound

FileKey = tuple[int, int, int]
"""(major, minor, inode): a file as `/proc/locks` names it."""


class Usage(NamedTuple):
    """What `/proc/PID/stat` says of a process now."""

    start_ticks: int
    """When it started, in clock ticks since boot: with the pid, it names one process."""
    cpu_s: float
    """CPU time used so far, user and system."""
    rss_bytes: int


def open_stat(pid: int, proc: str = PROC) -> int:
    """/proc/PID/stat, opened: `read_usage` of it describes the process afresh each time,
    and fails (`ProcessLookupError`) once that process has exited, whoever has its pid since.
    `OSError` when it is gone or hidden already."""
    return os.open(f"{proc}/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)


def read_usage(stat_fd: int) -> Usage:
    """The start, CPU time and RSS of the process whose stat is open at `stat_fd`; `OSError`
    once it has exited, `ValueError` (or `IndexError`) for a stat that is not what proc(5)
    describes."""
    stat = os.pread(stat_fd, _STAT_BYTES, 0).decode(errors="replace")
    # The command name may hold spaces and parentheses of its own: the last ")" closes it.
    fields = stat[stat.rfind(")") + 2 :].split()
    return Usage(
        int(fields[_STAT_STARTTIME]),
        (int(fields[_STAT_UTIME]) + int(fields[_STAT_STIME])) / CLOCK_TICKS_PER_S,
        int(fields[_STAT_RSS_PAGES]) * PAGE_BYTES,
    )


def read_usage_of(pid: int, proc: str = PROC) -> Usage:
    """`read_usage` of `pid`'s stat, opened for this one read."""
    stat_fd = open_stat(pid, proc)
    try:
        return read_usage(stat_fd)
    finally:
        os.close(stat_fd)


def read_uids(pid: int, proc: str = PROC) -> tuple[int, int, int] | None:
    """The real, effective and saved uids of `pid` (the `Uid:` line of /proc/PID/status);
    `None` when no such process is visible here, or the line is not what proc(5) says."""
    try:
        with open(f"{proc}/{pid}/status", "rb") as status:
            text = status.read(_STATUS_BYTES).decode("ascii", "replace")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("Uid:"):
            uids = line.split()[1:4]
            if len(uids) == 3 and all(uid.isdigit() for uid in uids):
                return int(uids[0]), int(uids[1]), int(uids[2])
    return None


def read_parent(pid: int, proc: str = PROC) -> int | None:
    """The pid of `pid`'s parent (0 for one outside this pid namespace); `None` when no such
    process is visible here."""
    try:
        stat_fd = open_stat(pid, proc)
    except OSError:
        return None
    try:
        stat = os.pread(stat_fd, _STAT_BYTES, 0).decode(errors="replace")
    except OSError:
        return None
    finally:
        os.close(stat_fd)
    fields = stat[stat.rfind(")") + 2 :].split()
    parent = fields[_STAT_PPID] if len(fields) > _STAT_PPID else ""
    return int(parent) if parent.isdigit() else None


def in_initial_pid_namespace(proc: str = PROC) -> bool:
    """Whether this process sees the host's pids (true too when the kernel will not say)."""
    try:
        return os.readlink(f"{proc}/self/ns/pid") == INITIAL_PID_NAMESPACE
    except OSError:
        return True


def read_cgroup_paths(pid: int, proc: str = PROC) -> list[str]:
    """The cgroups `pid` belongs to (one path per hierarchy; a single one under cgroup v2);
    `OSError` when it is gone or hidden."""
    fd = os.open(f"{proc}/{pid}/cgroup", os.O_RDONLY | os.O_CLOEXEC)
    try:
        cgroup = os.read(fd, _CGROUP_BYTES).decode(errors="replace")
    finally:
        os.close(fd)
    # `ID:CONTROLLERS:PATH` lines, v1 and v2; lines without two colons are passed over.
    return [fields[2] for line in cgroup.splitlines() if len(fields := line.split(":", 2)) == 3]


def read_flock_holders(proc: str = PROC) -> dict[FileKey, list[int]]:
    """The holders of each `flock` in /proc/locks; empty when it cannot be read."""
    try:
        with open(f"{proc}/locks", "rb") as table:
            text = table.read(LOCKS_BYTES).decode("ascii", "replace")
    except OSError:
        return {}
    return parse_locks(text)


def parse_locks(table: str) -> dict[FileKey, list[int]]:
    """Pids holding a `flock` on each file of /proc/locks; other lines are passed over."""
    holders: dict[FileKey, list[int]] = {}
    for line in table.splitlines():
        # "1: FLOCK  ADVISORY  WRITE 4242 fe:00:2171846 0 EOF"; waiters show "->" after the id.
        fields = line.split()
        if len(fields) < 6 or fields[1] != "FLOCK":
            continue
        try:
            pid = int(fields[4])
            major, minor, inode = fields[5].split(":")
            key = (int(major, 16), int(minor, 16), int(inode))
        except ValueError:
            continue
        holders.setdefault(key, []).append(pid)
    return holders
